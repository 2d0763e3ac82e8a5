"""Ancestral DDPM (Ho et al. 2020, Algorithm 2), DDPM on a respaced subsequence of timesteps (Nichol & Dhariwal
2021) and DDIM (Song et al. 2021): one loop over a subsequence tau_S > ... > tau_1 of the training timesteps, which
differ only in step 4, the variance of x_{t_prev}. A network with learned variances (2C output channels,
`diffusion.core.variance`) gives DDPM its variance; DDIM uses only its prediction."""

from collections.abc import Iterator
from typing import Literal

import torch
from torch import nn
from tqdm import tqdm

from diffusion.core.guidance import guided_output
from diffusion.core.noise import Generators, randn
from diffusion.core.schedule import NoiseSchedule, PredictionType
from diffusion.core.variance import VarianceType, reverse_log_variance, split_output


def spaced_timesteps(num_timesteps: int, steps: int) -> torch.Tensor:
    """`steps` training timesteps evenly spread over [0, T-1], both ends included, ascending (int64)."""
    if not 1 <= steps <= num_timesteps:
        raise ValueError(f"steps={steps} must be between 1 and the schedule's num_timesteps={num_timesteps}")
    if steps == 1:
        return torch.tensor([num_timesteps - 1])
    return torch.linspace(0, num_timesteps - 1, steps, dtype=torch.float64).round().long()


@torch.no_grad()
def ddpm_ddim_steps(
    model: nn.Module,
    schedule: NoiseSchedule,
    x_T: torch.Tensor,
    *,
    sampler: Literal["ddpm", "ddim"],
    steps: int,
    eta: float,
    variance: VarianceType,
    prediction_type: PredictionType,
    clip_denoised: bool,
    generator: Generators,
    progress: bool,
    labels: torch.Tensor | None,
    guidance_scale: float,
    learned_variance: bool = False,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """DDPM or DDIM from x_T over `steps` evenly spaced timesteps, yielding (t, x_{t_prev}, predicted x_0) after
    every step; the options as `diffusion.core.sampling.reverse_steps` documents them (checked there)."""
    timesteps = spaced_timesteps(schedule.num_timesteps, steps).tolist()
    x = x_T
    batch = x.shape[0]
    pairs = list(zip(reversed(timesteps), [*reversed(timesteps[:-1]), -1], strict=True))
    for t, t_prev in tqdm(pairs, desc=f"{sampler} sampling", disable=not progress, leave=False):
        t_batch = torch.full((batch,), t, device=x.device, dtype=torch.long)
        t_prev_batch = torch.full_like(t_batch, t_prev)
        # 1. predict x_0 and eps from the network output (Eq. 15 for eps-prediction); v: its learned variance.
        output = guided_output(model, x, t_batch, labels, guidance_scale, learned_variance)
        prediction, v = split_output(output, learned_variance)
        x0, eps = schedule.split_prediction(prediction_type, x, t_batch, prediction)
        # 2. optionally clip predicted x_0 to the data range, and keep eps consistent with it.
        if clip_denoised:
            x0 = x0.clamp(-1, 1)
            eps = schedule.predict_eps_from_x0(x, t_batch, x0)
        # 3. the posterior q(x_{t_prev} | x_t, x_0) of this (possibly respaced) step, Eq. (6)-(7).
        mean, posterior_variance, beta = schedule.q_posterior(x0, x, t_batch, t_prev_batch)
        if sampler == "ddpm":
            # 4a. x_{t_prev} ~ N(mu~, sigma_t^2) with sigma_t^2 = beta_t or beta~_t (Sec. 3.2), or learned:
            # Nichol & Dhariwal Eq. 15 between this (respaced) step's beta and beta~.
            if variance == "learned_range":
                sigma2 = (
                    reverse_log_variance(schedule, variance, t_batch, t_prev_batch, x.ndim, v)
                    .exp()
                    .to(x.dtype)
                )
            else:
                sigma2 = beta if variance == "fixedlarge" else posterior_variance
            x = mean
        else:
            # 4b. DDIM, Song et al. 2021 Eq. (12), with sigma_t^2 = eta^2 beta~_t from Eq. (16).
            sigma2 = eta**2 * posterior_variance
            log_abar_prev = schedule.log_alphas_cumprod_at(t_prev_batch, x.ndim)
            coef_eps = (-torch.expm1(log_abar_prev) - sigma2.double()).clamp(min=0).sqrt()
            x = log_abar_prev.mul(0.5).exp().to(x.dtype) * x0 + coef_eps.to(x.dtype) * eps
        # 5. add noise, except on the last step (Algorithm 2, line 3: z = 0 when t = 1) and for eta = 0.
        if t_prev >= 0 and (sampler == "ddpm" or eta > 0):
            x = x + sigma2.sqrt() * randn(x.shape, generator, x.device)
        yield t, x, x0
