"""FID and KID of two fixed feature sets are torchmetrics' numbers: `SampleQuality` fed the features (its extractor
replaced by one that passes them on, so nothing but the metrics runs) against torchmetrics' own
FrechetInceptionDistance and KernelInceptionDistance fed the same features through their update and compute, and
against torchmetrics.image's functional pieces (`_compute_fid` on the sets' mean and covariance, `poly_mmd` on
the subsets KID draws). The Fréchet formula against scipy's is tests/metrics/test_reference_stats.py's; FID and KID
through real images, the pixel features and the CLI are tests/metrics/test_metrics.py's.
"""

import pytest
import torch
from helpers.tiny_sampler import _one_thread  # noqa: F401 (autouse: small tensors, threads only wait)
from torch import nn
from torchmetrics.image.fid import FrechetInceptionDistance, _compute_fid
from torchmetrics.image.kid import KernelInceptionDistance, poly_mmd

from diffusion.metrics.sample_quality import SampleQuality

D = 64  # the pixel features' size for 1 channel: the extractor replaced below has the size SampleQuality made


class GivenFeatures(nn.Module):
    """An 'extractor' whose input is already the features: for torchmetrics (which reads `num_features`) and, as
    (pool, logits), for `SampleQuality`."""

    def __init__(self, pairs: bool = False) -> None:
        super().__init__()
        self.num_features, self.pairs = D, pairs

    def forward(self, features: torch.Tensor):
        return (features, None) if self.pairs else features


def feature_sets(num_real: int, num_fake: int, singular: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 (N, D) features, seeded: real and generated sets of different means and correlations. `singular`:
    a quarter of the features constant (blank pixels) in both, and fewer generated samples than features."""
    generator = torch.Generator().manual_seed(0)
    mix_real, mix_fake = (torch.randn(D, D, generator=generator) / D**0.5 for _ in range(2))
    real = torch.randn(num_real, D, generator=generator) @ mix_real + 1.0
    fake = torch.randn(num_fake, D, generator=generator) @ (mix_real + 0.3 * mix_fake) + 1.2
    if singular:
        real[:, : D // 4], fake[:, : D // 4] = 0.5, 0.5
    return real, fake


def fed(metric, real: torch.Tensor, fake: torch.Tensor, batch: int):
    """`metric` updated with both sets in batches of `batch` (update(features, real=...))."""
    for features, is_real in ((real, True), (fake, False)):
        for part in features.split(batch):
            metric.update(part, real=is_real)
    return metric


def project_quality(metrics: tuple[str, ...], **kwargs) -> SampleQuality:
    quality = SampleQuality("pixels", metrics, channels=1, **kwargs)
    assert quality.extractor.num_features == D
    quality.extractor = GivenFeatures(pairs=True)
    quality._check_images = lambda features: None  # features fed where images go: not pixels to check
    return quality


@pytest.mark.parametrize(("num_real", "num_fake", "singular"), [(300, 200, False), (300, 40, True)],
                         ids=["full_rank", "singular"])  # fmt: skip
def test_fid_of_fixed_features_is_torchmetrics_fid(num_real, num_fake, singular):
    real, fake = feature_sets(num_real, num_fake, singular)
    ours = fed(project_quality(("fid",)), real, fake, batch=64).compute()
    assert ours["num_real"] == num_real and ours["num_fake"] == num_fake
    # torchmetrics' metric, fed in other batches: its states (float64 sums) and its compute, returned in float32
    # (measured 2.8e-8 relative).
    theirs = fed(FrechetInceptionDistance(feature=GivenFeatures()), real, fake, batch=50).compute()
    assert theirs.dtype == torch.float32 and ours["fid"] == pytest.approx(float(theirs), rel=1e-6)
    # The formula on the sets' own float64 mean and covariance (torch.cov: centred, not from sums). The two
    # covariances differ by float64 rounding, which the square roots of a singular product's ~0 eigenvalues
    # raise to ~1e-8 (measured 2.8e-9 relative; 9e-12 at full rank).
    real64, fake64 = real.double(), fake.double()
    formula = _compute_fid(real64.mean(0), torch.cov(real64.T), fake64.mean(0), torch.cov(fake64.T))
    assert ours["fid"] == pytest.approx(formula.item(), rel=1e-7)
    assert ours["fid"] > 1  # sets that differ: every term counts


def test_fid_against_a_statistics_file_is_torchmetrics_fid_of_the_real_features():
    """The real side as `evaluate --save_stats` keeps it (mean and covariance), not the features."""
    real, fake = feature_sets(300, 200)
    statistics = fed(project_quality(("fid",)), real, fake[:2], batch=64).real_statistics()
    against_file = project_quality(("fid",), reference=statistics)
    for part in fake.split(64):
        against_file.update(part, real=False)
    theirs = fed(FrechetInceptionDistance(feature=GivenFeatures()), real, fake, batch=50).compute()
    assert against_file.compute()["fid"] == pytest.approx(float(theirs), rel=1e-6)


def kid_by_formula(real: torch.Tensor, fake: torch.Tensor, subsets: int, subset_size: int, seed: int):
    """torchmetrics' KID: `subsets` times a random subset of each set (randperm, real then fake, under `seed`) and the
    unbiased MMD of the cubic polynomial kernel (`poly_mmd`); their mean and (biased) standard deviation."""
    scores = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(subsets):
            real_subset = real[torch.randperm(len(real))[:subset_size]]
            fake_subset = fake[torch.randperm(len(fake))[:subset_size]]
            scores.append(poly_mmd(real_subset, fake_subset))
    scores = torch.stack(scores)
    return scores.mean().item(), scores.std(unbiased=False).item()


@pytest.mark.filterwarnings("ignore:.*will save all extracted features")  # torchmetrics' KID, built here
@pytest.mark.parametrize(
    ("subset_size", "used"), [(50, 50), (1000, 200)], ids=["subsets_of_50", "capped_at_200"]
)
def test_kid_of_fixed_features_is_torchmetrics_kid(subset_size, used):
    """KID's subsets come from the RNG under `compute(seed=...)`: replaying them gives torchmetrics' numbers, and the
    subset size is capped at the smaller set (1000 > 200 generated)."""
    real, fake = feature_sets(300, 200)

    def our_kid(seed: int) -> dict[str, float]:
        quality = project_quality(("kid",), kid_subset_size=subset_size, kid_subsets=20)
        return fed(quality, real, fake, batch=64).compute(seed=seed)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)  # a state the subsets' seed would not leave
        state = torch.get_rng_state()
        ours = our_kid(seed=7)
        assert torch.equal(torch.get_rng_state(), state)  # training's randomness untouched
    mean, std = kid_by_formula(real, fake, subsets=20, subset_size=used, seed=7)
    assert (ours["kid_mean"], ours["kid_std"]) == pytest.approx((mean, std), rel=1e-6)  # measured equal
    assert mean > 2 * std > 0  # sets that differ, subsets that differ
    theirs = KernelInceptionDistance(feature=GivenFeatures(), subsets=20, subset_size=used)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        their_mean, their_std = fed(theirs, real, fake, batch=50).compute()
    assert (ours["kid_mean"], ours["kid_std"]) == pytest.approx(
        (their_mean.item(), their_std.item()), rel=1e-6
    )
    assert our_kid(seed=8)["kid_mean"] != pytest.approx(ours["kid_mean"], rel=1e-6)  # other subsets


def test_kid_over_whole_sets_is_the_polynomial_mmd_of_the_sets():
    """Subsets as large as both sets are the sets themselves (in some order): every subset's MMD is the sets' own,
    whatever the RNG draws."""
    real, fake = feature_sets(150, 150)
    quality = fed(project_quality(("kid",), kid_subset_size=150, kid_subsets=5), real, fake, batch=64)
    ours = quality.compute(seed=3)
    whole = poly_mmd(real.double(), fake.double()).item()
    assert ours["kid_mean"] == pytest.approx(
        whole, rel=1e-5
    )  # float32 sums in another order: 1.3e-6 measured
    assert ours["kid_std"] <= 1e-5 * whole
