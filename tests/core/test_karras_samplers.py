"""Karras et al.'s sigmas and the samplers in their form: the karras and trailing spacings, the map from a sigma
to the network's timestep, Heun (Algorithms 1 and 2) against a reference written in Karras et al.'s variables,
its order of convergence, and Euler ancestral as DDIM with the same eta.

As in tests/core/test_dpm_solver.py, the data are Gaussian, x_0 ~ N(mu, diag(s^2)), where the optimal denoiser is
known in closed form: in Karras et al.'s x~ = x_0 + sigma eps, D(x~; sigma) = mu + s^2 (x~ - mu) / (s^2 + sigma^2),
and the probability-flow ODE maps x~ to mu + sqrt(s^2 + sigma'^2) / sqrt(s^2 + sigma^2) (x~ - mu).
"""

import math

import numpy as np
import pytest
import torch

from diffusion.core.noise import PerSampleNoise, randn
from diffusion.core.samplers.spacing import (
    half_log_snr,
    karras_timesteps,
    nearest_timestep,
    sigmas,
    trailing_timesteps,
)
from diffusion.core.sampling import SamplingOptions, final_sample, reverse_steps
from diffusion.core.schedule import NoiseSchedule

MU = torch.tensor([0.5, -0.3, 0.0, 0.2], dtype=torch.float64)
STD = torch.tensor([0.3, 0.5, 0.1, 0.7], dtype=torch.float64)


def denoised(x_tilde: torch.Tensor, sigma: float) -> torch.Tensor:
    """D(x~; sigma) of the Gaussian data (float64)."""
    return MU + STD**2 * (x_tilde - MU) / (STD**2 + sigma**2)


class GaussianOracle(torch.nn.Module):
    """The optimal eps-prediction of the Gaussian data at (x_t, t), from D in Karras et al.'s variables; records
    the timesteps it is asked at."""

    def __init__(self, schedule: NoiseSchedule) -> None:
        super().__init__()
        self.sigmas = sigmas(schedule.alphas_cumprod)
        self.asked: list[int] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        self.asked.append(int(t[0]))
        sigma = self.sigmas[t].view(-1, 1)
        x_tilde = x.double() * (1 + sigma**2).sqrt()
        return ((x_tilde - denoised(x_tilde, sigma)) / sigma).float()


def x_T(n: int = 64) -> torch.Tensor:
    return torch.randn(n, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def snapped(sigma_grid: torch.Tensor, sigma: float) -> int:
    """The training timestep nearest `sigma` in log sigma, by brute force."""
    return int((sigma_grid.log() - math.log(sigma)).abs().argmin())


# ---- spacings and the map from sigma to t ---------------------------------------------------------------------
def eq_5(sigma_min: float, sigma_max: float, steps: int, rho: float = 7.0) -> list[float]:
    """Karras et al.'s sigmas, Eq. 5, from sigma_max down to sigma_min."""
    root_min, root_max = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return [(root_max + i / (steps - 1) * (root_min - root_max)) ** rho for i in range(steps)]


def test_karras_timesteps_are_the_training_timesteps_nearest_eq_5s_sigmas():
    schedule = NoiseSchedule()
    grid = sigmas(schedule.alphas_cumprod)  # 0.01 to 157 for Ho et al.'s schedule
    timesteps = karras_timesteps(schedule.alphas_cumprod, 12).tolist()
    assert timesteps == [
        snapped(grid, sigma) for sigma in reversed(eq_5(grid[0].item(), grid[-1].item(), 12))
    ]
    assert timesteps[0] == 0 and timesteps[-1] == 999
    assert karras_timesteps(schedule.alphas_cumprod, 1000).tolist() == list(range(1000))  # pushed apart
    # Where sigma climbs past exp(5.1) = 164 (cosine, zero terminal SNR) the grid stops there, yet starts at T - 1.
    for other in (NoiseSchedule("cosine"), NoiseSchedule(zero_terminal_snr=True)):
        other_grid = sigmas(other.alphas_cumprod)
        expected = [
            snapped(other_grid, sigma) for sigma in reversed(eq_5(other_grid[0].item(), math.exp(5.1), 12))
        ]
        assert other_grid[expected[-1]] < 200 and other_grid[-1] > 10_000
        assert karras_timesteps(other.alphas_cumprod, 12).tolist() == [*expected[:-1], 999]


def test_trailing_timesteps_start_at_T_minus_1_and_stride_down_as_lin_et_al_table_2():
    assert trailing_timesteps(1000, 10).tolist() == [99, 199, 299, 399, 499, 599, 699, 799, 899, 999]
    assert trailing_timesteps(1000, 3).tolist() == [332, 666, 999]  # round(1000 - 1000 i / 3) - 1
    assert trailing_timesteps(1000, 1000).tolist() == list(range(1000))
    with pytest.raises(ValueError, match="steps=11 must be between 1 and the schedule's num_timesteps=10"):
        trailing_timesteps(10, 11)


def test_a_sigma_maps_to_the_training_timestep_nearest_in_log_sigma():
    schedule = NoiseSchedule()
    lambdas, grid = half_log_snr(schedule.alphas_cumprod), sigmas(schedule.alphas_cumprod)
    for t in (0, 10, 500, 998):
        between = math.sqrt(grid[t].item() * grid[t + 1].item())  # the midpoint in log sigma
        assert (
            nearest_timestep(lambdas, between * 0.999) == t
            and nearest_timestep(lambdas, between * 1.001) == t + 1
        )
    assert nearest_timestep(lambdas, 1e-6) == 0 and nearest_timestep(lambdas, 1e6) == 999


# ---- Heun ------------------------------------------------------------------------------------------------------
def reference_heun(
    sigma_steps: list[float], sigma_grid: torch.Tensor, x_T: torch.Tensor, churn: dict | None = None,
    noise: PerSampleNoise | None = None,
) -> torch.Tensor:  # fmt: skip
    """Karras et al.'s Algorithm 1 (Algorithm 2 with `churn`: S_churn, S_tmin, S_tmax, S_noise) in x~ = x_0 +
    sigma eps, over sigma_0 > ... > sigma_{N-1} and sigma_N = 0, float64; the churned sigma is the training sigma
    nearest (1 + gamma) sigma_i, the noise drawn from `noise` as the sampler draws it. Returns x_0."""
    sigma_steps = [*sigma_steps, 0.0]
    x = x_T * math.sqrt(1 + sigma_steps[0] ** 2)  # x~ = x_t / sqrt(abar)
    n = len(sigma_steps) - 1
    for i in range(n):
        sigma, sigma_next = sigma_steps[i], sigma_steps[i + 1]
        sigma_hat = sigma
        if churn and churn["s_tmin"] <= sigma <= churn["s_tmax"]:
            gamma = min(churn["s_churn"] / n, math.sqrt(2) - 1)
            sigma_hat = max(sigma_grid[snapped(sigma_grid, (1 + gamma) * sigma)].item(), sigma)
            if sigma_hat > sigma:
                z = randn(x.shape, noise, torch.device("cpu")).double()
                x = x + math.sqrt(sigma_hat**2 - sigma**2) * churn["s_noise"] * z
        d = (x - denoised(x, sigma_hat)) / sigma_hat
        x_next = x + (sigma_next - sigma_hat) * d
        if sigma_next != 0:
            d_next = (x_next - denoised(x_next, sigma_next)) / sigma_next
            x_next = x + (sigma_next - sigma_hat) * (d + d_next) / 2
        x = x_next
    return x


def heun(
    schedule: NoiseSchedule, noise: torch.Tensor, steps: int, **options
) -> tuple[torch.Tensor, list[int]]:
    """Heun's sample of the Gaussian oracle, unclipped, and the timesteps the network was asked at."""
    oracle = GaussianOracle(schedule)
    sample = final_sample(
        reverse_steps(
            oracle, schedule, noise.float(), sampler="heun", steps=steps, clip_denoised=False, **options
        )
    )
    return sample.double(), oracle.asked


def test_heun_is_karras_et_al_algorithm_1_and_costs_2n_minus_1_evaluations():
    schedule = NoiseSchedule()
    grid, noise = sigmas(schedule.alphas_cumprod), x_T()
    sample, asked = heun(schedule, noise, 8)
    timesteps = karras_timesteps(schedule.alphas_cumprod, 8).flip(0).tolist()
    expected = reference_heun([grid[t].item() for t in timesteps], grid, noise)
    # float32 network outputs and x_t; x~ = 157 x_t at T - 1.
    torch.testing.assert_close(sample, expected, rtol=0, atol=1e-4)
    # Each step asks at its sigma and at the next one, the last only at its own: 2N - 1 evaluations.
    assert asked == [
        *[t for pair in zip(timesteps[:-1], timesteps[1:], strict=True) for t in pair],
        timesteps[-1],
    ]


def test_heun_with_churn_is_algorithm_2_at_the_training_sigmas_nearest_the_churned_ones():
    schedule = NoiseSchedule()
    grid, noise = sigmas(schedule.alphas_cumprod), x_T()
    churn = {"s_churn": 40.0, "s_tmin": 0.05, "s_tmax": 50.0, "s_noise": 1.003}
    sample, asked = heun(schedule, noise, 8, generator=PerSampleNoise(1, torch.arange(64)), **churn)
    timesteps = karras_timesteps(schedule.alphas_cumprod, 8).flip(0).tolist()
    expected = reference_heun(
        [grid[t].item() for t in timesteps], grid, noise, churn, PerSampleNoise(1, torch.arange(64))
    )
    torch.testing.assert_close(sample, expected, rtol=0, atol=1e-4)
    churned = [t for t in asked if t not in timesteps]
    # gamma = min(40 / 8, sqrt 2 - 1): every step with 0.05 <= sigma <= 50 asks the network one sigma up.
    in_range = [t for t in timesteps if 0.05 <= grid[t] <= 50]
    assert churned == [snapped(grid, math.sqrt(2) * grid[t].item()) for t in in_range] and len(churned) >= 3
    deterministic, _ = heun(schedule, noise, 8)
    assert (sample - deterministic).abs().max() > 0.01
    # Outside [s_tmin, s_tmax] no churn: the deterministic sample.
    unchurned, _ = heun(
        schedule, noise, 8, s_churn=40.0, s_tmax=0.001, generator=PerSampleNoise(1, torch.arange(64))
    )
    torch.testing.assert_close(unchurned, deterministic, rtol=0, atol=0)


def test_heun_converges_to_the_probability_flow_ode_solution_at_second_order():
    schedule = NoiseSchedule()
    noise = x_T(256)
    sigma_T = sigmas(schedule.alphas_cumprod)[-1].item()
    x_tilde = noise * math.sqrt(1 + sigma_T**2)
    exact = MU + STD / (STD**2 + sigma_T**2).sqrt() * (x_tilde - MU)
    errors = [(heun(schedule, noise, steps)[0] - exact).abs().max().item() for steps in (10, 20, 40, 80)]
    # Doubling the steps divides a second-order method's error by about 4 (measured 5.0, 4.5, 4.4).
    assert all(errors[i] / errors[i + 1] > 3 for i in range(3)) and errors[-1] < 1e-2, errors


@pytest.mark.parametrize(
    "options, message",
    [
        ({"s_churn": -1.0}, r"^s_churn=-1.0 must be a finite number >= 0 — "),
        ({"s_noise": math.inf}, r"^s_noise=inf must be a finite number >= 0 — "),
        ({"s_tmin": 2.0, "s_tmax": 1.0}, r"^s_tmax 1.0 is below s_tmin 2.0 — pass s_tmax >= s_tmin"),
        ({"s_tmax": math.nan}, r"^s_tmax=nan must be a number \(inf: no bound\) — pass e.g. 50"),
        ({"eta": 1.5, "sampler": "euler_ancestral"}, r"^eta=1.5 must be in \[0, 1\] — "),
        ({"spacing": "leading"}, r"spacing"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        SamplingOptions(**{"sampler": "heun", **options})


# ---- Euler ancestral -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spacing", ["uniform", "karras"])
@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_euler_ancestral_is_ddim_with_the_same_eta_and_noise(spacing, eta):
    schedule = NoiseSchedule()
    noise = x_T().float()
    runs = {
        sampler: list(reverse_steps(GaussianOracle(schedule), schedule, noise, sampler=sampler, steps=10, eta=eta,
                                    spacing=spacing, generator=PerSampleNoise(2, torch.arange(64))))
        for sampler in ("euler_ancestral", "ddim")
    }  # fmt: skip
    for (t_a, x_a, _), (t_b, x_b, _) in zip(runs["euler_ancestral"], runs["ddim"], strict=True):
        assert t_a == t_b
        # DDIM's coefficients come from float64 sums of log(1 - beta), these from the float32 abar: float32 rounding.
        torch.testing.assert_close(x_a, x_b, rtol=1e-5, atol=1e-5)


def test_euler_ancestral_defaults_to_karras_sigmas_and_eta_1():
    schedule = NoiseSchedule()
    oracle = GaussianOracle(schedule)
    draws = [
        final_sample(reverse_steps(oracle, schedule, x_T().float(), sampler="euler_ancestral",
                                   generator=PerSampleNoise(seed, torch.arange(64))))
        for seed in (0, 1)
    ]  # fmt: skip
    assert oracle.asked[:35] == karras_timesteps(schedule.alphas_cumprod, 35).flip(0).tolist()
    assert (draws[0] - draws[1]).abs().max() > 0.05  # the same x_T, other noise after it
    assert np.isfinite(draws[0].numpy()).all()
