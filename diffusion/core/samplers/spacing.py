"""Which training timesteps a sampler visits: `steps` of them, ascending (int64), from a spacing rule. The networks
know only integer timesteps, so a spacing defined in another variable (the half log-SNR here) maps each of its
points to the nearest training timestep. Every spacing starts at T - 1, the noise level x_T is drawn at.

uniform: evenly spread over [0, T - 1] (Nichol & Dhariwal 2021's respacing; DDIM's "linspace").
log_snr: evenly spread in the half log-SNR lambda (Lu et al. 2022, DPM-Solver).
"""

import torch

# DPM-Solver's reference code clips lambda here (NoiseScheduleVP.numerical_clip_alpha); Ho et al.'s linear
# schedule ends at lambda = -5.06, so it is untouched.
LOWEST_GRID_LAMBDA = -5.1


def check_steps(num_timesteps: int, steps: int) -> None:
    if not 1 <= steps <= num_timesteps:
        raise ValueError(f"steps={steps} must be between 1 and the schedule's num_timesteps={num_timesteps}")


def uniform_timesteps(num_timesteps: int, steps: int) -> torch.Tensor:
    """`steps` training timesteps evenly spread over [0, T-1], both ends included, ascending (int64)."""
    check_steps(num_timesteps, steps)
    if steps == 1:
        return torch.tensor([num_timesteps - 1])
    return torch.linspace(0, num_timesteps - 1, steps, dtype=torch.float64).round().long()


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
    targets = torch.linspace(lambdas[0].item(), lambda_start, steps, dtype=torch.float64)
    timesteps = (lambdas[None, :] - targets[:, None]).abs().argmin(dim=1).tolist()
    for i in range(1, steps):  # distinct and increasing: push up from below ...
        timesteps[i] = max(timesteps[i], timesteps[i - 1] + 1)
    timesteps[-1] = num_timesteps - 1
    for i in range(steps - 2, -1, -1):  # ... then down from T - 1 (possible because steps <= T)
        timesteps[i] = min(timesteps[i], timesteps[i + 1] - 1)
    return torch.tensor(timesteps)
