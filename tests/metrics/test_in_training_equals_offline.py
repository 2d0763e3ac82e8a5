"""The FID a training run logs is the FID `python -m diffusion.evaluate` gives for the same samples against the
same reference: the SampleQualityCallback's images (which `python -m diffusion.sample` draws again from the run's
checkpoint), evaluated offline, score the same to float precision, against the training images and against a
statistics file written by --save_stats."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import VALIDATING_EVERY_2, tiny_run

from diffusion.cli import evaluate, sample
from diffusion.errors import UserError
from diffusion.metrics.sample_quality import SampleQuality
from diffusion.training.callbacks import SampleQualityCallback


class GeneratedImages:
    """Records the generated uint8 images fed to any SampleQuality, one list per evaluation (an evaluation
    ends with ``reset``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.evaluations: list[list[torch.Tensor]] = [[]]
        update, reset = SampleQuality.update, SampleQuality.reset

        def recording_update(quality, images, real):
            if not real:
                self.evaluations[-1].append(images.detach().cpu().clone())
            update(quality, images, real)

        def recording_reset(quality):
            self.evaluations.append([])
            reset(quality)

        monkeypatch.setattr(SampleQuality, "update", recording_update)
        monkeypatch.setattr(SampleQuality, "reset", recording_reset)

    def save_last(self, path) -> str:
        """The last finished evaluation's images as a samples file (uint8 N x H x W x C)."""
        images = torch.cat(self.evaluations[-2])  # (N, C, H, W)
        np.savez(path, images.permute(0, 2, 3, 1).numpy())
        return str(path)


def fid_callback(*options: str) -> list[str]:
    flags = ["--trainer.callbacks+=diffusion.training.callbacks.SampleQualityCallback"]
    for name, value in zip(options[::2], options[1::2], strict=True):
        flags += [f"--trainer.callbacks.init_args.{name}", value]
    return flags


# Train on every digit (validating on 16 of them), so the callback's real images, all of the training set
# (num_real above its 1,797 images), are the whole train split that `--reference digits` renders.
ALL_DIGITS = ["--data.init_args.val_fraction", "0", "--data.init_args.val_from_train", "16"]


def test_fid_logged_in_training_is_the_evaluators_fid_of_the_same_samples(tmp_path, monkeypatch, capsys):
    generated = GeneratedImages(monkeypatch)
    callback_flags = fid_callback("features", "pixels", "num_samples", "16", "num_real", "5000", "kid", "false",
                                  "sampling.steps", "3")  # fmt: skip
    cli = tiny_run(tmp_path / "runs", *ALL_DIGITS, *VALIDATING_EVERY_2, *callback_flags)
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, SampleQualityCallback))
    logged = float(cli.trainer.callback_metrics["val/fid"])
    assert len(generated.evaluations) == 3 and callback.last["num_real"] == 1797  # two evaluations
    # The sample CLI draws the callback's images again from the run's last checkpoint, with its options.
    checkpoint = next((tmp_path / "runs").rglob("last.ckpt"))
    samples = str(sample.main(["--ckpt", str(checkpoint), "--num_samples", "16", "--steps", "3", "--device", "cpu",
                               "--out", str(tmp_path / "drawn")]))  # fmt: skip
    fed = generated.save_last(tmp_path / "fed.npz")
    np.testing.assert_array_equal(np.load(samples)["arr_0"], np.load(fed)["arr_0"])
    pixels = ["--features", "pixels", "--metrics", "fid"]
    offline = evaluate.main(["--samples", samples, "--reference", "digits", *pixels])
    assert offline["num_real"] == 1797 and offline["num_fake"] == callback.last["num_fake"] == 16
    assert offline["fid"] == pytest.approx(callback.last["fid"], rel=1e-9)
    assert logged == pytest.approx(offline["fid"], rel=1e-6)  # logged as a float32 tensor
    # The same against the statistics of the training images, written once.
    stats = str(tmp_path / "digits_stats.npz")
    evaluate.main(
        ["--reference", "digits", "--save_stats", stats, "--image_size", "8", "--features", "pixels"]
    )
    from_stats = evaluate.main(["--samples", samples, "--reference", stats, *pixels])
    assert from_stats["fid"] == pytest.approx(offline["fid"], rel=1e-9)


@pytest.mark.slow  # 14 images through a full InceptionV3 (random weights: nothing downloads)
def test_inception_fid_against_saved_statistics_is_the_same_in_training_and_offline(
    tmp_path, monkeypatch, inception_weights
):
    from sklearn.datasets import load_digits

    real = (load_digits().images[:6] * (255 / 16)).round().astype(np.uint8)  # (6, 8, 8)
    np.savez(tmp_path / "real.npz", real[..., None])  # 8x8, like samples
    stats = str(tmp_path / "real_stats.npz")
    inception = ["--features", "inception", "--inception_weights", str(inception_weights)]
    evaluate.main(["--reference", str(tmp_path / "real.npz"), "--save_stats", stats, *inception])
    generated = GeneratedImages(monkeypatch)
    callback_flags = fid_callback("features", "inception", "inception_weights", str(inception_weights),
                                  "reference_stats", stats, "num_samples", "4", "sampling.steps", "3",
                                  "every_n_validations", "2")  # fmt: skip
    cli = tiny_run(tmp_path / "runs", *callback_flags)
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, SampleQualityCallback))
    assert callback.quality.kid is None and "val/kid" not in cli.trainer.callback_metrics  # stats: no KID
    samples = generated.save_last(tmp_path / "samples.npz")
    offline = evaluate.main(["--samples", samples, "--reference", stats, "--metrics", "fid", *inception])
    assert offline["num_real"] == callback.last["num_real"] == 6 and offline["num_fake"] == 4
    assert offline["fid"] == pytest.approx(callback.last["fid"], rel=1e-6) and offline["fid"] > 0
    assert float(cli.trainer.callback_metrics["val/fid"]) == pytest.approx(offline["fid"], rel=1e-6)


def test_fid_callback_checks_its_reference_statistics(tmp_path):
    with pytest.raises(ValueError, match="kid=True needs the real images' features"):
        SampleQualityCallback(reference_stats="stats.npz", kid=True)
    with pytest.raises(ValueError, match="num_real picks real images"):
        SampleQualityCallback(reference_stats="stats.npz", num_real=100)
    assert SampleQualityCallback().kid and not SampleQualityCallback(reference_stats="stats.npz").kid
    # At setup, before any training: statistics of other features (3-d, where 1-channel pixels give 64-d).
    np.savez(tmp_path / "three_d.npz", mu=np.zeros(3), sigma=np.eye(3))
    callback = SampleQualityCallback(features="pixels", reference_stats=str(tmp_path / "three_d.npz"))
    model = SimpleNamespace(sample_shape=(1, 16, 16), schedule=SimpleNamespace(num_timesteps=1000))
    with pytest.raises(UserError, match="three_d.npz holds 3-d statistics but pixels features .* are 64-d"):
        callback.setup(SimpleNamespace(world_size=1), model, "fit")
