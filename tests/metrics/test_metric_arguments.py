"""Round 17b's metrics findings (J4-J7, J10): a statistics file whose keys are damaged, or that is a torch checkpoint,
said in one line naming the file and the key; SampleQuality's arguments and BitsPerDim.of's rows refused by their
name, not in an AttributeError or torch's RuntimeError; save_statistics into an immutable folder said by its flag."""

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.full_disk import immutable
from helpers.user_errors import error_line

from diffusion.cli import evaluate
from diffusion.errors import FlaggedFolder, InvalidValue, WrongType
from diffusion.metrics.bits_per_dim import BitsPerDim
from diffusion.metrics.reference_stats import WRITE_FIX, FeatureStatistics, load_statistics, save_statistics
from diffusion.metrics.sample_quality import SampleQuality

FIX = WRITE_FIX.replace("{command:--reference}", "--reference").replace(
    "{command:--save_stats}", "--save_stats"
)
GOOD = {
    "mu": np.zeros(64),
    "sigma": np.eye(64),
    "features": np.asarray("pixels"),
    "num_images": np.asarray(10),
    "image_size": np.asarray((8, 8)),
}


def statistics_file(folder: Path, **changed: object) -> Path:
    path = folder / "st.npz"
    np.savez(path, **{**GOOD, **changed})  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("num_images", np.asarray("abc"), "num_images='abc' is not a whole number >= 1"),
        ("num_images", np.asarray(0), "num_images=0 is not a whole number >= 1"),
        ("num_images", np.asarray([10, 10]), "num_images=<array of shape (2,), int64> is not a whole number >= 1"),
        ("image_size", np.asarray("8x8"), "image_size='8x8' is not (height, width), two whole numbers >= 1"),
        ("image_size", np.asarray(8), "image_size=8 is not (height, width), two whole numbers >= 1"),
        ("image_size", np.asarray((8.0, 8.0)), "image_size=<array of shape (2,), float64> is not (height, width)"),
        ("features", np.asarray("clip"), "features='clip' is not one of 'inception' or 'pixels'"),
        ("features", np.asarray(3), "features=3 is not one of 'inception' or 'pixels'"),
        ("mu", np.asarray("abc"), "mu='abc' is not an array of numbers"),
        ("sigma", np.full((64, 64), "x"), "sigma=<array of shape (64, 64), <U1> is not an array of numbers"),
        ("num_images", np.asarray([None], dtype=object), "num_images holds Python objects (dtype object), not numbers"),
    ],
    ids=["num-text", "num-zero", "num-array", "size-text", "size-0d", "size-floats", "features-other",
         "features-number", "mu-text", "sigma-text", "num-objects"],
)  # fmt: skip
def test_a_damaged_key_of_a_statistics_file_is_said_as_the_file_and_the_key(tmp_path, key, value, said):
    # num_images 'abc' was int()'s bare ValueError, a 0-d image_size "iteration over a 0-d array" (J4)
    path = statistics_file(tmp_path, **{key: value})
    with pytest.raises(InvalidValue) as refused:
        load_statistics(path)
    assert str(refused.value).startswith(f"{path}: {said}"), str(refused.value)
    assert str(refused.value).endswith(f" — {FIX}")


def test_a_damaged_statistics_file_is_one_error_line_of_evaluate(tmp_path, capsys):
    path = statistics_file(tmp_path, num_images=np.asarray("abc"))
    samples = tmp_path / "samples.npz"
    np.savez(samples, np.random.default_rng(0).integers(0, 256, (4, 8, 8, 1), dtype=np.uint8))
    with pytest.raises(SystemExit) as exited:
        evaluate.main(["--samples", str(samples), "--reference", str(path), "--features", "pixels"])
    assert exited.value.code == 2
    assert error_line(capsys.readouterr().err) == (
        f"error: {path}: num_images='abc' is not a whole number >= 1 — {FIX}"
    )


def test_a_good_statistics_file_reads_back_as_written(tmp_path):
    stats = load_statistics(statistics_file(tmp_path))
    assert (stats.features, stats.num_images, stats.image_size, stats.size) == ("pixels", 10, (8, 8), 64)


@pytest.mark.parametrize("name", ["ck.npz", "last.ckpt"])
def test_a_torch_checkpoint_is_said_as_one_in_a_short_line(tmp_path, name):
    # its hundreds of members were listed: a 7,600-character line (J5)
    path = tmp_path / name
    torch.save({f"w{i}": torch.zeros(1) for i in range(300)}, path)
    with pytest.raises(InvalidValue) as refused:
        load_statistics(path)
    assert str(refused.value) == (
        f"{path} is a PyTorch checkpoint (torch.save), not FID statistics — pass the .npz of mu and sigma that "
        f"evaluate wrote, or {FIX}"
    )


def test_an_archive_of_many_other_arrays_lists_a_few(tmp_path):
    path = tmp_path / "many.npz"
    np.savez(path, **{f"a{i}": np.zeros(1) for i in range(40)})
    with pytest.raises(InvalidValue) as refused:
        load_statistics(path)
    assert str(refused.value).startswith(
        f"{path} has no mu and no sigma (it holds ['a0', 'a1', 'a2', 'a3', 'a4', '... (40 in all)']), so it is no "
    )


@pytest.mark.parametrize("as_path", [str, Path], ids=["str", "Path"])
def test_a_statistics_files_path_as_reference_says_to_load_it(tmp_path, as_path):
    # an AttributeError: 'str' object has no attribute 'size' (J6)
    path = as_path(tmp_path / "stats.npz")
    with pytest.raises(WrongType) as refused:
        SampleQuality(features="pixels", metrics=("fid",), channels=1, reference=path)
    assert str(refused.value).startswith("reference=")  # a long path shown as <PosixPath> (WrongType's rule)
    assert str(refused.value).endswith(
        f" is a {type(path).__name__}, not FeatureStatistics (or None) — pass load_statistics({str(path)!r}), the "
        "statistics that file holds"
    )


@pytest.mark.parametrize(
    ("options", "error", "said"),
    [
        ({"reference": {"mu": 0}}, WrongType, r"^reference=\{'mu': 0\} is a dict, not FeatureStatistics \(or None\) — "
                                               r"pass load_statistics\(path\) of a statistics .npz"),
        ({"reference": FeatureStatistics(np.zeros(5), np.eye(5))}, InvalidValue,
         r"^reference holds 5-d statistics, and pixels features of these images are 64-d — pass statistics of the "),
        ({"reference": FeatureStatistics(np.zeros(64), np.eye(64), "inception")}, InvalidValue,
         r"^reference holds statistics of inception features, not pixels — build SampleQuality\(features='inception'\)"),
        ({"features": ["pixels"]}, WrongType, r"^features=\['pixels'\] is a list, not 'inception' or 'pixels' — pass "),
        ({"metrics": None}, WrongType, r"^metrics=None is a NoneType, not a list of metric names — pass e.g. metrics="),
        ({"metrics": 3}, WrongType, r"^metrics=3 is an int, not a list of metric names"),
        ({"compute_on_cpu": "yes"}, WrongType, r"^compute_on_cpu='yes' is a str, not True or False — pass "),
        ({"sync_on_compute": None}, WrongType, r"^sync_on_compute=None is a NoneType, not True or False"),
        ({"dist_sync_fn": "x"}, WrongType, r"^dist_sync_fn='x' is a str, not a function or None — pass dist_sync_fn "),
        ({"distributed_available_fn": 3}, WrongType, r"^distributed_available_fn=3 is an int, not a function or None"),
    ],
    ids=["reference-dict", "reference-other-size", "reference-other-features", "features-list", "metrics-none",
         "metrics-int", "compute_on_cpu", "sync_on_compute", "dist_sync_fn", "distributed_available_fn"],
)  # fmt: skip
def test_sample_quality_arguments_of_the_wrong_kind_are_refused_by_their_name(options, error, said):
    with pytest.raises(error, match=said):
        SampleQuality(**{"features": "pixels", "metrics": ("fid",), "channels": 1, **options})


def test_metrics_given_as_a_generator_are_all_reported():
    # the checks used the generator up: compute() reported no metric, without a word
    quality = SampleQuality("pixels", metrics=(name for name in ["fid"]), channels=1)
    assert quality.reported == ("fid",)


@pytest.mark.parametrize("dtype", [torch.long, torch.bool, torch.uint8])
def test_bits_per_dim_of_integer_rows_is_refused_by_the_arguments_name(dtype):
    # torch's "mean(): could not infer output dtype" (J7)
    with pytest.raises(WrongType) as refused:
        BitsPerDim.of(torch.ones(3, 4, dtype=dtype))
    kind = str(dtype).removeprefix("torch.")
    assert str(refused.value) == (
        f"bounds is a{'n' if kind == 'int64' else ''} {kind} tensor, not floating point (bits/dim) — pass the "
        "(N, 4) rows image_bounds returns, one per image, N >= 1, or bounds.double()"
    )


def test_bits_per_dim_of_rows_holding_nan_is_refused_saying_why():
    bounds = torch.ones(3, 4, dtype=torch.float64)
    bounds[1, 2] = float("nan")
    with pytest.raises(InvalidValue) as refused:
        BitsPerDim.of(bounds)
    assert str(refused.value) == (
        "bounds holds NaN in 1 of its 3 rows (first row 1), and a mean of NaN is no bits/dim: the network's "
        "outputs were not finite for those images — evaluate finite weights: the checkpoint's other weights (ema "
        "or raw), or an earlier checkpoint"
    )
    assert BitsPerDim.of(torch.ones(3, 4)).bits_per_dim == 1.0


def test_save_statistics_into_an_immutable_folder_is_said_by_its_flag(tmp_path):
    # "(Operation not permitted) — make that folder writable for this user": root is refused too (J10)
    folder = tmp_path / "imm"
    folder.mkdir()
    with immutable(folder):
        with pytest.raises(FlaggedFolder) as refused:
            save_statistics(folder / "s.npz", FeatureStatistics(np.zeros(2), np.eye(2)))
        left = list(folder.iterdir())
    assert str(refused.value) == (
        f"cannot write s.npz into {folder} (it is immutable) — check its attributes (lsattr -d {folder}; chattr -i "
        "clears an immutable flag), or write to another folder; the files written there before are intact"
    )
    assert left == []


@pytest.mark.parametrize(
    ("images", "said"),
    [
        (torch.zeros(8, 8, 8, 1, dtype=torch.uint8), r"^images has shape \(8, 8, 8, 1\): channels last \(N, H, W, C\), "
                                                     r".* — pass images.permute\(0, 3, 1, 2\)"),
        (torch.zeros(8, 8, 8, 8, dtype=torch.uint8), r"^images has 8 channels \(shape \(8, 8, 8, 8\)\), and this "
                                                     r"SampleQuality was built for channels=1 — pass images of 1 channel\(s\)$"),
        (torch.zeros(8, 3, 8, 8, dtype=torch.uint8), r"— pass images of 1 channel\(s\), or build SampleQuality\(channels=3\)$"),
    ],
    ids=["channels-last", "eight channels", "rgb"],
)  # fmt: skip
def test_images_of_other_channels_are_said_with_a_fix_that_works(images, said):
    """Round 19b's Q3: sample's own samples.npz (N, H, W, C) was said as 8 channels, the fix SampleQuality(channels=8),
    which its constructor refuses."""
    with pytest.raises(ValueError, match=said):
        SampleQuality(features="pixels", metrics=("fid",), channels=1).update(images, real=False)


def kid_of(seed: int, then: int | None = None) -> float:
    torch.manual_seed(0)
    quality = SampleQuality("pixels", ("kid",), channels=1, kid_subset_size=2, kid_subsets=3)
    quality.update(torch.rand(16, 1, 8, 8), real=True)
    quality.update(torch.rand(16, 1, 8, 8), real=False)
    first = quality.compute(seed=seed)["kid_mean"]
    return first if then is None else quality.compute(seed=then)["kid_mean"]


def test_a_second_compute_under_another_seed_draws_that_seeds_kid_subsets():
    """Round 20b's S3: torchmetrics returned the first compute's KID (seed 0's subsets) for seed 12345."""
    assert kid_of(0, then=12345) == kid_of(12345) != kid_of(0)


@pytest.mark.parametrize(
    ("seed", "said"),
    [
        ("x", r"^seed='x' is a str, not a whole number"),
        (None, r"^seed=None is a NoneType, not a whole number"),
        (1.5, r"^seed=1.5 must be a whole number"),
        (True, r"^seed=True is a bool, not a whole number"),
        # round 25b's S5: the fix spoke of "sample i's noise", which compute draws none of
        (
            -1,
            r"^seed=-1 must be a whole number in \[0, 2\*\*64 - 1\] — pass a seed .*: it draws KID's random subsets$",
        ),
        (2**70, r"^seed=1180591620717411303424 must be a whole number in \[0, 2\*\*64 - 1\]"),
    ],
)
def test_a_kid_seed_that_is_no_seed_is_refused_by_its_name(seed, said):
    """Round 20b's S2: torch's own errors named no seed, and 1.5, True and -1 gave a KID without a word."""
    quality = SampleQuality("pixels", ("kid",), channels=1, kid_subset_size=2, kid_subsets=3)
    quality.update(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), real=True)
    quality.update(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), real=False)
    with pytest.raises((TypeError, ValueError), match=said):
        quality.compute(seed=seed)


def test_save_statistics_into_a_folders_path_names_the_folder(tmp_path):
    """Round 20b's S5: a bare IsADirectoryError naming a temporary file the caller never wrote."""
    with pytest.raises(ValueError) as refused:
        save_statistics(tmp_path, FeatureStatistics(np.zeros(4), np.eye(4)))
    assert str(refused.value) == (
        f"path {tmp_path} is a folder, not a file — pass the .npz file to write, e.g. {tmp_path / 'stats.npz'}"
    )
    assert not list(tmp_path.iterdir())


def test_save_statistics_into_a_missing_folder_or_under_a_file_names_the_path(tmp_path):
    """Round 21b's S1: the OS's FileNotFoundError / NotADirectoryError named the temporary file (`.x.npz.<hex>.tmp`)."""
    (tmp_path / "u.ckpt").write_bytes(b"a file")
    stats = FeatureStatistics(np.zeros(4), np.eye(4))
    with pytest.raises(FileNotFoundError) as refused:
        save_statistics(tmp_path / "nodir" / "x.npz", stats)
    assert str(refused.value) == (
        f"path='{tmp_path / 'nodir' / 'x.npz'}': the folder {tmp_path / 'nodir'} does not exist — make the folder "
        "first, or pass a path in a folder that exists"
    )
    with pytest.raises(ValueError) as refused:
        save_statistics(tmp_path / "u.ckpt" / "x.npz", stats)
    assert str(refused.value) == (
        f"path='{tmp_path / 'u.ckpt' / 'x.npz'}': {tmp_path / 'u.ckpt'} is a file, not a folder — pass a path in "
        "a folder"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["u.ckpt"]


def test_real_images_fed_where_reference_statistics_stand_for_them_are_refused_by_real():
    # "ValueError: this FrechetDistance compares with fixed reference statistics: feed no real features", an inner
    # class's words with no fix (tester round 23, S10)
    reference = FeatureStatistics(np.zeros(64), np.eye(64), "pixels", 10, (8, 8))
    metric = SampleQuality(features="pixels", metrics=("fid",), channels=1, reference=reference)
    images = torch.zeros(4, 1, 8, 8, dtype=torch.uint8)
    with pytest.raises(InvalidValue) as refused:
        metric.update(images, real=True)
    assert str(refused.value) == (
        "real=True: this SampleQuality compares with fixed reference statistics (reference=), which stand for the "
        "real images — feed generated images as update(images, real=False), or build SampleQuality without "
        "reference= to feed real images"
    )
    with pytest.raises(
        InvalidValue, match=r"^real=True: this FrechetDistance compares with fixed reference stat"
    ):
        metric.fid.update(torch.zeros(4, 64), real=True)
    metric.update(images, real=False)  # the generated ones, as before
