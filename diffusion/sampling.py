"""Reverse processes as free functions: ancestral DDPM (Ho et al. 2020, Algorithm 2), DDPM on a respaced
subsequence of timesteps (Nichol & Dhariwal 2021), DDIM (Song et al. 2021) and DPM-Solver++(2M) (Lu et al.
2022, "DPM-Solver++: Fast Solver for Guided Sampling of Diffusion Probabilistic Models", Algorithm 2), with
its stochastic (SDE) variant.

All samplers walk a subsequence tau_S > ... > tau_1 of the training timesteps behind one entry point,
`reverse_steps`, which yields every intermediate x_t (the notebook draws the denoising trajectory from it).
DDPM and DDIM share its loop; DPM-Solver++(2M), a second-order multistep solver of the probability-flow
ODE, is `dpm_solver_pp_2m_steps`, which `reverse_steps` calls for ``sampler="dpmpp_2m"`` (and, solving the
reverse SDE instead, for ``"dpmpp_2m_sde"``).

Noise comes from `generator`: None (global RNG), one torch.Generator, a `PerSampleNoise` (counter-based
noise keyed by each sample's index, diffusion/noise.py) or a list with one generator per sample. Per-sample
noise makes sample i depend only on its own seed, so N samples split over any number of processes (or
batches) are the same as N samples drawn at once.

Class-conditional networks (`model(x, t, y)`) take one label per sample (`labels`); classifier-free guidance
(Ho & Salimans 2022) mixes their conditional and unconditional outputs (`guided_output`), one batched forward,
in every sampler.
"""

import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Literal

import torch
from torch import nn
from tqdm import tqdm

from diffusion.errors import check_choice
from diffusion.models.embedding import NO_LABEL
from diffusion.noise import PerSampleNoise
from diffusion.schedule import NoiseSchedule, PredictionType

Sampler = Literal["ddpm", "ddim", "dpmpp_2m", "dpmpp_2m_sde"]
VarianceType = Literal["fixedlarge", "fixedsmall"]
Generators = torch.Generator | PerSampleNoise | Sequence[torch.Generator] | None


@dataclass(frozen=True)
class SamplingOptions:
    """How to run the reverse process: the one place these settings are named and checked.

    Every layer that chooses how to sample holds one (the model's defaults in its checkpoint, `SampleGrid`,
    `FIDCallback`, `python -m diffusion.sample`); a field left None takes the value of the layer below
    (`over`), and finally the defaults of `reverse_steps`.
    """

    sampler: Sampler | None = None
    """ddpm: ancestral sampling (Ho et al. Algorithm 2), respaced when steps < T; ddim: Song et al. 2021;
    dpmpp_2m: DPM-Solver++(2M), Lu et al. 2022 (deterministic, few steps); dpmpp_2m_sde: its SDE variant."""
    steps: int | None = None
    """Reverse steps (network evaluations): default all T for ddpm, 50 for ddim, 20 for the dpmpp samplers."""
    eta: float | None = None
    """DDIM noise in [0, 1]: 0 (default) is deterministic, 1 the DDPM posterior variance."""
    variance: VarianceType | None = None
    """DDPM's sigma_t^2: fixedlarge = beta_t (default, Ho et al.'s CIFAR-10 choice) or fixedsmall = beta~_t."""
    clip_denoised: bool | None = None
    """Clip the predicted x_0 to [-1, 1] at every step (default true)."""
    guidance_scale: float | None = None
    """Classifier-free guidance s for class-conditional models: eps = eps_uncond + s (eps_cond - eps_uncond);
    1 (default) plain conditional sampling, 0 unconditional, > 1 guided. Ignored without labels."""

    def __post_init__(self) -> None:
        if self.sampler is not None:
            check_choice("sampler", self.sampler, Sampler)
        if self.variance is not None:
            check_choice("variance", self.variance, VarianceType)
        if self.steps is not None and self.steps < 1:
            raise ValueError(
                f"steps={self.steps} must be >= 1 — pass a step count, or leave it unset (all T for ddpm, 50 "
                "for ddim, 20 for dpmpp)"
            )
        if self.eta is not None and not 0.0 <= self.eta <= 1.0:
            raise ValueError(
                f"eta={self.eta} must be in [0, 1] — pass 0 for deterministic DDIM, 1 for the DDPM variance"
            )
        if self.guidance_scale is not None and not (
            math.isfinite(self.guidance_scale) and self.guidance_scale >= 0
        ):
            raise ValueError(
                f"guidance_scale={self.guidance_scale} must be a finite number >= 0 — pass 0 for unconditional, "
                "1 for plain conditional, > 1 for guided (Ho & Salimans' w is guidance_scale - 1)"
            )

    def check_steps_fit(self, num_timesteps: int, flag: str) -> None:
        """Steps beyond the schedule, refused when a run starts rather than at its first validation."""
        if self.steps is not None and self.steps > num_timesteps:
            raise ValueError(
                f"{flag} {self.steps} is more steps than the schedule's num_timesteps={num_timesteps} — pass at "
                f"most {num_timesteps}, or leave it unset"
            )

    def over(self, base: "SamplingOptions | None") -> "SamplingOptions":
        """These options on top of `base`: a field set here wins, an unset one comes from `base`."""
        if base is None:
            return self
        return SamplingOptions(
            **{f.name: getattr(base, f.name) if getattr(self, f.name) is None else getattr(self, f.name)
               for f in fields(self)}
        )  # fmt: skip

    def as_kwargs(self) -> dict:
        """The fields that are set, as keyword arguments of `reverse_steps`."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


DEFER = SamplingOptions()
"""Every field unset: each defers to the layer below (the default of the callbacks' and the module's options)."""


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


def guided_output(
    model: nn.Module,
    x: torch.Tensor,
    t: torch.Tensor,
    labels: torch.Tensor | None,
    guidance_scale: float = 1.0,
) -> torch.Tensor:
    """The network output at (x, t), float32, with classifier-free guidance (Ho & Salimans 2022, Eq. 6):
    out = out_uncond + s (out_cond - out_uncond), both halves from one forward of the doubled batch.

    The output is guided in the space the network predicts (eps, x0 or v). Each of them is an affine function of
    eps at a fixed (x_t, t) with the same coefficients for both halves, so this is exactly eps-space guidance
    (`eps_uncond + s (eps_cond - eps_uncond)`) for every prediction type, and no conversion is needed.
    s = 1 and s = 0 need only one half: the conditional or the unconditional output (NO_LABEL).
    """
    if labels is None:
        return model(x, t).float()
    if guidance_scale == 1:
        return model(x, t, labels).float()
    unconditional = torch.full_like(labels, NO_LABEL)
    if guidance_scale == 0:
        return model(x, t, unconditional).float()
    both = model(
        torch.cat([x, x]), torch.cat([t, t]), torch.cat([labels, unconditional])
    ).float()  # (2B, ...)
    conditional, unconditional_output = both.chunk(2)
    return unconditional_output + guidance_scale * (conditional - unconditional_output)


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
    labels: torch.Tensor | None = None,
    guidance_scale: float = 1.0,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Run the reverse process from x_T, yielding (t, x_{t_prev}, predicted x_0) after every step.

    sampler: "ddpm", "ddim", "dpmpp_2m" (DPM-Solver++(2M), deterministic) or "dpmpp_2m_sde" (its SDE
        variant); see `dpm_solver_pp_2m_steps`.
    steps: how many timesteps to visit, i.e. network evaluations (default: all T for ddpm, 50 for ddim,
        20 for the DPM-Solver++ samplers).
    eta: DDIM stochasticity (0 = deterministic DDIM, 1 = the DDPM posterior variance); DDIM only.
    variance: DDPM's sigma_t^2 = beta_t ("fixedlarge", Ho et al.'s choice for CIFAR-10) or the posterior
        variance beta~_t ("fixedsmall"); with respacing, betas are those of the respaced process. DDPM only.
    labels: (B,) class labels for a class-conditional `model(x, t, y)` (NO_LABEL: none); None calls `model(x, t)`.
    guidance_scale: classifier-free guidance with `labels` (see `guided_output`); every sampler.
    """
    SamplingOptions(sampler, steps, eta, variance, clip_denoised, guidance_scale)  # checks every option
    check_choice("prediction_type", prediction_type, PredictionType)
    T = schedule.num_timesteps
    if sampler in ("dpmpp_2m", "dpmpp_2m_sde"):
        yield from dpm_solver_pp_2m_steps(
            model, schedule, x_T, steps=steps or min(20, T), prediction_type=prediction_type,
            clip_denoised=clip_denoised, stochastic=sampler == "dpmpp_2m_sde", generator=generator,
            progress=progress, labels=labels, guidance_scale=guidance_scale,
        )  # fmt: skip
        return
    timesteps = spaced_timesteps(T, steps or (T if sampler == "ddpm" else min(50, T))).tolist()
    x = x_T
    batch = x.shape[0]
    pairs = list(zip(reversed(timesteps), [*reversed(timesteps[:-1]), -1], strict=True))
    for t, t_prev in tqdm(pairs, desc=f"{sampler} sampling", disable=not progress, leave=False):
        t_batch = torch.full((batch,), t, device=x.device, dtype=torch.long)
        t_prev_batch = torch.full_like(t_batch, t_prev)
        # 1. predict x_0 and eps from the network output (Eq. 15 for eps-prediction).
        output = guided_output(model, x, t_batch, labels, guidance_scale)
        x0, eps = schedule.split_prediction(prediction_type, x, t_batch, output)
        # 2. optionally clip predicted x_0 to the data range, and keep eps consistent with it.
        if clip_denoised:
            x0 = x0.clamp(-1, 1)
            eps = schedule.predict_eps_from_x0(x, t_batch, x0)
        # 3. the posterior q(x_{t_prev} | x_t, x_0) of this (possibly respaced) step, Eq. (6)-(7).
        mean, posterior_variance, beta = schedule.q_posterior(x0, x, t_batch, t_prev_batch)
        if sampler == "ddpm":
            # 4a. x_{t_prev} ~ N(mu~, sigma_t^2) with sigma_t^2 = beta_t or beta~_t (Sec. 3.2).
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
        output = guided_output(model, x, t_batch, labels, guidance_scale)
        x0, _ = schedule.split_prediction(prediction_type, x, t_batch, output)
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


def final_sample(steps: Iterator[tuple[int, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Run a reverse process to the end and return its last x (x_0), keeping no intermediate x_t."""
    return deque(steps, maxlen=1)[0][1]
