"""The quality benchmark's metrics (benchmarks/quality/metrics_lib.py) and an end-to-end --quick run of it."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import warm

from benchmarks.quality.metrics_lib import (
    classifier_scores,
    digits_split,
    frechet_distance,
    sliced_wasserstein,
    to_digit_features,
    train_digit_classifier,
)
from diffusion.generation.render import to_uint8_images

ROOT = Path(__file__).resolve().parents[2]


def test_frechet_distance_is_zero_for_identical_sets_and_matches_the_closed_form():
    x = np.random.default_rng(0).normal(size=(500, 4))
    assert frechet_distance(x, x) == pytest.approx(0.0, abs=1e-6)
    # Shifting the mean by d adds ||d||^2 and leaves the covariance term at zero.
    assert frechet_distance(x, x + np.array([1.0, 2.0, 0.0, 0.0])) == pytest.approx(5.0, abs=1e-6)
    # Independent 1-D Gaussians N(0, 1) and N(0, 4): (1 + 4 - 2 * 2) = 1 (up to sampling error).
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(100_000, 1)), 2 * rng.normal(size=(100_000, 1))
    assert frechet_distance(a, b) == pytest.approx(1.0, abs=0.05)


def test_real_digits_floor_and_noise_scale():
    reference, _, other, _ = digits_split()
    assert reference.shape == (898, 64) and other.shape == (899, 64) and reference.max() == 16
    floor = frechet_distance(other, reference)
    assert floor == pytest.approx(16.34, abs=0.1)
    noise = np.random.default_rng(1).uniform(0, 16, other.shape)
    assert frechet_distance(noise, reference) > 100 * floor


def test_digit_features_undo_the_data_modules_upscaling():
    _, _, other, _ = digits_split()
    images = other.reshape(-1, 8, 8)[:10] / 16 * 255  # 0..255 like to_uint8_images (before rounding)
    upscaled = images.repeat(2, axis=1).repeat(2, axis=2)[..., None]  # (N, 16, 16, 1), nearest-neighbour
    np.testing.assert_allclose(to_digit_features(upscaled), other[:10], atol=1e-9)
    with pytest.raises(ValueError, match="multiple of 8"):
        to_digit_features(np.zeros((2, 12, 12)))


def test_real_digits_through_the_sample_pipeline_keep_the_floor():
    """Real digits as a perfect model would emit them (16x16, model units, then uint8) score the floor."""
    reference, _, other, _ = digits_split()
    images = torch.from_numpy(other).float().view(-1, 1, 8, 8) / 16 * 2 - 1  # model units, [-1, 1]
    images = torch.nn.functional.interpolate(images, size=16, mode="nearest-exact")  # as ImageDataModule
    uint8 = to_uint8_images(images, {"shift": [0.5], "scale": [0.5]})  # what samples.npz holds
    assert uint8.shape == (899, 16, 16, 1) and uint8.dtype == np.uint8
    features = to_digit_features(uint8)
    assert np.abs(features - other).max() < 0.05  # uint8 rounding only
    assert frechet_distance(features, reference) == pytest.approx(
        frechet_distance(other, reference), abs=0.05
    )


def test_classifier_scores_separate_real_digits_from_noise():
    reference, labels, other, other_labels = digits_split()
    classifier = train_digit_classifier(reference, labels)
    assert (classifier.predict(other / 16) == other_labels).mean() > 0.95
    real_score, real_confidence = classifier_scores(classifier, other)
    noise_score, noise_confidence = classifier_scores(
        classifier, np.random.default_rng(0).uniform(0, 16, (899, 64))
    )
    assert real_score > 5 and real_confidence > 0.8  # confident and spread over ten classes
    assert noise_score < 2.5 and noise_confidence < 0.6
    one_class = other[other_labels == 3]
    assert classifier_scores(classifier, one_class)[0] < 1.5  # mode collapse scores near 1


def test_sliced_wasserstein_ranks_same_distribution_below_a_shifted_one():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2000, 2)), rng.normal(size=(2000, 2))
    same = sliced_wasserstein(x, y)
    shifted = sliced_wasserstein(x, y + np.array([0.5, 0.0]))
    assert same < 0.1 < shifted
    # A shift d along a random unit direction u moves every projection by d.u: mean |d.u| = 0.5 * 2/pi.
    assert sliced_wasserstein(x, x + np.array([0.5, 0.0]), num_projections=5000) == pytest.approx(
        0.5 * 2 / np.pi, rel=0.03
    )
    assert sliced_wasserstein(x, x) == 0.0
    with pytest.raises(ValueError, match="same shape"):
        sliced_wasserstein(x, y[:10])


@pytest.mark.slow
def test_quality_benchmark_quick_mode_runs_end_to_end(tmp_path):
    out = tmp_path / "quick"
    result = warm.run(
        [sys.executable, "benchmarks/quality/quality.py", "--quick", "--only", "toy2d", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| toy2d |" in result.stdout and "sliced W1" in result.stdout and "ddim-5" in result.stdout
    assert "toy2d training" in result.stdout  # the targets table
    assert (out / "quality.md").read_text().count("| toy2d |") == 2  # DDPM and DDIM rows
    assert (out / "toy2d_scatter.png").stat().st_size > 0
    assert list(out.glob("runs/toy2d/version_0/checkpoints/last.ckpt"))


# --- benchmarks/quality/vectors.py: scores of samples against the generating structure ----------------------------


def test_vector_scores_give_fresh_real_data_the_floor_and_catch_blur_and_missing_modes():
    from benchmarks.quality.vector_sets import distributions
    from benchmarks.quality.vectors import score, support_threshold

    for name, dist in distributions().items():
        threshold = support_threshold(dist, 20_000)
        reference, fresh = dist.sample(2000, seed=2)[0], dist.sample(2000, seed=3)[0]
        real = score(dist, fresh, reference, threshold)
        assert real.on_support == pytest.approx(0.99, abs=0.01), name  # the threshold is the 99% quantile
        assert real.covered == dist.num_modes, name
        assert real.sliced_w1 < 0.2 * np.abs(reference).mean(), name  # two real sets are close
    # A ring drawn 3x too thick (radial std 0.06 instead of 0.02) mostly leaves the support.
    rings = distributions()["thin_rings"]
    threshold = support_threshold(rings, 20_000)
    reference, fresh = rings.sample(2000, seed=2)[0], rings.sample(2000, seed=3)[0]
    radius = np.linalg.norm(fresh, axis=1, keepdims=True)
    blurred = fresh * (1 + 0.06 * np.random.default_rng(0).standard_normal((2000, 1)) / radius)  # 3x std
    assert score(rings, blurred, reference, threshold).on_support < 0.7
    # Mirror the lower half up: every ring is drawn, but only its upper 4 of 8 arcs hold samples.
    upper_half = fresh * np.where(fresh[:, 1:] < 0, [1.0, -1.0], [1.0, 1.0])
    assert score(rings, upper_half, reference, threshold).covered == 12


@pytest.mark.slow
def test_vector_benchmark_quick_mode_runs_end_to_end(tmp_path):
    result = warm.run(
        [sys.executable, "benchmarks/quality/vectors.py", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = (tmp_path / "vectors.md").read_text()
    for name in ("ring_clusters", "mixture_16d"):
        assert table.count(f"| {name} |") == 2  # DDPM and DDIM rows
        assert list(tmp_path.glob(f"runs/vectors_{name}/version_0/checkpoints/last.ckpt"))
        assert (tmp_path / "runs" / "data" / f"{name}.npy").is_file()
    assert "| 16 | 10 |" in table and "QUICK MODE" in table


def test_a_new_quality_table_keeps_the_run_before_it_and_only_that_one(tmp_path):
    from benchmarks.quality.train_run import EARLIER, earlier_run

    table = tmp_path / "quality.md"
    assert earlier_run(table, quick=False) == ""  # the first run: nothing before it
    table.write_text("## Sample quality (first)\n\n| a |\n")
    second = "## Sample quality (second)\n\n| b |\n" + earlier_run(table, quick=False)
    assert second.endswith(EARLIER + "### Sample quality (first)\n\n| a |\n")
    table.write_text(second)
    third = earlier_run(table, quick=False)
    assert "second" in third and "first" not in third  # one run back, not the whole history
    assert earlier_run(table, quick=True) == ""
    table.write_text("## Sample quality (x) QUICK MODE (tiny networks, 20 steps)\n")
    assert earlier_run(table, quick=False) == ""  # a quick run's numbers are not kept
