"""Which training timesteps a sampler visits: `steps` of them, ascending (int64), from a spacing rule (a sampler's
`spacing` option). Every spacing starts at T - 1, the noise level x_T is drawn at.

uniform: evenly spread over [0, T - 1], both ends included (Nichol & Dhariwal 2021's respacing; DDIM's
    "linspace").
trailing: T - 1, T - 1 - T/S, ..., rounded: evenly spread from T - 1 down, never reaching 0 (Lin et al. 2024,
    Table 2: with a zero-terminal-SNR schedule the first step must start at T - 1, and the last step goes from
    about T/S straight to the data).
log_snr: evenly spread in the half log-SNR lambda (Lu et al. 2022, DPM-Solver).
karras: Karras et al. 2022 (EDM), Eq. 5: sigma_i = (sigma_max^(1/rho) + i / (S - 1) (sigma_min^(1/rho) -
    sigma_max^(1/rho)))^rho with rho = 7, from the schedule's largest sigma to its smallest, in this project's
    variance-preserving parameterisation sigma_t = sqrt((1 - abar_t) / abar_t) (so log sigma = -lambda).

The networks know only integer timesteps, so a spacing defined in a continuous variable (lambda, sigma) maps each
of its points to the training timestep nearest in lambda (`nearest_timesteps`: nearest in log sigma, as lambda
= -log sigma), and the samplers then step between the sigmas of those timesteps: the network is never asked
about a noise level it was not trained at.
"""

import math
from typing import Literal

import torch

from diffusion.errors import OutOfRange

Spacing = Literal["uniform", "trailing", "log_snr", "karras"]
KARRAS_RHO = 7.0  # Karras et al.'s rho: steps concentrate near sigma_min as rho grows

# DPM-Solver's reference code clips lambda here (NoiseScheduleVP.numerical_clip_alpha); Ho et al.'s linear
# schedule ends at lambda = -5.06, so it is untouched.
LOWEST_GRID_LAMBDA = -5.1


def check_steps(num_timesteps: int, steps: int) -> None:
    if not 1 <= steps <= num_timesteps:
        raise OutOfRange(
            "steps", steps, f"between 1 and the schedule's num_timesteps={num_timesteps}",
            f"pass a step count from 1 to {num_timesteps}",
        )  # fmt: skip


def uniform_timesteps(num_timesteps: int, steps: int) -> torch.Tensor:
    """`steps` training timesteps evenly spread over [0, T-1], both ends included, ascending (int64)."""
    check_steps(num_timesteps, steps)
    if steps == 1:
        return torch.tensor([num_timesteps - 1])
    return torch.linspace(0, num_timesteps - 1, steps, dtype=torch.float64).round().long()


def trailing_timesteps(num_timesteps: int, steps: int) -> torch.Tensor:
    """`steps` training timesteps from T - 1 down in strides of T / steps (Lin et al. 2024's "trailing"),
    ascending (int64)."""
    check_steps(num_timesteps, steps)
    descending = torch.arange(steps, dtype=torch.float64) * (num_timesteps / steps)
    return (num_timesteps - descending).round().long().flip(0) - 1


def half_log_snr(alphas_cumprod: torch.Tensor) -> torch.Tensor:
    """lambda_t = log(alpha_t / sigma_t) with alpha_t = sqrt(abar_t), sigma_t = sqrt(1 - abar_t) (float64)."""
    alphas_cumprod = alphas_cumprod.double()
    return 0.5 * (alphas_cumprod.log() - torch.log1p(-alphas_cumprod))


def log_snr_timesteps(alphas_cumprod: torch.Tensor, steps: int) -> torch.Tensor:
    """`steps` training timesteps evenly spread in lambda (the half log-SNR) from lambda(T-1) to lambda(0),
    both ends included, ascending (int64).

    This is the "logSNR" step schedule of DPM-Solver (Lu et al. 2022a, "DPM-Solver: A Fast ODE Solver for
    Diffusion Probabilistic Model Sampling in Around 10 Steps"), which its authors recommend for
    low-resolution images (time-uniform steps for high-resolution ones) and which their reference code uses
    for Ho et al.'s discrete-time CIFAR-10 model. Each lambda is mapped to the
    training timestep nearest in lambda, because the networks only know integer timesteps; where lambda moves
    faster than the grid (near t = 0 with many steps) neighbours are pushed apart so all `steps` differ.
    Like the reference code, the grid does not reach below lambda = -5.1 (the cosine schedule's lambda
    plunges in its last few timesteps, where an even grid would waste steps); the first step then starts
    at T - 1 all the same, so that x_T keeps the noise level it was drawn for.
    """
    num_timesteps = len(alphas_cumprod)
    check_steps(num_timesteps, steps)
    if steps == 1:
        return torch.tensor([num_timesteps - 1])
    lambdas = half_log_snr(alphas_cumprod.cpu())  # (T,), decreasing in t
    lambda_start = max(lambdas[-1].item(), LOWEST_GRID_LAMBDA)
    return nearest_timesteps(
        lambdas, torch.linspace(lambdas[0].item(), lambda_start, steps, dtype=torch.float64)
    )


def sigmas(alphas_cumprod: torch.Tensor) -> torch.Tensor:
    """sigma_t = sqrt((1 - abar_t) / abar_t) = exp(-lambda_t) for t = 0..T-1 (float64): the noise level of
    x_t / sqrt(abar_t) = x_0 + sigma_t eps, Karras et al.'s variable; infinite where abar_t = 0."""
    return torch.exp(-half_log_snr(alphas_cumprod))


def karras_timesteps(alphas_cumprod: torch.Tensor, steps: int) -> torch.Tensor:
    """`steps` training timesteps spread as Karras et al.'s sigmas (Eq. 5, rho = 7) from sigma_{T-1} to sigma_0,
    each the timestep nearest in log sigma, ascending (int64).

    As the log-SNR grid, the sigmas stop at exp(5.1) = 164 (Ho et al.'s linear schedule ends at 157): the cosine
    schedule's sigma climbs to 10^4 in its last few timesteps and a zero-terminal-SNR schedule's to infinity,
    where Karras et al.'s spacing would spend most of its steps on x_t that are noise to many digits. The first
    step then starts at T - 1 all the same.
    """
    num_timesteps = len(alphas_cumprod)
    check_steps(num_timesteps, steps)
    if steps == 1:
        return torch.tensor([num_timesteps - 1])
    lambdas = half_log_snr(alphas_cumprod.cpu())  # (T,), decreasing in t; sigma = exp(-lambda)
    sigma_min = math.exp(-lambdas[0].item())
    sigma_max = math.exp(-max(lambdas[-1].item(), LOWEST_GRID_LAMBDA))
    ramp = torch.linspace(1, 0, steps, dtype=torch.float64)  # i / (S - 1), from the last sigma to the first
    root_min, root_max = sigma_min ** (1 / KARRAS_RHO), sigma_max ** (1 / KARRAS_RHO)
    targets = (root_max + ramp * (root_min - root_max)) ** KARRAS_RHO  # (S,), increasing: ascending t
    return nearest_timesteps(lambdas, -targets.log())


def nearest_timesteps(lambdas: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """For `steps` targets in lambda, decreasing (in the order of ascending t), the training timesteps nearest in
    lambda, ascending (int64), all distinct and the last T - 1 (x_T's level). Where lambda moves faster than the
    grid (near t = 0 with many steps) neighbours are pushed apart so all `steps` differ."""
    num_timesteps, steps = len(lambdas), len(targets)
    timesteps = (lambdas[None, :] - targets[:, None]).abs().argmin(dim=1).tolist()
    for i in range(1, steps):  # distinct and increasing: push up from below ...
        timesteps[i] = max(timesteps[i], timesteps[i - 1] + 1)
    timesteps[-1] = num_timesteps - 1
    for i in range(steps - 2, -1, -1):  # ... then down from T - 1 (possible because steps <= T)
        timesteps[i] = min(timesteps[i], timesteps[i + 1] - 1)
    return torch.tensor(timesteps)


def nearest_timestep(lambdas: torch.Tensor, sigma: float) -> int:
    """The training timestep whose sigma is nearest `sigma` in log sigma (Karras et al.'s S_churn raises the
    noise to a level between two timesteps; the network is asked at this one's)."""
    return int((lambdas + math.log(sigma)).abs().argmin())


def spaced_timesteps(spacing: Spacing, alphas_cumprod: torch.Tensor, steps: int) -> torch.Tensor:
    """The `steps` timesteps a sampler with this `spacing` visits, ascending (int64)."""
    num_timesteps = len(alphas_cumprod)
    if spacing == "uniform":
        return uniform_timesteps(num_timesteps, steps)
    if spacing == "trailing":
        return trailing_timesteps(num_timesteps, steps)
    if spacing == "log_snr":
        return log_snr_timesteps(alphas_cumprod, steps)
    return karras_timesteps(alphas_cumprod, steps)
