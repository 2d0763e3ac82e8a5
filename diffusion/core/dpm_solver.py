"""DPM-Solver++(2M) (Lu et al. 2022, "DPM-Solver++: Fast Solver for Guided Sampling of Diffusion Probabilistic
Models", Algorithm 2), a second-order multistep solver of the probability-flow ODE, and its stochastic (SDE)
variant, on timesteps spread evenly in the half log-SNR."""

import math
from collections.abc import Iterator

import torch
from torch import nn
from tqdm import tqdm

from diffusion.core.guidance import guided_output
from diffusion.core.noise import Generators, randn
from diffusion.core.schedule import NoiseSchedule, PredictionType
from diffusion.core.variance import split_output

# DPM-Solver's reference code clips lambda here (NoiseScheduleVP.numerical_clip_alpha); Ho et al.'s linear
# schedule ends at lambda = -5.06, so it is untouched.
LOWEST_GRID_LAMBDA = -5.1


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
    if not 1 <= steps <= num_timesteps:
        raise ValueError(f"steps={steps} must be between 1 and the schedule's num_timesteps={num_timesteps}")
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


@torch.no_grad()
def dpm_solver_pp_2m_steps(
    model: nn.Module,
    schedule: NoiseSchedule,
    x_T: torch.Tensor,
    *,
    steps: int = 20,
    prediction_type: PredictionType = "eps",
    clip_denoised: bool = True,
    stochastic: bool = False,
    generator: Generators = None,
    progress: bool = False,
    labels: torch.Tensor | None = None,
    guidance_scale: float = 1.0,
    learned_variance: bool = False,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """DPM-Solver++(2M) from x_T, yielding (t, x_{t_prev}, predicted x_0) after every step, as `reverse_steps`.

    The multistep second-order solver of the probability-flow ODE in its data-prediction form (Lu et al. 2022,
    Algorithm 2), with alpha_t = sqrt(abar_t), sigma_t = sqrt(1 - abar_t), lambda_t = log(alpha_t / sigma_t)
    and h = lambda_{t_prev} - lambda_t:

        x_{t_prev} = (sigma_{t_prev} / sigma_t) x_t - alpha_{t_prev} (e^{-h} - 1) D,
        D = (1 + 1 / (2 r)) x0(x_t, t) - 1 / (2 r) x0(x_{t_last}, t_last),  r = h_last / h,

    where t_last is the timestep visited before t. The first step has no earlier x0 and is first order
    (D = x0: a DDIM step). The `steps` timesteps are spread evenly in lambda (`log_snr_timesteps`), from
    T - 1 down to 0, one network evaluation each; the last step goes from t = 0 to the data (sigma = 0,
    lambda = infinity), where the first-order update is exact and returns the predicted x0 itself (DDIM's
    last step too; the reference code's ``denoise_to_zero``). With clip_denoised, the predicted x0 is
    clipped to [-1, 1] before it enters D (static thresholding, as DPM-Solver++ allows for data prediction).
    Deterministic: x_T fixes the sample. `labels` and `guidance_scale` as in `reverse_steps` (guided x0 is the
    data prediction DPM-Solver++ was designed for: Lu et al.'s "guided sampling").

    stochastic: solve the reverse SDE instead, with the same D (the SDE variant of DPM-Solver++(2M), as in
    diffusers' ``sde-dpmsolver++`` and k-diffusion's ``sample_dpmpp_2m_sde``; z ~ N(0, I) from `generator`):

        x_{t_prev} = (sigma_{t_prev} / sigma_t) e^{-h} x_t + alpha_{t_prev} (1 - e^{-2h}) D
                     + sigma_{t_prev} sqrt(1 - e^{-2h}) z.

    Its first-order step is the DDPM posterior step with variance beta~ (DDIM with eta = 1). The noise
    corrects part of the network's error that the ODE carries along: on the digits recipe, 20 steps of it
    score close to DDPM-1000 where every ODE solver (DDIM, dpmpp_2m) levels off higher
    (benchmarks/results/quality.md).

    learned_variance: the network outputs 2C channels (`diffusion.core.variance`); the solver uses only the
    prediction, the first C (its steps have no free variance to learn).
    """
    timesteps = log_snr_timesteps(schedule.alphas_cumprod, steps).tolist()
    # Plain floats from a CPU copy: no device sync per step (see reverse_steps).
    alphas_cumprod = schedule.alphas_cumprod.double().cpu()
    lambdas = half_log_snr(alphas_cumprod)
    x = x_T
    x0_last, h_last = None, None
    pairs = list(zip(reversed(timesteps), [*reversed(timesteps[:-1]), -1], strict=True))
    for t, t_prev in tqdm(
        pairs,
        desc="dpmpp_2m_sde sampling" if stochastic else "dpmpp_2m sampling",
        disable=not progress,
        leave=False,
    ):
        t_batch = torch.full((x.shape[0],), t, device=x.device, dtype=torch.long)
        # 1. the data prediction x0(x_t, t) from any parameterization, optionally clipped.
        output = guided_output(model, x, t_batch, labels, guidance_scale, learned_variance)
        x0, _ = schedule.split_prediction(
            prediction_type, x, t_batch, split_output(output, learned_variance)[0]
        )
        if clip_denoised:
            x0 = x0.clamp(-1, 1)
        if t_prev < 0:
            # 2a. the last step, to sigma = 0: e^{-h} = 0 and alpha = 1, so x_0 = D = x0 (first order).
            x, h = x0, None
        else:
            # 2b. step size in lambda, then the second-order combination D (first order on the first step).
            h = (lambdas[t_prev] - lambdas[t]).item()
            if x0_last is None:
                d = x0
            else:
                r = h_last / h
                d = (1 + 1 / (2 * r)) * x0 - (1 / (2 * r)) * x0_last
            # 3. the exponential-integrator update (Algorithm 2, line 6 / line 3 for the first step).
            sigma_prev = (1 - alphas_cumprod[t_prev]).sqrt().item()
            sigma_ratio = sigma_prev / (1 - alphas_cumprod[t]).sqrt().item()
            alpha_prev = alphas_cumprod[t_prev].sqrt().item()
            if stochastic:
                x = sigma_ratio * math.exp(-h) * x - alpha_prev * math.expm1(-2 * h) * d
                x = x + sigma_prev * math.sqrt(-math.expm1(-2 * h)) * randn(x.shape, generator, x.device)
            else:
                x = sigma_ratio * x - alpha_prev * math.expm1(-h) * d
        x0_last, h_last = x0, h
        yield t, x, x0
