"""DiffusionModule's noise_seed and normalization are checked when it is built (tester round 8b, P1 and P2): a
noise seed out of [0, 2**64) was taken modulo 2**64 without a word (-1 trained with the noise of 2**64 - 1, and
2**70 + 5 with that of 5), as `generate`'s seed would be and is not; a normalization that fits no sample (a shift
or scale per channel miscounted, a scale of 0) was stored, and refused only when rendering, by a line whose fix
was to pass the module's normalization, the very one given. Also: `latest_checkpoint`'s empty run name."""

import json

import numpy as np
import pytest
import torch

from diffusion import MLP, DiffusionModule, UNet, latest_checkpoint, load_checkpoint
from diffusion.core.noise import noise_key
from diffusion.training.exported import write_export


def vectors(**options) -> DiffusionModule:
    torch.manual_seed(0)
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8)
    return DiffusionModule(network, sample_shape=(2,), num_timesteps=20, **options)


def test_a_noise_seed_that_would_wrap_to_another_is_refused():
    assert noise_key(2**70 + 5, 3, 7) == noise_key(5, 3, 7)  # why: the noise takes the seed modulo 2**64
    for seed in (-1, 2**64, 2**70 + 5):
        with pytest.raises(ValueError) as refused:
            vectors(noise_seed=seed, noise_mode="per_sample")
        assert str(refused.value) == (
            f"noise_seed={seed} must be a whole number in [0, 2**64 - 1] — pass a seed from 0 to "
            "18446744073709551615, or leave it unset for the seed given to seed_everything"
        )
    with pytest.raises(ValueError, match=r"^noise_seed=1.5 must be a whole number — "):
        vectors(noise_seed=1.5)
    with pytest.raises(TypeError, match=r"^noise_seed='3' is a str, not a whole number — "):
        vectors(noise_seed="3")


def test_noise_seeds_in_range_are_taken_as_ints():
    assert vectors(noise_seed=2**64 - 1).hparams["noise_seed"] == 2**64 - 1
    seed = vectors(noise_seed=np.int64(7)).hparams["noise_seed"]
    assert seed == 7 and type(seed) is int  # a plain int in the checkpoint
    assert vectors().hparams["noise_seed"] is None


UNET = dict(channels=8, channel_mult=[1, 2], num_res_blocks=1, attention_levels=[1])


@pytest.mark.parametrize(
    ("normalization", "error", "words"),
    [
        (
            {"shift": [0.5], "scale": [0.5, 0.5]},
            ValueError,
            r"^normalization has 1 shift and 2 scale values, but the samples of sample_shape=\(1, 8, 8\) have 1 "
            r"channel — pass the data module's normalization \(data.normalization: ",
        ),
        (
            {"shift": [0.5], "scale": [0.0]},
            ValueError,
            r"^normalization\['scale'\]\[0\]=0.0 must be a finite number other than 0 — pass the data module's",
        ),
        (
            {"shift": [float("nan")], "scale": [0.5]},
            ValueError,
            r"^normalization\['shift'\]\[0\]=nan must be a finite number — pass the data module's",
        ),
        ({"scale": [0.5]}, ValueError, r"^normalization=\{'scale': \[0.5\]\} has no shift — "),
        (
            [0.5, 0.5],
            TypeError,
            r"^normalization=\[0.5, 0.5\] is a list, not a dict of 'shift' and 'scale' — ",
        ),
    ],
    ids=["miscounted", "zero-scale", "nan-shift", "no-shift", "list"],
)
def test_a_normalization_that_fits_no_sample_is_refused_when_built(normalization, error, words):
    with pytest.raises(error, match=words) as refused:
        DiffusionModule(UNet(**UNET), normalization=normalization)
    assert "module.normalization" not in str(refused.value)  # the fix is not what was passed


def test_normalizations_that_fit_are_taken():
    assert vectors(normalization={"shift": [-2.5, 0.0], "scale": [0.5, 3.0]}).normalization["shift"] == [
        -2.5,
        0.0,
    ]
    module = DiffusionModule(UNet(**UNET), normalization={"shift": [0.5], "scale": [0.5]})
    assert module.normalization == {"shift": [0.5], "scale": [0.5]}
    with pytest.raises(ValueError, match=r"have 2 features — "):
        vectors(normalization={"shift": [0.0], "scale": [1.0]})


def test_an_empty_run_name_is_said_to_be_empty():
    # "name='' is a str, not a run name (str)" (tester 8b, P6)
    with pytest.raises(ValueError, match=r"^name='' is empty: it names no run — pass the run's name"):
        latest_checkpoint("runs", "")


def test_latest_checkpoint_of_a_run_without_an_intact_one_says_itself_not_a_flag(tmp_path):
    # "--ckpt_path last: no intact checkpoint in ..." to a Python caller (tester 21b, S2)
    checkpoints = tmp_path / "runs" / "x" / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(ValueError) as refused:
        latest_checkpoint(tmp_path / "runs", "x")
    assert str(refused.value) == (
        f"latest_checkpoint('{tmp_path / 'runs'}', 'x'): no intact checkpoint in {checkpoints} (last.ckpt is "
        "truncated or not a PyTorch checkpoint (no intact zip archive)) — pass the path of an intact checkpoint (a "
        "backup) where a checkpoint goes, e.g. load_checkpoint(path)"
    )


MLP_CONFIG = {
    "class_path": "diffusion.models.MLP",
    "init_args": {"in_channels": 2, "hidden_dim": 8, "num_blocks": 1, "time_embed_dim": 8},
}


@pytest.mark.parametrize(
    "kind",
    [
        lambda values: torch.tensor(values),
        lambda values: torch.tensor(values, requires_grad=True),
        lambda values: np.asarray(values),
        lambda values: np.asarray(values, dtype=np.float32),
        tuple,
    ],
    ids=["tensor", "tensor-with-grad", "ndarray", "float32-ndarray", "tuple"],
)
def test_a_normalization_computed_as_tensors_arrays_or_tuples_is_kept_as_lists_of_floats(kind, tmp_path):
    # A tensor was kept as given: Trainer.fit's setup then failed in "Boolean value of Tensor with more than one
    # value is ambiguous", write_export in "Object of type Tensor is not JSON serializable" (tester 18b, M4).
    module = vectors(normalization={"shift": kind([-2.5, 0.25]), "scale": kind([0.5, 3.0])})
    assert module.normalization == {"shift": [-2.5, 0.25], "scale": [0.5, 3.0]}
    assert all(
        type(value) is float for key in ("shift", "scale") for value in module.hparams["normalization"][key]
    )
    write_export(module, MLP_CONFIG, tmp_path, "raw")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["hyper_parameters"]["normalization"] == {"shift": [-2.5, 0.25], "scale": [0.5, 3.0]}
    assert load_checkpoint(str(tmp_path)).normalization == module.normalization


def test_a_normalization_of_tensors_is_checked_as_lists_are():
    with pytest.raises(
        ValueError, match=r"^normalization\['scale'\]\[1\]=0.0 must be a finite number other than 0"
    ):
        vectors(normalization={"shift": torch.zeros(2), "scale": torch.tensor([1.0, 0.0])})
    with pytest.raises(
        ValueError, match=r"^normalization has 3 shift and 2 scale values, but the samples of "
    ):
        vectors(normalization={"shift": np.zeros(3), "scale": np.ones(2)})
    with pytest.raises(TypeError, match=r"^normalization\['shift'\]='0' is a str, not a list of numbers"):
        vectors(normalization={"shift": "0", "scale": np.ones(2)})
