"""Samples generation refuses rather than turn into something that looks like a result: NaN or infinite samples
(a model whose weights diverged) that would become black pixels or NaN rows of samples.npz, and a count whose
samples `generate` could not hold in memory, refused before any sampling rather than by torch's allocation error."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import tiny_vector_model
from helpers.full_disk import immutable

from diffusion.errors import CannotReplace, FlaggedFolder, InvalidValue, OutOfRange, UserError, WrongType
from diffusion.generation import arguments
from diffusion.generation.arguments import check_result_fits_memory
from diffusion.generation.ranks import drawn_anyway, generate, generate_in_chunks, sample_across_ranks
from diffusion.generation.render import SamplesWriter, compact, to_uint8, to_uint8_images, write_samples
from diffusion.models import UNet
from diffusion.training.module import DiffusionModule

NORMALIZATION = {"shift": [0.5], "scale": [0.5]}
NOT_FINITE = r"^2 of the 5 samples hold values that are not finite \(NaN or infinity\), which have no pixels"
FIX = r" — the model's weights produce samples that are not finite: sample its other weights"


def images_with(*bad: float) -> torch.Tensor:
    """Five 1x4x4 images in model units, the first values of samples 1 and 3 (and more of sample 3) `bad`."""
    images = torch.linspace(-1, 1, 5 * 16).reshape(5, 1, 4, 4)
    images[1, 0, 0, 0] = bad[0]
    images[3, 0, 2, :] = bad[-1]
    return images


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("bad", [(NAN,), (INF, -INF), (NAN, INF)])
def test_images_that_are_not_finite_are_refused_not_turned_into_black_pixels(bad):
    # NaN clamped then rounded was 0: a diverged model's samples came out black without a word.
    images = images_with(*bad)
    for convert in (to_uint8, compact, to_uint8_images):
        with pytest.raises(InvalidValue, match=NOT_FINITE + ".*" + FIX) as refused:
            convert(images, NORMALIZATION)
        assert isinstance(refused.value, ValueError)  # for Python callers that catch one
    with pytest.raises(InvalidValue, match=NOT_FINITE):
        to_uint8(images.half(), NORMALIZATION)  # in any float dtype


def test_finite_images_and_uint8_ones_still_convert():
    images = images_with(1.0)
    uint8 = to_uint8(images, NORMALIZATION)
    assert uint8.dtype == torch.uint8 and int(uint8.min()) == 0 and int(uint8.max()) == 255
    assert torch.equal(compact(uint8, NORMALIZATION), uint8)  # uint8 images are finite: passed as they are


def test_samples_that_are_not_finite_are_written_to_no_file(tmp_path):
    vectors = torch.randn(5, 2)
    vectors[[0, 4], 1] = NAN
    shift_scale = {"shift": [0.0, 0.0], "scale": [1.0, 1.0]}
    with pytest.raises(InvalidValue, match=NOT_FINITE.replace("which have no pixels", "")):
        write_samples(vectors, shift_scale, tmp_path / "vectors")  # before: float32 NaN rows in samples.npz
    with pytest.raises(InvalidValue, match=NOT_FINITE):
        write_samples(images_with(NAN), NORMALIZATION, tmp_path / "images")
    assert not any(tmp_path.iterdir())  # the folders made for them removed again
    # A chunk refused after others were written leaves nothing either.
    writer = SamplesWriter(tmp_path / "chunks", 4, (2,), shift_scale)
    with pytest.raises(InvalidValue, match=r"^1 of the 2 samples"), writer:
        writer.write(torch.zeros(2, 2))
        writer.write(torch.tensor([[0.0, 0.0], [INF, 1.0]]))
    assert not any(tmp_path.iterdir())


def tiny_image_model() -> DiffusionModule:
    torch.manual_seed(0)
    network = UNet(in_channels=1, channels=8, channel_mult=[1], num_res_blocks=1, attention_levels=[])
    return DiffusionModule(network, sample_shape=(1, 8, 8), num_timesteps=10, normalization=NORMALIZATION)


def test_streamed_images_that_are_not_finite_stop_with_the_ranks_own_line():
    # `generate_in_chunks` (the sample command's) converts each batch to uint8 as it comes, and stops only at the
    # chunk's end, where every rank learns of it: the conversion must not refuse the batch first, on one rank.
    module = tiny_image_model()
    module.network.register_forward_hook(lambda network, inputs, output: output * NAN)
    sampler = module.sampler()
    stopped = r"^sampling produced values that are not finite .* among samples 0 to 2; nothing was written"
    with pytest.raises(UserError, match=stopped):
        list(generate_in_chunks(module, 3, sampler=sampler, batch_size=2))
    with pytest.raises(InvalidValue, match=r"^2 of the 2 samples hold values that are not finite"):
        generate(module, 3, sampler=sampler, batch_size=2, uint8_images=True)


def test_a_training_time_grid_of_samples_that_are_not_finite_is_drawn_with_a_warning_not_refused():
    # Refused, it ended the training (and under DDP the rank that refused alone left the others waiting): a grid is
    # a preview; the weights' own NaN stops a run before every validation.
    module = tiny_image_model()
    module.network.register_forward_hook(lambda network, inputs, output: output * NAN)
    module.trainer = SimpleNamespace(world_size=1, global_rank=0)
    with pytest.warns(
        UserWarning, match=r"^3 of the 3 samples of a sample grid hold values that are not finite"
    ):
        grid = sample_across_ranks(module, 3, 0, module.sampler())
    assert grid.dtype == torch.uint8 and grid.shape == (3, 1, 8, 8)
    with pytest.warns(UserWarning, match=r"^1 of the 2 samples of the quality metrics"):
        drawn = drawn_anyway(torch.tensor([[0.5, 1.0], [NAN, -INF]]), "the quality metrics")
    assert torch.equal(drawn[0], torch.tensor([0.5, 1.0])) and bool(torch.isfinite(drawn).all())


def test_a_count_whose_samples_memory_cannot_hold_is_refused_before_any_sampling(monkeypatch):
    module = tiny_vector_model()
    sampled = []
    monkeypatch.setattr(module, "initial_noise", lambda *args: sampled.append(args))
    # 2**40 samples: torch's allocation error (of the indices, or of the result after the sampling's time).
    with pytest.raises(InvalidValue, match=r"^num_samples=1099511627776: generate returns the samples in one "
                       r"tensor of 8,192.0 GiB, more than this machine's [\d,.]+ GiB of memory — draw them a "
                       r"chunk at a time with generate_in_chunks") as refused:  # fmt: skip
        generate(module, 2**40)
    assert isinstance(refused.value, ValueError) and not sampled
    # What each rank holds: its share. uint8 images 1 byte a value, float32 4.
    monkeypatch.setattr(arguments, "machine_memory", lambda: 1000)
    with pytest.raises(InvalidValue, match=r"^num_samples=251: .* \(this rank's 126 of 2 ranks' shares\)"):
        generate(module, 251, rank=1, world_size=2)  # 126 x 2 x 4 bytes
    check_result_fits_memory(250, 2, (2,), uint8_images=False)  # 125 x 2 x 4 bytes: 1000
    check_result_fits_memory(1000, 1, (1, 1, 1), uint8_images=True)
    with pytest.raises(InvalidValue, match=r"^num_samples=1000: "):
        check_result_fits_memory(1000, 1, (1, 1, 1), uint8_images=False)


def test_sane_counts_are_not_refused():
    check_result_fits_memory(10**6, 1, (1, 8, 8), uint8_images=True)  # a million digits: 64 MB
    check_result_fits_memory(50_000, 1, (3, 32, 32), uint8_images=False)  # CIFAR-10's size as float: 614 MB
    assert generate(tiny_vector_model(), 3).shape == (3, 2)


def test_samples_into_a_folder_under_a_file_name_the_file(tmp_path):
    # mkdir said `NotADirectoryError: [Errno 20] Not a directory: 'u.ckpt/out/samples.partial'`
    (tmp_path / "u.ckpt").write_bytes(b"a file")
    vectors, shift_scale = torch.zeros(2, 2), {"shift": [0.0, 0.0], "scale": [1.0, 1.0]}
    for out in (tmp_path / "u.ckpt" / "out", tmp_path / "u.ckpt"):
        with pytest.raises(InvalidValue) as refused:
            write_samples(vectors, shift_scale, out)
        assert str(refused.value) == (
            f"out_dir='{out}': {tmp_path / 'u.ckpt'} is a file, not a folder — pass a folder's path (the folders "
            "missing are made)"
        )
    assert (tmp_path / "u.ckpt").read_bytes() == b"a file"


def test_samples_where_a_folder_holds_the_name_of_their_file_move_nothing_in(tmp_path):
    # The OS's IsADirectoryError of the last move, after grid.png had been moved in (tester round 22b, S5)
    out = tmp_path / "out"
    (out / "samples.npz").mkdir(parents=True)
    with pytest.raises(InvalidValue) as refused:
        write_samples(torch.zeros(2, 2), {"shift": [0.0, 0.0], "scale": [1.0, 1.0]}, out)
    assert str(refused.value) == (
        f"out_dir='{out}': {out / 'samples.npz'} is a folder, where the file samples.npz goes — move that folder "
        "away, or pass another out_dir; nothing was written"
    )
    assert [p.name for p in out.iterdir()] == ["samples.npz"]


def test_samples_into_an_immutable_folder_are_said_by_its_flag(tmp_path):
    # "cannot write samples.npz into imm (Operation not permitted) — make that folder writable" (tester 22b, S1)
    flagged = tmp_path / "imm"
    flagged.mkdir()
    for out, name in ((flagged, "samples.npz"), (flagged / "sub", "sub/samples.npz")):
        with immutable(flagged), pytest.raises(FlaggedFolder) as refused:
            write_samples(torch.zeros(2, 2), {"shift": [0.0, 0.0], "scale": [1.0, 1.0]}, out)
        assert str(refused.value).startswith(
            f"cannot write {name} into {flagged} (it is immutable) — check its "
        )
    assert not any(flagged.iterdir())


SHIFT_SCALE = {"shift": [0.0, 0.0], "scale": [1.0, 1.0]}
LABELS_FIX = " — pass class_labels(num_samples, module.num_classes), or one int class per sample"


@pytest.mark.parametrize(
    ("labels", "error", "said"),
    [
        ([1, 2, 3], OutOfRange, "labels=<(3,) labels> must be one label per sample, shape (8,)" + LABELS_FIX),
        (torch.arange(10), OutOfRange, "labels=<(10,) labels> must be one label per sample, shape (8,)" + LABELS_FIX),
        ([0.7] * 8, OutOfRange, "labels=[0.699999988079071, 0.699999988079071, 0.699999988079071, "
         "0.699999988079071, 0.699999988079071], ... (8 values) must be whole numbers (class indices)" + LABELS_FIX),
        ([-7] + [0] * 7, OutOfRange, "labels=-7 must be >= -1 (class indices; -1 for no class) — pass one int class "
         "per sample, as generate's labels"),
        ("abc", WrongType, "labels='abc' is a str, not a sequence of class numbers" + LABELS_FIX),
    ],
)  # fmt: skip
def test_write_samples_takes_one_label_per_sample_never_cycled_nor_truncated(tmp_path, labels, error, said):
    # 3 labels for 8 samples were cycled into arr_1 ([1 2 3 1 2 3 1 2]), 8 for 3 kept 3, 0.7 stored as 0, -7 stored
    # (tester round 23, S4)
    with pytest.raises(error) as refused:
        write_samples(torch.zeros(8, 2), SHIFT_SCALE, tmp_path / "out", labels=labels)
    assert str(refused.value) == said
    assert not (tmp_path / "out").exists()


def test_write_samples_stores_the_labels_given_no_label_included(tmp_path):
    labels = [0, 1, 2, -1, 1, 0, 2, 1]  # NO_LABEL (-1), as generate takes it
    written = write_samples(torch.zeros(8, 2), SHIFT_SCALE, tmp_path / "out", labels=torch.tensor(labels))
    assert np.load(written)["arr_1"].tolist() == labels


@pytest.mark.parametrize(
    ("given", "error", "said"),
    [
        ({"grid_size": 0}, OutOfRange, "grid_size=0 must be a whole number >= 1"),
        ({"grid_size": -1}, OutOfRange, "grid_size=-1 must be a whole number >= 1"),
        ({"grid_size": 2.5}, OutOfRange, "grid_size=2.5 must be a whole number >= 1"),
        ({"grid_size": "8"}, WrongType, "grid_size='8' is a str, not a whole number >= 1"),
        ({"grid_size": True}, WrongType, "grid_size=True is a bool, not a whole number >= 1"),
        ({"out_dir": 5}, WrongType, "out_dir=5 is an int, not a folder's path — pass out_dir as a str or a Path"),
    ],
)  # fmt: skip
def test_write_samples_refuses_a_grid_size_or_out_dir_by_its_name(tmp_path, given, error, said):
    # grid_size 0 or -1: torch.cat's error; 2.5, "8": TypeErrors of a slice; True taken; out_dir=5: os.fspath's
    # TypeError (tester round 23, S6)
    arguments = {"out_dir": tmp_path / "out", **given}
    with pytest.raises(error) as refused:
        write_samples(torch.zeros(4, 1, 2, 2), {"shift": [0.5], "scale": [0.5]}, **arguments)
    if "grid_size" in given:
        said += " — pass how many samples grid.png shows, >= 1"
    assert str(refused.value) == said
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flagged", ["samples.npz", "grid.png"])
def test_write_samples_over_an_immutable_file_replaces_neither(tmp_path, flagged):
    # "CannotWrite: cannot write samples.npz into wsi (Operation not permitted) — make that folder writable", and
    # grid.png replaced while samples.npz kept the old samples (tester round 23, S5)
    out = tmp_path / "wsi"
    write_samples(torch.zeros(2, 2), SHIFT_SCALE, out)
    before = {name: (out / name).read_bytes() for name in ("samples.npz", "grid.png")}
    with immutable(out / flagged), pytest.raises(CannotReplace) as refused:
        write_samples(torch.ones(3, 2), SHIFT_SCALE, out)
    assert str(refused.value).startswith(
        f"cannot replace {flagged} in {out} (it is immutable): the folder takes new files, but {flagged} itself "
        f"refuses to be replaced — check its attributes (lsattr {out / flagged}; chattr -i clears"
    )
    assert {name: (out / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in out.iterdir()) == ["grid.png", "samples.npz"]
