"""Reverse processes as free functions: ancestral DDPM (Ho et al. 2020, Algorithm 2), DDPM on a respaced
subsequence of timesteps (Nichol & Dhariwal 2021) and DDIM (Song et al. 2021).

Both samplers walk a subsequence tau_S > ... > tau_1 of the training timesteps and share one loop,
`reverse_steps`, which yields every intermediate x_t (the notebook draws the denoising trajectory from it).

Noise comes from `generator`: None (global RNG), one torch.Generator, or a list with one generator per
sample. Per-sample generators make sample i depend only on its own seed, so N samples split over any
number of processes (or batches) are the same as N samples drawn at once.

Class-conditional networks (`model(x, t, y)`) take one label per sample (`labels`); classifier-free guidance
(Ho & Salimans 2022) mixes their conditional and unconditional outputs in `guided_output`, one batched forward.
"""

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Literal

import torch
from torch import nn
from tqdm import tqdm

from diffusion.models.embedding import NO_LABEL
from diffusion.schedule import NoiseSchedule, PredictionType, _check_choice

Sampler = Literal["ddpm", "ddim"]
VarianceType = Literal["fixedlarge", "fixedsmall"]
Generators = torch.Generator | Sequence[torch.Generator] | None


@dataclass(frozen=True)
class SamplingOptions:
    """How to run the reverse process: the one place these settings are named and checked.

    Every layer that chooses how to sample holds one (the model's defaults in its checkpoint, `SampleGrid`,
    `FIDCallback`, `python -m diffusion.sample`); a field left None takes the value of the layer below
    (`over`), and finally the defaults of `reverse_steps`.
    """

    sampler: Sampler | None = None
    """ddpm: ancestral sampling (Ho et al. Algorithm 2), respaced when steps < T; ddim: Song et al. 2021."""
    steps: int | None = None
    """Reverse steps: default all T for ddpm, 50 for ddim."""
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
            _check_choice("sampler", self.sampler, Sampler)
        if self.variance is not None:
            _check_choice("variance", self.variance, VarianceType)
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps={self.steps} must be >= 1 (or unset: all T for ddpm, 50 for ddim)")
        if self.eta is not None and not 0.0 <= self.eta <= 1.0:
            raise ValueError(
                f"eta={self.eta} must be in [0, 1]: 0 is deterministic DDIM, 1 the DDPM variance"
            )
        if self.guidance_scale is not None and not self.guidance_scale >= 0:
            raise ValueError(
                f"guidance_scale={self.guidance_scale} must be >= 0: 0 is unconditional, 1 plain conditional, "
                "> 1 guided (Ho & Salimans' w is guidance_scale - 1)"
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

    steps: how many timesteps to visit (default: all T for ddpm, 50 for ddim).
    eta: DDIM stochasticity (0 = deterministic DDIM, 1 = the DDPM posterior variance).
    variance: DDPM's sigma_t^2 = beta_t ("fixedlarge", Ho et al.'s choice for CIFAR-10) or the posterior
        variance beta~_t ("fixedsmall"); with respacing, betas are those of the respaced process.
    labels: (B,) class labels for a class-conditional `model(x, t, y)` (NO_LABEL: none); None calls `model(x, t)`.
    guidance_scale: classifier-free guidance with `labels` (see `guided_output`).
    """
    SamplingOptions(sampler, steps, eta, variance, clip_denoised, guidance_scale)  # checks every option
    _check_choice("prediction_type", prediction_type, PredictionType)
    T = schedule.num_timesteps
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
            abar_prev, one_minus_abar_prev = schedule.alphas_cumprod_at(t_prev_batch, x.ndim)
            x = abar_prev.sqrt() * x0 + (one_minus_abar_prev - sigma2).clamp(min=0).sqrt() * eps
        # 5. add noise, except on the last step (Algorithm 2, line 3: z = 0 when t = 1) and for eta = 0.
        if t_prev >= 0 and (sampler == "ddpm" or eta > 0):
            x = x + sigma2.sqrt() * randn(x.shape, generator, x.device)
        yield t, x, x0


def final_sample(steps: Iterator[tuple[int, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Run a reverse process to the end and return its last x (x_0), keeping no intermediate x_t."""
    return deque(steps, maxlen=1)[0][1]
