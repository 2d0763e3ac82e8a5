"""One rule for the arrays every command reads (`diffusion.data.numpy_files`): a .npy and an .npz's arr_0 are the
same array; images (N, H, W, C) or (N, C, H, W), uint8 or integers in 0..255, are taken; float images (0..1?
-1..1? 0..255?), a layout both readings fit and other shapes are refused in one line. Each reading command
(evaluate --samples / --reference, evaluate --nll --data.path, train's vector --data.path) goes through it."""

import pickle
import re

import numpy as np
import pytest
from helpers.user_errors import run_in_process, train_args

from diffusion.cli import evaluate
from diffusion.cli.train import main as train
from diffusion.data.numpy_files import read_images
from diffusion.data.vectors import VectorDataModule

IMAGES = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 1), dtype=np.uint8)
ACCEPTED = {
    "npz_nhwc": ("npz", IMAGES),
    "npy_nhwc": ("npy", IMAGES),
    "npz_nchw": ("npz", IMAGES.transpose(0, 3, 1, 2)),
    "npy_nchw_int64": ("npy", IMAGES.transpose(0, 3, 1, 2).astype(np.int64)),
}
REFUSED = {
    "float_0_1": ("npz", IMAGES / 255.0, r"float images could be in 0\.\.1, -1\.\.1 or 0\.\.255 — convert"),
    "float_npy": ("npy", IMAGES / 127.5 - 1, r"float images could be .* — convert them to uint8"),
    "both_layouts": ("npz", np.zeros((4, 3, 8, 3), np.uint8), r"\(N, H, W, C\) and \(N, C, H, W\) both fit"),
    "beyond_255": ("npz", IMAGES.astype(np.int64) * 2, r"values beyond 0\.\.255"),
    "vectors": ("npz", np.zeros((4, 2), np.uint8), r"not images \(N, H, W, C\)"),
    "empty": ("npz", IMAGES[:0], r"holds an empty array \(shape \(0, 16, 16, 1\)\) — save uint8 images"),
    "objects_npz": (
        "npz",
        np.array([IMAGES, None], dtype=object),
        r"holds Python objects \(dtype object\), not numbers",
    ),
}


def write(tmp_path, kind: str, array: np.ndarray):
    path = tmp_path / f"images.{kind}"
    np.save(path, array) if kind == "npy" else np.savez(path, array)
    return path


@pytest.mark.parametrize("case", ACCEPTED)
def test_each_format_with_one_meaning_reads_as_the_same_images(case, tmp_path):
    images, _ = read_images(write(tmp_path, *ACCEPTED[case]), "--samples")
    assert images.dtype == np.uint8
    np.testing.assert_array_equal(images, IMAGES)


@pytest.mark.parametrize("case", REFUSED)
@pytest.mark.parametrize("flag", ["--samples", "--reference"])
def test_evaluate_refuses_the_rest_in_one_line(case, flag, tmp_path, capsys):
    kind, array, pattern = REFUSED[case]
    (tmp_path / "user").mkdir()
    path = write(tmp_path / "user", kind, array)
    other = ["--reference", str(path)] if flag == "--samples" else ["--save_stats", str(tmp_path / "s.npz")]
    line = run_in_process(
        evaluate.main, [flag, str(path), *other, "--features", "pixels"], tmp_path / "user", capsys
    )
    assert line.startswith(f"error: {flag} ") and re.search(pattern, line), line


@pytest.mark.parametrize("case", ["npy_nchw_int64", "npz_nchw"])
def test_evaluate_takes_every_accepted_format(case, tmp_path, capsys):
    path = write(tmp_path, *ACCEPTED[case])
    result = evaluate.main(
        ["--reference", str(path), "--save_stats", str(tmp_path / "s.npz"), "--features", "pixels"]
    )
    assert result == {"num_real": 4}


@pytest.mark.parametrize("case", ["float_0_1", "both_layouts", "empty", "objects_npz"])
def test_bits_per_dim_refuses_the_rest_in_one_line(case, tmp_path, digits_checkpoint, capsys):
    kind, array, pattern = REFUSED[case]
    (tmp_path / "user").mkdir()
    path = write(tmp_path / "user", kind, array)
    args = ["--nll", "--ckpt", str(digits_checkpoint), "--data.path", str(path)]
    line = run_in_process(evaluate.main, args, tmp_path / "user", capsys)
    assert line.startswith("error: --data.path ") and re.search(pattern, line), line


def test_vectors_read_an_npz_as_its_npy(tmp_path):
    points = np.random.default_rng(0).normal(size=(50, 3))
    np.save(tmp_path / "points.npy", points)
    np.savez(tmp_path / "points.npz", points)
    from_npy = VectorDataModule(path=str(tmp_path / "points.npy")).data
    from_npz = VectorDataModule(path=str(tmp_path / "points.npz")).data
    assert from_npy.shape == (50, 3) and np.array_equal(from_npy.numpy(), from_npz.numpy())


def test_a_pickle_is_called_one_wherever_an_array_is_read(tmp_path, capsys):
    (tmp_path / "user").mkdir()
    path = tmp_path / "user" / "images.pkl"
    path.write_bytes(pickle.dumps(IMAGES))  # an ndarray, pickled: np.load would unpickle it
    args = ["--samples", str(path), "--reference", str(path), "--features", "pixels"]
    line = run_in_process(evaluate.main, args, tmp_path / "user", capsys)
    assert line.startswith(
        f"error: --samples {path} holds pickled Python objects (pickle.dump, or torch.save's"
    )
    assert "not a NumPy array (np.save, np.savez) — save uint8 images" in line


VECTORS_REFUSED = {
    "empty": (np.zeros((0, 2)), r"^path .*empty.npy holds an empty array \(shape \(0, 2\)\)"),
    "no_features": (np.zeros((5, 0)), r"holds an empty array \(shape \(5, 0\)\)"),
    "one_point": (
        np.tile([[1.0, 2.0]], (50, 1)),
        r"its 50 rows are all the same point \(zero variance in every",
    ),
    "constant": (np.full((50, 2), 3.0), r"rows are all the same point .* — pass samples that differ"),
}


@pytest.mark.parametrize("case", VECTORS_REFUSED)
def test_vector_data_with_nothing_to_learn_is_refused_in_one_line(case, tmp_path):
    array, pattern = VECTORS_REFUSED[case]
    np.save(tmp_path / "empty.npy", array)
    with pytest.raises(ValueError, match=pattern):
        VectorDataModule(path=str(tmp_path / "empty.npy"))


def test_a_constant_feature_beside_others_that_vary_is_data(tmp_path):
    points = np.random.default_rng(0).normal(size=(50, 3))
    points[:, 1] = 7.0  # a fixed coordinate
    np.save(tmp_path / "points.npy", points)
    data = VectorDataModule(path=str(tmp_path / "points.npy")).data
    assert (data[:, 1] == 0).all() and data[:, 0].std() > 1


def test_train_refuses_data_that_is_one_point_in_one_line(tmp_path, capsys):
    (tmp_path / "user").mkdir()
    np.save(tmp_path / "user" / "points.npy", np.full((50, 2), 3.0))
    flags = ["--config", "{configs}/toy2d.yaml", "--data.path", "{user}/points.npy"]
    line = run_in_process(
        train, train_args(flags, tmp_path / "user", tmp_path / "runs"), tmp_path / "user", capsys
    )
    assert re.search(r"error: --data.path .*points.npy: its 50 rows are all the same point", line), line
    assert not (tmp_path / "runs").exists()


SEVERAL = {
    "two_batches": ([IMAGES, IMAGES], {}, r"holds more than one array \(arr_0 \(4, 16, 16, 1\), arr_1 \(4, 16, 16, 1\)\)"),
    "labels_of_another_count": ([IMAGES, np.arange(3)], {}, r"\(arr_0 \(4, 16, 16, 1\), arr_1 \(3,\)\)"),
    "labels_and_a_batch": ([IMAGES, np.arange(4), IMAGES], {}, r"arr_1 \(4,\), arr_2 \(4, 16, 16, 1\)\)"),
}  # fmt: skip


@pytest.mark.parametrize("case", SEVERAL)
@pytest.mark.parametrize("flag", ["--samples", "--reference"])
def test_an_archive_of_several_arrays_is_refused_not_read_in_part(case, flag, tmp_path, capsys):
    """np.savez(path, *batches): arr_0 alone was scored, the other batches dropped without a word."""
    arrays, named, pattern = SEVERAL[case]
    (tmp_path / "user").mkdir()
    path = tmp_path / "user" / "images.npz"
    np.savez(path, *arrays, **named)
    other = ["--reference", "digits"] if flag == "--samples" else ["--save_stats", str(tmp_path / "s.npz")]
    line = run_in_process(
        evaluate.main, [flag, str(path), *other, "--features", "pixels"], tmp_path / "user", capsys
    )
    assert line.startswith(f"error: {flag} {path} ") and re.search(pattern, line), line
    assert line.endswith(
        "and only arr_0 is read (arr_1 only as class labels, shape (4,)) — save one array per file, or merge them "
        "into one: np.savez(path, np.concatenate([a, b]))"
    ), line


@pytest.mark.parametrize(
    "named",
    [{}, {"mu": np.zeros(3), "sigma": np.eye(3)}],  # sample's labels; guided-diffusion's reference batches
    ids=["with_labels", "with_statistics"],
)
def test_images_with_their_labels_or_statistics_beside_them_are_read(named, tmp_path):
    path = tmp_path / "images.npz"
    np.savez(path, IMAGES, *([np.arange(4)] if not named else []), **named)
    images, labels = read_images(path, "--samples")
    np.testing.assert_array_equal(images, IMAGES)
    assert (labels is None) == bool(named)
