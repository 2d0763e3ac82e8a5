"""Reverse processes as free functions: ancestral DDPM (Ho et al. 2020, Algorithm 2), DDPM on a respaced
subsequence of timesteps (Nichol & Dhariwal 2021) and DDIM (Song et al. 2021).

Both samplers walk a subsequence tau_S > ... > tau_1 of the training timesteps and share one loop,
`reverse_steps`, which yields every intermediate x_t (the notebook draws the denoising trajectory from it).

Noise comes from `generator`: None (global RNG), one torch.Generator, a `PerSampleNoise` (counter-based
noise keyed by each sample's index, diffusion/noise.py) or a list with one generator per sample. Per-sample
noise makes sample i depend only on its own seed, so N samples split over any number of processes (or
batches) are the same as N samples drawn at once.
"""

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Literal

import torch
from torch import nn
from tqdm import tqdm

from diffusion.noise import PerSampleNoise
from diffusion.schedule import NoiseSchedule, PredictionType, _check_choice

Sampler = Literal["ddpm", "ddim"]
VarianceType = Literal["fixedlarge", "fixedsmall"]
Generators = torch.Generator | PerSampleNoise | Sequence[torch.Generator] | None


def randn(shape: Sequence[int], generator: Generators, device: torch.device) -> torch.Tensor:
    """Standard normal noise of `shape` (B, ...) on `device`, drawn from the given generator(s)."""
    if isinstance(generator, PerSampleNoise):
        return generator.randn(shape, device)  # the whole batch at once, on the device
    if generator is None or isinstance(generator, torch.Generator):
        gen_device = generator.device if generator is not None else device
        return torch.randn(tuple(shape), generator=generator, device=gen_device).to(device)
    if len(generator) != shape[0]:
        raise ValueError(
            f"got {len(generator)} generators for a batch of {shape[0]} samples; pass one per sample"
        )
    return torch.stack([torch.randn(tuple(shape[1:]), generator=g, device=g.device) for g in generator]).to(
        device
    )


def spaced_timesteps(num_timesteps: int, steps: int) -> torch.Tensor:
    """`steps` training timesteps evenly spread over [0, T-1], both ends included, ascending (int64)."""
    if not 1 <= steps <= num_timesteps:
        raise ValueError(f"steps={steps} must be between 1 and the schedule's num_timesteps={num_timesteps}")
    if steps == 1:
        return torch.tensor([num_timesteps - 1])
    return torch.linspace(0, num_timesteps - 1, steps, dtype=torch.float64).round().long()


@torch.no_grad()
def reverse_steps(
    model: nn.Module,
    schedule: NoiseSchedule,
    x_T: torch.Tensor,
    *,
    sampler: Sampler = "ddpm",
    steps: int | None = None,
    eta: float = 0.0,
    variance: VarianceType = "fixedlarge",
    prediction_type: PredictionType = "eps",
    clip_denoised: bool = True,
    generator: Generators = None,
    progress: bool = False,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Run the reverse process from x_T, yielding (t, x_{t_prev}, predicted x_0) after every step.

    steps: how many timesteps to visit (default: all T for ddpm, 50 for ddim).
    eta: DDIM stochasticity (0 = deterministic DDIM, 1 = the DDPM posterior variance).
    variance: DDPM's sigma_t^2 = beta_t ("fixedlarge", Ho et al.'s choice for CIFAR-10) or the posterior
        variance beta~_t ("fixedsmall"); with respacing, betas are those of the respaced process.
    """
    _check_choice("sampler", sampler, Sampler)
    _check_choice("variance", variance, VarianceType)
    _check_choice("prediction_type", prediction_type, PredictionType)
    T = schedule.num_timesteps
    timesteps = spaced_timesteps(T, steps or (T if sampler == "ddpm" else min(50, T))).tolist()
    # One copy on the CPU: reading it per step from a GPU tensor would sync the device twice a step.
    alphas_cumprod = schedule.alphas_cumprod.double().cpu()
    x = x_T
    batch = x.shape[0]
    pairs = list(zip(reversed(timesteps), [*reversed(timesteps[:-1]), -1], strict=True))
    for t, t_prev in tqdm(pairs, desc=f"{sampler} sampling", disable=not progress, leave=False):
        t_batch = torch.full((batch,), t, device=x.device, dtype=torch.long)
        # 1. predict x_0 and eps from the network output (Eq. 15 for eps-prediction).
        output = model(x, t_batch).float()
        x0, eps = schedule.split_prediction(prediction_type, x, t_batch, output)
        # 2. optionally clip predicted x_0 to the data range, and keep eps consistent with it.
        if clip_denoised:
            x0 = x0.clamp(-1, 1)
            eps = schedule.predict_eps_from_x0(x, t_batch, x0)
        # 3. abar at t and t_prev; beta of the (possibly respaced) step is 1 - abar_t / abar_prev.
        abar_t = alphas_cumprod[t].item()
        abar_prev = alphas_cumprod[t_prev].item() if t_prev >= 0 else 1.0
        beta_t = 1 - abar_t / abar_prev
        if sampler == "ddpm":
            # 4a. posterior mean mu~(x_t, x_0), Eq. (7), and sigma_t^2 = beta_t or beta~_t.
            mean = (abar_prev**0.5 * beta_t / (1 - abar_t)) * x0 + (
                (1 - beta_t) ** 0.5 * (1 - abar_prev) / (1 - abar_t)
            ) * x
            sigma2 = beta_t if variance == "fixedlarge" else beta_t * (1 - abar_prev) / (1 - abar_t)
            x = mean
        else:
            # 4b. DDIM, Song et al. 2021 Eq. (12) with sigma from Eq. (16).
            sigma2 = eta**2 * (1 - abar_prev) / (1 - abar_t) * beta_t
            x = abar_prev**0.5 * x0 + max(1 - abar_prev - sigma2, 0.0) ** 0.5 * eps
        # 5. add noise, except on the last step (Algorithm 2, line 3: z = 0 when t = 1).
        if t_prev >= 0 and sigma2 > 0:
            x = x + sigma2**0.5 * randn(x.shape, generator, x.device)
        yield t, x, x0


def final_sample(steps: Iterator[tuple[int, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Run a reverse process to the end and return its last x (x_0), keeping no intermediate x_t."""
    return deque(steps, maxlen=1)[0][1]


def _sample(
    model: nn.Module, schedule: NoiseSchedule, shape: Sequence[int], generator: Generators, **kwargs
) -> torch.Tensor:
    x_T = randn(shape, generator, schedule.betas.device)
    return final_sample(reverse_steps(model, schedule, x_T, generator=generator, **kwargs))


def ddpm_sample(
    model: nn.Module,
    schedule: NoiseSchedule,
    shape: Sequence[int],
    generator: Generators = None,
    *,
    steps: int | None = None,
    variance: VarianceType = "fixedlarge",
    prediction_type: PredictionType = "eps",
    clip_denoised: bool = True,
    progress: bool = False,
) -> torch.Tensor:
    """Ancestral sampling (Algorithm 2) over all T steps, or over `steps` respaced ones."""
    return _sample(
        model, schedule, shape, generator, sampler="ddpm", steps=steps, variance=variance,
        prediction_type=prediction_type, clip_denoised=clip_denoised, progress=progress,
    )  # fmt: skip


def ddim_sample(
    model: nn.Module,
    schedule: NoiseSchedule,
    shape: Sequence[int],
    generator: Generators = None,
    *,
    steps: int = 50,
    eta: float = 0.0,
    prediction_type: PredictionType = "eps",
    clip_denoised: bool = True,
    progress: bool = False,
) -> torch.Tensor:
    """DDIM sampling with `steps` steps; eta=0 is deterministic given x_T."""
    return _sample(
        model, schedule, shape, generator, sampler="ddim", steps=steps, eta=eta,
        prediction_type=prediction_type, clip_denoised=clip_denoised, progress=progress,
    )  # fmt: skip
