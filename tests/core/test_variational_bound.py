"""The variational bound's terms (diffusion.core.variational_bound) against float64 references written here from
the papers' formulas, and the sum over all T steps against an unbiased Monte-Carlo estimate of the same bound."""

import math

import mpmath
import numpy as np
import pytest
import torch

from diffusion.core.noise import PerSampleNoise
from diffusion.core.schedule import NoiseSchedule
from diffusion.core.variational_bound import (
    ReverseProcess,
    bound_terms,
    discretized_gaussian_log_likelihood,
    normal_kl,
    prior_bpd,
    vlb_term,
)

LN2 = math.log(2)


class Dummy(torch.nn.Module):
    """A fixed, cheap 'network' (eps-prediction) whose terms are far from zero at every t."""

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return 0.1 * x + 0.001 * t.float().view(-1, *[1] * (x.ndim - 1))


class DummyLearned(Dummy):
    """The same prediction, then v channels in [-1, 1] that vary with x and t (a learned-variance output)."""

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        v = torch.tanh(x + t.float().view(-1, *[1] * (x.ndim - 1)) / 500 - 0.5)
        return torch.cat([super().forward(x, t), v], dim=1)


def eight_bit_images(n: int, seed: int = 0, shape=(1, 4, 4)) -> torch.Tensor:
    """Random 8-bit images in model units, the extremes included."""
    levels = torch.randint(0, 256, (n, *shape), generator=torch.Generator().manual_seed(seed))
    levels[0, 0, 0, 0], levels[0, 0, 0, 1] = 0, 255
    return levels.float() / 255 * 2 - 1


def stored_betas(beta_schedule: str = "linear") -> np.ndarray:
    """The betas as a schedule stores them (float32 buffers), in float64: the references start from them."""
    return NoiseSchedule(beta_schedule).betas.double().numpy()


def reference_schedule() -> dict[str, np.ndarray]:
    """Ho et al.'s quantities from the betas, float64, in the textbook form (Eq. 4, 6, 7)."""
    betas = stored_betas()
    alphas = 1 - betas
    abar = np.cumprod(alphas)
    abar_prev = np.append(1.0, abar[:-1])
    return {
        "betas": betas, "alphas": alphas, "abar": abar, "abar_prev": abar_prev,
        "posterior_variance": betas * (1 - abar_prev) / (1 - abar),
        "coef_x0": betas * np.sqrt(abar_prev) / (1 - abar),
        "coef_xt": (1 - abar_prev) * np.sqrt(alphas) / (1 - abar),
    }  # fmt: skip


def reference_kl(m1, v1, m2, v2):
    """KL between two Gaussians given their variances (not log-variances)."""
    return np.log(np.sqrt(v2) / np.sqrt(v1)) + (v1 + (m1 - m2) ** 2) / (2 * v2) - 0.5


def reference_bin_log_probability(x: float, mean: float, std: float) -> float:
    """log P(bin of x) in 50-digit arithmetic (mpmath), the bins of -1 and +1 open to the outside; a bin above
    the mean from the upper tail (mpmath's numbers keep any exponent, so 1e-300 of mass keeps its digits)."""
    mpmath.mp.dps = 50
    x, mean, half = mpmath.mpf(x), mpmath.mpf(mean), mpmath.mpf(1) / 255
    below = lambda z: mpmath.ncdf(z, mu=mean, sigma=std)  # noqa: E731  P(X < z)
    above = lambda z: mpmath.ncdf(2 * mean - z, mu=mean, sigma=std)  # noqa: E731  P(X > z)
    highest, lowest = x > 1 - half, x < -1 + half
    if x > mean:
        mass = (1 if lowest else above(x - half)) - (0 if highest else above(x + half))
    else:
        mass = (1 if highest else below(x + half)) - (0 if lowest else below(x - half))
    return float(mpmath.log(mass))


def test_normal_kl_matches_the_closed_form_with_variances():
    rng = np.random.default_rng(0)
    m1, m2 = rng.normal(size=50), rng.normal(size=50)
    v1, v2 = np.exp(rng.normal(size=50) * 3), np.exp(rng.normal(size=50) * 3)
    ours = normal_kl(*(torch.from_numpy(a) for a in (m1, np.log(v1), m2, np.log(v2))))
    np.testing.assert_allclose(ours.numpy(), reference_kl(m1, v1, m2, v2), rtol=1e-12, atol=1e-14)
    # Nearly equal Gaussians (fixedsmall's variance against the posterior's): float64 keeps the tiny KL.
    m, log_v = torch.tensor(0.1, dtype=torch.float64), torch.tensor(-9.0, dtype=torch.float64)
    tiny = normal_kl(m, log_v, m + 1e-6, log_v)
    assert tiny.item() == pytest.approx(0.5 * 1e-12 * math.exp(9.0), rel=1e-6)


@pytest.mark.parametrize(
    "x, mean, std",
    [
        (0.0, 0.0, 0.01), (0.3, 0.31, 0.002), (-1.0, -0.98, 0.01), (1.0, 0.97, 0.02), (-1.0, 0.5, 0.1),
        (0.5, 0.2, 0.01), (0.8, 0.2, 0.01),  # 30 and 60 standard deviations above the mean (log 1e-780):
        (-0.5, 0.2, 0.01), (0.2, 0.2, 5.0),  # a bin far below the mean; a wide Gaussian
    ],
)  # fmt: skip
def test_discretized_gaussian_matches_a_50_digit_reference(x, mean, std):
    x = round((x + 1) / 2 * 255) / 255 * 2 - 1  # on the 8-bit grid
    ours = discretized_gaussian_log_likelihood(
        *(torch.tensor([value], dtype=torch.float64) for value in (x, mean, 2 * math.log(std)))
    )
    assert ours.dtype == torch.float64
    assert ours.item() == pytest.approx(reference_bin_log_probability(x, mean, std), rel=1e-9)


def test_discretized_gaussian_is_a_distribution_over_the_256_levels():
    levels = torch.arange(256, dtype=torch.float64) / 255 * 2 - 1
    for mean, std in [(0.0, 0.3), (0.99, 0.01), (-0.7, 2.0)]:
        log_p = discretized_gaussian_log_likelihood(
            levels, torch.full_like(levels, mean), torch.full_like(levels, 2 * math.log(std))
        )
        assert log_p.exp().sum().item() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("beta_schedule", ["linear", "cosine"])
def test_prior_term_is_near_zero_for_the_standard_schedules_and_matches_the_reference(beta_schedule):
    x0 = eight_bit_images(8)
    schedule = NoiseSchedule(beta_schedule)
    ours = prior_bpd(schedule, x0)
    abar_T = np.prod(1 - stored_betas(beta_schedule))
    expected = reference_kl(np.sqrt(abar_T) * x0.double().numpy(), 1 - abar_T, 0.0, 1.0)
    # atol: the reference's own rounding (its log(1 / sqrt(1 - abar)) + (1 - abar) / 2 - 1/2 cancels).
    np.testing.assert_allclose(ours.numpy(), expected.reshape(8, -1).mean(1) / LN2, rtol=1e-9, atol=1e-15)
    assert ours.max().item() < 1e-4  # bits/dim: x_T is N(0, I) up to abar_T ~ 4e-5


@pytest.mark.parametrize("variance", ["fixedlarge", "fixedsmall", "learned_range"])
def test_each_term_matches_a_float64_reference_from_the_papers_formulas(variance):
    """L_{t-1} (KL against the posterior, Eq. 6-7, model mean Eq. 11) and L_0 (Eq. 13) for eps-prediction,
    every variance; learned_range is Nichol & Dhariwal's Eq. 15 with the clipped beta~ at t = 0."""
    ref = reference_schedule()
    schedule = NoiseSchedule()
    learned = variance == "learned_range"
    model = DummyLearned() if learned else Dummy()
    process = ReverseProcess(variance=variance, learned_variance=learned, clip_denoised=False)
    x0 = eight_bit_images(3)
    for t_value in (0, 1, 2, 500, 999):
        t = torch.full((3,), t_value)
        noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(t_value))
        ours = vlb_term(model, schedule, process, x0, t, noise)
        x_t = schedule.q_sample(x0, t, noise)
        output = model(x_t, t).double().numpy()
        eps, v = (output[:, :1], output[:, 1:]) if learned else (output, None)
        x_t, x0_ = x_t.double().numpy(), x0.double().numpy()
        b, a, abar = ref["betas"][t_value], ref["alphas"][t_value], ref["abar"][t_value]
        model_mean = (x_t - b / np.sqrt(1 - abar) * eps) / np.sqrt(a)  # Eq. 11
        clipped_posterior = ref["posterior_variance"][max(t_value, 1)]
        if variance == "fixedlarge":
            model_var = b if t_value > 0 else ref["posterior_variance"][1]
        elif variance == "fixedsmall":
            model_var = clipped_posterior
        else:
            frac = (v + 1) / 2
            model_var = np.exp(frac * np.log(b) + (1 - frac) * np.log(clipped_posterior))
        if t_value == 0:
            std = np.broadcast_to(np.sqrt(model_var), x0_.shape)
            log_p = np.vectorize(reference_bin_log_probability)(x0_, model_mean, std)
            expected = -log_p.reshape(3, -1).mean(1) / LN2
        else:
            true_mean = ref["coef_x0"][t_value] * x0_ + ref["coef_xt"][t_value] * x_t
            kl = reference_kl(true_mean, ref["posterior_variance"][t_value], model_mean, model_var)
            expected = kl.reshape(3, -1).mean(1) / LN2
        # The network's prediction of x_0 is formed in float32 (as when sampling); the rest in float64.
        np.testing.assert_allclose(ours.numpy(), expected, rtol=2e-5, err_msg=f"t = {t_value}")


def test_kl_terms_of_an_exact_model_are_zero():
    """A network that predicts x_0 exactly, with the posterior's own variance (fixedsmall): every KL term is 0,
    so the model's p(x_{t-1} | x_t) and the true posterior are formed alike (means, variances, their clipping)."""
    x0 = eight_bit_images(4)
    oracle = lambda x_t, t: x0  # noqa: E731
    process = ReverseProcess("x0", "fixedsmall")
    terms = bound_terms(oracle, NoiseSchedule(num_timesteps=100), process, x0, torch.arange(4)).terms
    assert terms[:, 1:].abs().max().item() < 1e-12
    assert (terms[:, 0] > 0).all()  # the decoder pays for its fixed variance


def test_terms_depend_only_on_the_sample_and_its_index_not_its_batch():
    x0, schedule, process = eight_bit_images(4), NoiseSchedule("cosine", num_timesteps=20), ReverseProcess()
    whole = bound_terms(Dummy(), schedule, process, x0, torch.arange(4), seed=3)
    halves = [
        bound_terms(Dummy(), schedule, process, x0[i::2], torch.arange(4)[i::2], seed=3) for i in (0, 1)
    ]
    torch.testing.assert_close(whole.terms[0::2], halves[0].terms)
    torch.testing.assert_close(whole.total[1::2], halves[1].total)
    other_seed = bound_terms(Dummy(), schedule, process, x0, torch.arange(4), seed=4)
    assert not torch.equal(whole.terms, other_seed.terms)


def test_sum_over_all_steps_agrees_with_an_unbiased_monte_carlo_estimate():
    """E_t,eps[T L_t] + L_T (t uniform) is the bound; the sum over all T steps (averaged over noise seeds)
    must agree with it within the standard error of both estimates."""
    torch.manual_seed(0)
    schedule, process, T = NoiseSchedule(num_timesteps=50), ReverseProcess(), 50
    model = DummyLearned()
    process = ReverseProcess(variance="learned_range", learned_variance=True)
    x0 = eight_bit_images(8, seed=1)
    sums = torch.stack(
        [bound_terms(model, schedule, process, x0, torch.arange(8), seed=s).total for s in range(4)]
    )  # (seeds, B)
    draws = 4000
    x0_many = x0.repeat(draws, 1, 1, 1)
    t = torch.randint(T, (len(x0_many),), generator=torch.Generator().manual_seed(1))
    noise = PerSampleNoise(7, torch.arange(len(x0_many))).randn(x0_many.shape)
    with torch.no_grad():
        estimates = T * vlb_term(model, schedule, process, x0_many, t, noise) + prior_bpd(schedule, x0_many)
    estimates = estimates.view(draws, 8)
    # Both are averages over the same 8 images: compare their means over images and draws.
    difference = sums.mean() - estimates.mean()
    standard_error = math.sqrt(estimates.mean(1).var() / draws + sums.mean(1).var() / len(sums))
    assert abs(difference.item()) < 4 * standard_error, (sums.mean().item(), estimates.mean().item())
    assert standard_error < 0.03 * sums.mean().item()  # the test can tell a missing term from noise
