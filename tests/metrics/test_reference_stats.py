"""FID statistics files (mu, sigma: pytorch-fid's format): written once by `evaluate --save_stats`, read back as
a reference that gives the FID of the images it was made from; the Fréchet distance formula; progress bars."""

import io
import re
import sys

import numpy as np
import pytest
import scipy.linalg
import torch
from sklearn.datasets import load_digits

from diffusion.cli import evaluate
from diffusion.errors import DiskFull
from diffusion.metrics import reference_stats
from diffusion.metrics.fid import frechet_distance
from diffusion.metrics.reference_stats import FeatureStatistics, load_statistics, save_statistics


@pytest.fixture(scope="module")
def digit_files(tmp_path_factory):
    """Two halves of the digits as 16x16 uint8 images (each 8x8 pixel repeated 2x2, so that pixel features,
    which average 2x2 blocks, give back the 8x8 originals in 0..16), and those 8x8 features."""
    folder = tmp_path_factory.mktemp("digits")
    small = (load_digits().images * (255 / 16)).round().astype(np.uint8)  # (1797, 8, 8)
    images = np.kron(small, np.ones((1, 2, 2), np.uint8))[..., None]  # (1797, 16, 16, 1)
    perm = np.random.default_rng(0).permutation(len(images))
    np.savez(folder / "samples.npz", images[perm[:400]])
    np.savez(folder / "reference.npz", images[perm[400:]])
    features = small[perm[400:]].reshape(-1, 64).astype(np.float64) * (16 / 255)
    return folder, features


def test_frechet_distance_is_the_scipy_formula():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 30, 20))
    mu1, mu2 = rng.normal(size=(2, 20))
    sigma1, sigma2 = a.T @ a / 30, b.T @ b / 30 + 0.1 * np.eye(20)
    expected = ((mu1 - mu2) ** 2).sum() + np.trace(
        sigma1 + sigma2 - 2 * scipy.linalg.sqrtm(sigma1 @ sigma2).real
    )
    got = frechet_distance(*(torch.from_numpy(x) for x in (mu1, sigma1, mu2, sigma2)))
    assert float(got) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("argument", "value", "expected"),
    [
        ("mu1", torch.tensor([float("nan"), 0.0, 0.0]), r"^mu1 holds values that are not finite \(NaN or infinity\) — "),
        ("sigma2", torch.eye(3).index_fill(0, torch.tensor([1]), float("inf")), r"^sigma2 holds values that are not "),
        ("sigma1", -torch.eye(3), r"^sigma1 is not a covariance: it has a negative eigenvalue \(-1\), not positive "
                                  r"semi-definite — pass sigma1 as a covariance: symmetric and positive semi-definite"),
        ("sigma2", torch.diag(torch.tensor([1.0, 1.0, -1e-3])), r"^sigma2 is not a covariance: .*\(-0.001\)"),
        ("sigma1", torch.tensor([[1.0, 0.5, 0], [0, 1, 0], [0, 0, 1]]), r"^sigma1 is not symmetric \(entries differ "
                                                                        r"from their mirror by up to 0.5\) — "),
    ],
)  # fmt: skip
def test_statistics_that_are_not_finite_or_not_a_covariance_are_refused_by_their_name(
    argument, value, expected
):
    # A NaN mean gave NaN, and sigma1 = -I against I gave 0.0: a perfect score.
    statistics = {
        "mu1": torch.zeros(3),
        "sigma1": torch.eye(3),
        "mu2": torch.zeros(3),
        "sigma2": torch.eye(3),
    }
    with pytest.raises(ValueError, match=expected):
        frechet_distance(**{**statistics, argument: value})


@pytest.mark.parametrize(
    ("sigma", "expected"),
    [
        (
            -np.eye(4),
            "sigma is not a covariance: it has a negative eigenvalue (-1), not positive semi-definite",
        ),
        (np.triu(np.ones((4, 4))), "sigma is not symmetric (entries differ from their mirror by up to 1)"),
    ],
)
def test_a_statistics_file_whose_sigma_is_no_covariance_is_refused_naming_it(sigma, expected, tmp_path):
    """Round 19b's Q2: an edited or foreign file was read, and SampleQuality and evaluate gave an FID against it."""
    path = tmp_path / "edited.npz"
    np.savez(path, mu=np.zeros(4), sigma=sigma)
    with pytest.raises(ValueError) as refused:
        load_statistics(path)
    assert str(refused.value).startswith(f"{path}: {expected} — write one with python -m diffusion.evaluate ")
    with pytest.raises(ValueError, match=re.escape(expected)):
        FeatureStatistics(np.zeros(4), sigma)


def test_covariances_singular_or_rounded_to_float32_are_taken():
    # Fewer features than dimensions, and a constant one (blank pixels): eigenvalues of 0 that rounding puts a
    # hair below it; the same matrices stored as float32. Both are covariances.
    features = torch.rand(50, 200, dtype=torch.float64)
    features[:, :20] = 0.7
    sigma, mu = torch.cov(features.T), features.mean(0)
    assert float(torch.linalg.eigvalsh(sigma)[0]) < 0  # rounding's negative eigenvalue, which is taken
    for stored in (sigma, sigma.float()):
        assert float(frechet_distance(mu, stored, mu, stored)) == pytest.approx(0.0, abs=1e-3)
    assert float(frechet_distance(torch.zeros(2), torch.zeros(2, 2), torch.ones(2), torch.zeros(2, 2))) == 2.0


def test_saved_statistics_give_the_fid_of_the_images_they_were_made_from(digit_files, tmp_path, capsys):
    folder, features = digit_files
    stats = tmp_path / "reference_stats.npz"
    pixels = ["--features", "pixels"]
    result = evaluate.main(
        ["--reference", str(folder / "reference.npz"), "--save_stats", str(stats), *pixels]
    )
    assert result == {"num_real": 1397} and f"wrote the FID statistics of {folder}" in capsys.readouterr().out
    # pytorch-fid's format: mu and sigma of the pool features (sigma unbiased, as np.cov), computed here apart
    # (to float32 precision: the features are float32, their sums float64).
    with np.load(stats) as saved:
        np.testing.assert_allclose(saved["mu"], features.mean(0), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(saved["sigma"], np.cov(features, rowvar=False), rtol=1e-5, atol=1e-6)
        assert str(saved["features"]) == "pixels" and int(saved["num_images"]) == 1397
    samples = ["--samples", str(folder / "samples.npz"), *pixels]
    from_images = evaluate.main([*samples, "--reference", str(folder / "reference.npz")])
    capsys.readouterr()
    from_stats = evaluate.main([*samples, "--reference", str(stats)])
    assert from_stats["fid"] == pytest.approx(from_images["fid"], rel=1e-9) and from_images["fid"] > 1
    assert from_stats["num_real"] == 1397 and "kid_mean" not in from_stats and "is_mean" not in from_stats
    out = capsys.readouterr().out
    assert "reference: " + str(stats) + " (FID statistics of 1397 images)" in out
    assert "KID: not computed — " in out and "needs the reference images' features" in out
    assert "IS:  not computed — the Inception Score needs Inception features" in out
    # Written once: a second --save_stats stops before any work unless told to --overwrite.
    with pytest.raises(SystemExit):
        evaluate.main(["--reference", str(folder / "samples.npz"), "--save_stats", str(stats), *pixels])
    assert "exists — pass --overwrite" in capsys.readouterr().err
    evaluate.main(
        ["--reference", str(folder / "samples.npz"), "--save_stats", str(stats), "--overwrite", *pixels]
    )
    assert load_statistics(stats).num_images == 400


def test_a_statistics_file_of_pytorch_fid_is_a_reference(digit_files, tmp_path):
    folder, features = digit_files
    foreign = tmp_path / "fid_stats.npz"  # only mu and sigma, float32: what pytorch-fid --save-stats writes
    mu, sigma = features.mean(0), np.cov(features, rowvar=False)
    np.savez(foreign, mu=mu.astype(np.float32), sigma=sigma.astype(np.float32))
    result = evaluate.main(["--samples", str(folder / "samples.npz"), "--reference", str(foreign),
                            "--features", "pixels", "--metrics", "fid"])  # fmt: skip
    exact = evaluate.main(["--samples", str(folder / "samples.npz"), "--reference", str(folder / "reference.npz"),
                           "--features", "pixels", "--metrics", "fid"])  # fmt: skip
    assert "num_real" not in result and result["fid"] == pytest.approx(exact["fid"], rel=1e-5)


def test_a_failed_write_leaves_the_previous_statistics_file(tmp_path, monkeypatch):
    path = tmp_path / "stats.npz"
    old = FeatureStatistics(np.zeros(3), np.eye(3), "pixels", 10)
    save_statistics(path, old)
    before = path.read_bytes()

    def disk_full(file, **arrays):
        file.write(b"PK\x03\x04 half an archive")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(reference_stats.np, "savez", disk_full)
    with pytest.raises(
        DiskFull, match=r"no space left on the disk of .* while saving stats.npz — free space"
    ):
        save_statistics(path, FeatureStatistics(np.ones(3), 2 * np.eye(3)))
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["stats.npz"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_show_on_a_terminal_only(digit_files, monkeypatch, capsys):
    folder, _ = digit_files
    args = ["--samples", str(folder / "samples.npz"), "--reference", str(folder / "reference.npz"),
            "--features", "pixels", "--batch_size", "100"]  # fmt: skip
    evaluate.main(args)
    assert capsys.readouterr().err == ""  # not a terminal (a log, a pipe, CI): no bar
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    evaluate.main(args)
    shown = terminal.getvalue()
    assert "pixels features of the reference" in shown and "1397/1397" in shown
    assert "pixels features of the samples" in shown and "400/400" in shown
