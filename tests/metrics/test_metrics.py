"""FID/KID: pixel features, the digits floor, the evaluate CLI and SampleQualityCallback in real (and DDP) fits.

Nothing here downloads: the Inception extractor is checked against torch-fidelity's own with random weights
saved to a local file; every FID value uses the project's offline pixel features.
"""

import math
import re
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.linalg
import torch
from helpers import QUICK, TINY_UNET, VALIDATING_EVERY_2, tiny_run, warm
from sklearn.datasets import load_digits

from diffusion.cli import evaluate as evaluate_cli
from diffusion.core.sampling import SamplingOptions
from diffusion.data.images import ImageDataModule
from diffusion.errors import UserError
from diffusion.generation.render import to_uint8_images
from diffusion.metrics.features import InceptionFeatures, PixelFeatures
from diffusion.metrics.sample_quality import SampleQuality, feed_images
from diffusion.training.callbacks import SampleQualityCallback

REPO = Path(__file__).parents[2]
FID_FLAGS = [
    "--trainer.callbacks+=diffusion.training.callbacks.SampleQualityCallback",
    "--trainer.callbacks.init_args.features", "pixels",
    "--trainer.callbacks.init_args.num_samples", "16",
    "--trainer.callbacks.init_args.sampling.steps", "3",
    "--trainer.callbacks.init_args.kid_subset_size", "8",
    "--checkpoint.monitor", "val/fid",
    "--checkpoint.mode", "min",
]  # fmt: skip


def scipy_fd(a: np.ndarray, b: np.ndarray) -> float:
    """The Fréchet distance as the digits benchmark computes it (scipy's sqrtm), for float (N, D) features."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    with warnings.catch_warnings():  # the digits' always-blank border pixels make the covariances singular
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        covmean = scipy.linalg.sqrtm(cov_a @ cov_b).real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * covmean))


def pixel_scores(real: torch.Tensor, fake: torch.Tensor) -> dict[str, float]:
    quality = SampleQuality("pixels", ["fid", "kid"], channels=real.shape[1], kid_subset_size=50)
    quality.update(real, real=True)
    quality.update(fake, real=False)
    return quality.compute()


@pytest.fixture(scope="module")
def digit_halves() -> tuple[torch.Tensor, torch.Tensor]:
    """The digits as the training pipeline yields them (8x8 in [-1, 1]) turned into uint8 (N, 1, 8, 8),
    split as the issue does: default_rng(0).permutation(1797), first 898 against the other 899."""
    data = ImageDataModule("digits", val_fraction=0.0)
    data.setup("fit")
    images = torch.stack([data.train_set[i][0] for i in range(len(data.train_set))])
    uint8 = torch.from_numpy(to_uint8_images(images, data.normalization)).permute(0, 3, 1, 2)
    perm = torch.from_numpy(np.random.default_rng(0).permutation(len(uint8)))
    return uint8[perm[:898]], uint8[perm[898:]]


def test_pixel_features_golden_values():
    features = PixelFeatures(size=8, channels=3)
    constant = torch.full((2, 3, 16, 12), 51, dtype=torch.uint8)  # 51 / 255 * 16 = 3.2
    out = features(constant).pool
    assert out.shape == (2, 3 * 8 * 8) and out.dtype == torch.float32 and features.num_features == 192
    torch.testing.assert_close(out, torch.full((2, 192), 3.2))
    # Floats are read as 0..1 (what torchmetrics passes along with normalize=True).
    torch.testing.assert_close(features(torch.full((1, 3, 8, 8), 0.25)).pool, torch.full((1, 192), 4.0))
    assert features(constant).logits is None  # no classifier: no Inception Score
    # Area averaging: a 16x16 image, white left half, pools to 8x8 with 16 in the left 4 columns.
    half = torch.zeros(1, 1, 16, 16, dtype=torch.uint8)
    half[..., :8] = 255
    expected = torch.zeros(8, 8)
    expected[:, :4] = 16
    torch.testing.assert_close(PixelFeatures(channels=1)(half).pool, expected.flatten()[None])
    with pytest.raises(ValueError, match=r"channels=3.*got shape \(1, 1, 8, 8\)"):
        features(torch.zeros(1, 1, 8, 8, dtype=torch.uint8))


def test_fd_is_zero_for_a_set_against_itself_and_positive_between_distributions():
    generator = torch.Generator().manual_seed(0)
    dark = torch.randint(0, 128, (200, 1, 8, 8), generator=generator, dtype=torch.uint8)
    bright = torch.randint(96, 256, (200, 1, 8, 8), generator=generator, dtype=torch.uint8)
    same = pixel_scores(dark, dark)
    assert abs(same["fid"]) < 1e-2 and same["num_real"] == same["num_fake"] == 200
    different = pixel_scores(dark, bright)
    assert different["fid"] > 100 * max(abs(same["fid"]), 1e-3)
    assert different["kid_mean"] > 0


def test_fd_of_two_halves_of_the_digits_is_the_benchmark_floor(digit_halves):
    # The floor, on the raw 0..16 pixels with scipy: 16.34.
    x = load_digits().data
    perm = np.random.default_rng(0).permutation(len(x))
    floor = scipy_fd(x[perm[:898]], x[perm[898:]])
    assert floor == pytest.approx(16.343, abs=1e-3)
    # torchmetrics on the same exact pixels (floats in 0..1 -> value * 16) agrees to float precision.
    raw = torch.from_numpy(load_digits().images).float().div(16).unsqueeze(1)
    assert pixel_scores(raw[perm[:898]], raw[perm[898:]])["fid"] == pytest.approx(floor, rel=1e-4)
    # Through the training pipeline (uint8: what the callback and the samples file score), only uint8 rounding
    # (<= 16/510 per pixel) remains: 16.31.
    scores = pixel_scores(*digit_halves)
    assert scores["fid"] == pytest.approx(floor, abs=0.1)
    assert scores["num_real"] == 898 and scores["num_fake"] == 899


def test_sample_quality_and_callback_reject_bad_options():
    with pytest.raises(ValueError, match="'clip'.*inception.*pixels"):
        SampleQuality("clip")
    with pytest.raises(ValueError, match="kid_subset_size=1"):
        SampleQuality("pixels", kid_subset_size=1)
    with pytest.raises(ValueError, match=r"unknown metrics \['fd'\]"):
        SampleQuality("pixels", ["fd"])
    with pytest.raises(ValueError, match="'fancy'"):
        SampleQualityCallback(features="fancy")
    with pytest.raises(ValueError, match="num_samples=1"):
        SampleQualityCallback(num_samples=1)
    vector_model = SimpleNamespace(sample_shape=(2,))
    with pytest.raises(ValueError, match=r"needs image data.*\(2,\)"):
        SampleQualityCallback(features="pixels").setup(SimpleNamespace(world_size=1), vector_model, "fit")
    image_model = SimpleNamespace(sample_shape=(3, 8, 8), schedule=SimpleNamespace(num_timesteps=1000))
    with pytest.raises(ValueError, match="^sampling.steps 5000 is more steps than .*=1000"):
        SampleQualityCallback(features="pixels", sampling=SamplingOptions(steps=5000)).setup(
            SimpleNamespace(world_size=1), image_model, "fit"
        )
    fid_only = SampleQualityCallback(features="pixels", kid=False)
    fid_only.setup(SimpleNamespace(world_size=1), image_model, "fit")
    assert fid_only.quality.reported == ("fid",) and fid_only.quality.kid is None
    assert fid_only.quality.extractor.num_features == 3 * 64


@pytest.mark.slow  # one full InceptionV3 pass each for ours and torch-fidelity's
def test_inception_features_are_torch_fidelitys_fid_extractor(inception_weights):
    """Same weights file, same uint8 images: our extractor feeds the network exactly the tensor that
    torch-fidelity's FeatureExtractorInceptionV3 feeds it (TF1 resize to 299, (x - 128) / 128) and returns
    exactly its 2048-d features; torchmetrics' default (antialiased resize) would differ."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
    from torchmetrics.image.fid import NoTrainInceptionV3

    ours = InceptionFeatures(str(inception_weights))
    theirs = FeatureExtractorInceptionV3(
        "inception-v3-compat", ["2048"], feature_extractor_weights_path=str(inception_weights)
    )
    antialiased = NoTrainInceptionV3("inception-v3-compat", ["2048"], str(inception_weights), antialias=True)
    seen, stop = {}, {"ours": False, "theirs": False, "antialiased": True}

    class Seen(Exception):  # ends a forward pass once the first convolution's input is recorded
        pass

    def record(name):
        def hook(module, args):
            seen[name] = args[0]
            if stop[name]:
                raise Seen

        return hook

    for name, network in [("ours", ours.network), ("theirs", theirs), ("antialiased", antialiased)]:
        network.Conv2d_1a_3x3.register_forward_pre_hook(record(name))
    generator = torch.Generator().manual_seed(0)
    rgb = torch.randint(0, 256, (1, 3, 32, 32), generator=generator, dtype=torch.uint8)
    gray = torch.randint(0, 256, (1, 1, 16, 16), generator=generator, dtype=torch.uint8)
    # The whole network once (11 s on a busy 2-core CPU): the same features, bit for bit.
    features = ours(rgb).pool
    assert features.shape == (1, 2048) and features.dtype == torch.float32
    assert torch.equal(features, theirs(rgb)[0]) and features.std() > 0.01 * features.abs().mean()
    assert seen["ours"].shape == (1, 3, 299, 299) and torch.equal(seen["ours"], seen["theirs"])
    # What the network sees, for RGB and grayscale (torch-fidelity reads gray files as RGB, repeated).
    stop.update(ours=True, theirs=True)
    for images, as_rgb in [(rgb, rgb), (gray, gray.repeat(1, 3, 1, 1))]:
        for network, x in [(ours, images), (theirs, as_rgb), (antialiased, as_rgb)]:
            with pytest.raises(Seen):
                network(x)
        assert torch.equal(seen["ours"], seen["theirs"])
        assert (seen["antialiased"] - seen["theirs"]).abs().max() > 0.1  # the issue's ~35/255 per pixel
    # In the metrics, the network stays in eval mode (batch norm on its stored statistics) through train().
    quality = SampleQuality("inception", channels=1, inception_weights=str(inception_weights))
    quality.train()
    assert quality.extractor.training and not quality.extractor.network.training
    with pytest.raises(ValueError, match="uint8.*got torch.float32"):
        ours(gray.float() / 255)


def test_inception_features_explain_a_failed_download(monkeypatch):
    import torch_fidelity.feature_extractor_inceptionv3 as fidelity

    def offline(*args, **kwargs):
        raise OSError("<urlopen error [Errno -2] Name or service not known>")

    monkeypatch.setattr(fidelity, "load_state_dict_from_url", offline)
    # a placeholder each: said as inception_weights here, as --inception_weights by evaluate (test_evaluate_modes)
    match = r"downloaded from GitHub on first use — offline, pass inception_weights PATH \(a local copy\), or features pixels$"
    with pytest.raises(UserError, match=match):
        InceptionFeatures()


def test_kid_subsets_of_1000_by_default_capped_at_the_image_counts(digit_halves):
    assert SampleQuality("pixels", channels=1).kid.subset_size == 1000
    assert SampleQualityCallback().kid_subset_size == 1000
    assert (
        evaluate_cli.build_parser()
        .parse_args(["--samples", "a.npz", "--reference", "digits"])
        .kid_subset_size
        == 1000
    )
    first, second = (half.permute(0, 2, 3, 1).numpy() for half in digit_halves)
    quality = SampleQuality("pixels", channels=1)
    feed_images(quality, second, real=True)
    feed_images(quality, first[:300], real=False)
    result = quality.compute()  # 300 < 1000: capped, no error
    assert math.isfinite(result["kid_mean"]) and result["num_fake"] == 300


def test_fid_callback_takes_real_images_without_random_flips():
    flipping = ImageDataModule("digits", random_flip=True)
    plain = ImageDataModule("digits", random_flip=False)
    flipping.setup("fit")
    plain.setup("fit")
    unaugmented = flipping.unaugmented_train_set()
    assert len(unaugmented) == len(plain.train_set) == len(flipping.train_set)
    for i in range(0, len(unaugmented), 97):
        item = unaugmented[i]
        assert torch.equal(item.x, plain.train_set[i].x) and item.index == plain.train_set[i].index
    torch.manual_seed(0)  # the training set itself flips about half of its images
    assert any(not torch.equal(flipping.train_set[i][0], plain.train_set[i][0]) for i in range(20))

    callback = SampleQualityCallback(num_samples=64, features="pixels", kid=False)
    trainer = SimpleNamespace(world_size=1, datamodule=flipping)
    module = SimpleNamespace(sample_shape=(1, 16, 16), global_rank=0, device=torch.device("cpu"),
                             normalization=flipping.normalization,
                             schedule=SimpleNamespace(num_timesteps=1000))  # fmt: skip
    callback.setup(trainer, module, "fit")
    callback._feed_real(trainer, module)
    chosen = torch.randperm(len(plain.train_set), generator=torch.Generator().manual_seed(0))[:64]
    images = torch.stack([plain.train_set[i][0] for i in chosen.tolist()])
    uint8 = torch.from_numpy(to_uint8_images(images, plain.normalization)).permute(0, 3, 1, 2)
    expected = PixelFeatures(channels=1)(uint8).pool.double().sum(0)
    torch.testing.assert_close(callback.quality.fid.real_features_sum, expected)


def test_evaluate_cli_on_npz_files_and_a_dataset_name(tmp_path, digit_halves, capsys):
    first, second = (tmp_path / "first.npz", tmp_path / "second.npz")
    np.savez(first, digit_halves[0].permute(0, 2, 3, 1).numpy())
    np.savez(second, digit_halves[1].permute(0, 2, 3, 1).numpy())
    result = evaluate_cli.main(["--samples", str(first), "--reference", str(second), "--features", "pixels"])
    assert result["fid"] == pytest.approx(16.31, abs=0.05) and math.isfinite(result["kid_mean"])
    out = capsys.readouterr().out
    assert "FD of pixels (not an FID): 16.3" in out and "FID:" not in out  # a pixel FD is never called FID
    assert "covariance is singular" not in out  # about 900 images each for 64-d features: enough for them
    # two halves of one data set: a KID about 0, whose unbiased estimate may fall below it, then said so
    assert ("note: KID is below 0" in out) == (result["kid_mean"] < 0)
    few = tmp_path / "few.npz"
    np.savez(few, digit_halves[0][:40].permute(0, 2, 3, 1).numpy())
    evaluate_cli.main(["--samples", str(few), "--reference", str(second), "--features", "pixels"])
    assert "note: 40 images for 64-d features: their covariance is singular" in capsys.readouterr().out
    # A dataset name: the whole digits train split (1797 images) rendered at the samples' 16x16.
    result = evaluate_cli.main(["--samples", str(first), "--reference", "digits", "--features", "pixels"])
    assert result["num_real"] == 1797 and 0 < result["fid"] < 16.31
    # Pixel features pool both sets to 8x8, so the original 8x8 digits are a valid reference for 16x16 samples.
    originals = tmp_path / "originals.npz"
    np.savez(originals, load_digits().images.astype(np.uint8)[..., None])  # 0..16 as uint8: a darker set
    result = evaluate_cli.main(
        [
            "--samples",
            str(first),
            "--reference",
            str(originals),
            "--features",
            "pixels",
            "--num_reference",
            "500",
        ]
    )
    assert result["num_real"] == 500 and result["fid"] > 100


@pytest.mark.parametrize(
    ("arrays", "reference", "message"),
    [
        (None, "second", "--samples .*samples.npz does not exist"),
        ({"images": np.zeros((4, 8, 8, 1)), "labels": np.zeros(4)}, "second", "'images'.*no arr_0"),
        ({"arr_0": np.zeros((4, 8, 8, 1), np.float32)}, "second", "dtype float32.*uint8"),
        ({"arr_0": np.zeros((4, 2), np.uint8)}, "second", r"shape \(4, 2\).*\(N, H, W, C\)"),
        ({"arr_0": np.zeros((4, 8, 8, 1), np.uint8)}, "second", "samples are 8x8 but the reference is 16x16"),
        ({"arr_0": np.zeros((4, 16, 16, 3), np.uint8)}, "second", "3 channel.*reference has 1"),
        ({"arr_0": np.zeros((4, 16, 16, 1), np.uint8)}, "imagenet", "'imagenet' is neither.*digits"),
    ],
)
def test_evaluate_cli_errors_say_what_is_wrong(tmp_path, arrays, reference, message, capsys):
    samples = tmp_path / "samples.npz"
    if arrays is not None:
        np.savez(samples, **arrays)
    second = tmp_path / "second.npz"
    np.savez(second, np.zeros((4, 16, 16, 1), np.uint8))
    reference = str(second) if reference == "second" else reference
    with pytest.raises(SystemExit) as exit_info:
        evaluate_cli.main(["--samples", str(samples), "--reference", reference])  # inception: never built
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_fid_callback_logs_val_fid_and_a_checkpoint_keeps_the_best(tmp_path):
    cli = tiny_run(tmp_path, *FID_FLAGS)
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, SampleQualityCallback))
    fid = cli.trainer.callback_metrics["val/fid"]
    assert math.isfinite(float(fid)) and "val/kid" in cli.trainer.callback_metrics
    assert callback.last["num_fake"] == 16 and callback.last["num_real"] == 16
    assert callback.last["fid"] == pytest.approx(float(fid))
    checkpoint = cli.trainer.checkpoint_callback
    assert checkpoint.monitor == "val/fid" and Path(checkpoint.best_model_path).is_file()
    assert "step=" in Path(checkpoint.best_model_path).name and math.isfinite(
        float(checkpoint.best_model_score)
    )


@pytest.mark.multiprocess
def test_fid_callback_under_two_ddp_processes_feeds_each_image_once(tmp_path):
    # 15 samples over 2 ranks (8 + 7): the logged counts are those of the metric states gathered over ranks.
    flags = [f if f != "16" else "15" for f in FID_FLAGS]
    cmd = [sys.executable, str(REPO / "train.py"), "--devices", "2", "--strategy", "ddp", "--accelerator", "cpu",
           *TINY_UNET, *QUICK, *VALIDATING_EVERY_2, *flags, "--trainer.logger.init_args.save_dir", str(tmp_path)]  # fmt: skip
    result = warm.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, ranks=2)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    lines = re.findall(
        r"step (\d+): FD of pixels \(not an FID\) (\S+) from (\d+) generated and (\d+) real", output
    )
    assert [(step, fake, real) for step, _, fake, real in lines] == [("2", "15", "15"), ("4", "15", "15")]
    assert all(math.isfinite(float(value)) for _, value, _, _ in lines)
    assert list((tmp_path / "digits" / "version_0" / "checkpoints").glob("step=*.ckpt"))
