"""How to sample, in one place: `SamplingOptions` (the settings every layer names the same way) and
`reverse_steps`, the one entry point to every reverse process, which yields every intermediate x_t (the
notebook draws the denoising trajectory from it).

The samplers, one file per family: ancestral DDPM, respaced DDPM and DDIM (`diffusion.core.ddpm_ddim`), and
DPM-Solver++(2M) with its SDE variant (`diffusion.core.dpm_solver`). Noise comes from `generator`
(`diffusion.core.noise.Generators`): per-sample noise makes sample i depend only on its own seed, so N samples
split over any number of processes (or batches) are the same as N samples drawn at once. Class-conditional
networks (`model(x, t, y)`) take one label per sample, guided in every sampler (`diffusion.core.guidance`).
"""

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Literal

import torch
from torch import nn

from diffusion.core.ddpm_ddim import ddpm_ddim_steps
from diffusion.core.dpm_solver import dpm_solver_pp_2m_steps
from diffusion.core.noise import Generators
from diffusion.core.schedule import NoiseSchedule, PredictionType
from diffusion.core.variance import VarianceType
from diffusion.errors import check_choice

Sampler = Literal["ddpm", "ddim", "dpmpp_2m", "dpmpp_2m_sde"]


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
    """DDPM's sigma_t^2: fixedlarge = beta_t (default, Ho et al.'s CIFAR-10 choice), fixedsmall = beta~_t, or
    learned_range: the network's own (Nichol & Dhariwal 2021; the default of a model trained with
    --model.variance learned_range)."""
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
    learned_variance: bool = False,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Run the reverse process from x_T, yielding (t, x_{t_prev}, predicted x_0) after every step.

    sampler: "ddpm", "ddim", "dpmpp_2m" (DPM-Solver++(2M), deterministic) or "dpmpp_2m_sde" (its SDE
        variant); see `dpm_solver_pp_2m_steps`.
    steps: how many timesteps to visit, i.e. network evaluations (default: all T for ddpm, 50 for ddim,
        20 for the DPM-Solver++ samplers).
    eta: DDIM stochasticity (0 = deterministic DDIM, 1 = the DDPM posterior variance); DDIM only.
    variance: DDPM's sigma_t^2 = beta_t ("fixedlarge", Ho et al.'s choice for CIFAR-10), the posterior
        variance beta~_t ("fixedsmall"), or the network's interpolation between them ("learned_range", Nichol &
        Dhariwal 2021); with respacing, betas are those of the respaced process. DDPM only.
    labels: (B,) class labels for a class-conditional `model(x, t, y)` (NO_LABEL: none); None calls `model(x, t)`.
    guidance_scale: classifier-free guidance with `labels` (see `guided_output`); every sampler.
    learned_variance: the network outputs 2C channels, its prediction then its variance's v
        (`diffusion.core.variance`); DDIM and DPM-Solver use only the prediction.
    """
    SamplingOptions(sampler, steps, eta, variance, clip_denoised, guidance_scale)  # checks every option
    check_choice("prediction_type", prediction_type, PredictionType)
    if variance == "learned_range" and not learned_variance:
        raise ValueError(
            "variance='learned_range' needs a network that learned its variance — train with --model.variance "
            "learned_range, or sample with fixedlarge or fixedsmall"
        )
    T = schedule.num_timesteps
    if sampler in ("dpmpp_2m", "dpmpp_2m_sde"):
        yield from dpm_solver_pp_2m_steps(
            model, schedule, x_T, steps=steps or min(20, T), prediction_type=prediction_type,
            clip_denoised=clip_denoised, stochastic=sampler == "dpmpp_2m_sde", generator=generator,
            progress=progress, labels=labels, guidance_scale=guidance_scale, learned_variance=learned_variance,
        )  # fmt: skip
        return
    yield from ddpm_ddim_steps(
        model, schedule, x_T, sampler=sampler, steps=steps or (T if sampler == "ddpm" else min(50, T)), eta=eta,
        variance=variance, prediction_type=prediction_type, clip_denoised=clip_denoised, generator=generator,
        progress=progress, labels=labels, guidance_scale=guidance_scale, learned_variance=learned_variance,
    )  # fmt: skip


def final_sample(steps: Iterator[tuple[int, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Run a reverse process to the end and return its last x (x_0), keeping no intermediate x_t."""
    return deque(steps, maxlen=1)[0][1]
