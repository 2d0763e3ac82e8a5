"""What every sampler is and what it is given: one object, one signature.

A sampler is a frozen dataclass whose fields are its options, checked in its `__post_init__`, and whose call runs
the reverse process from x_T:

    sampler(denoiser, x_T, noise=None, progress=False) -> Iterator[Step]

- `denoiser` (`Denoiser`): the network as samplers see it. `sampler.predict(denoiser, x, t)` is step 1 of every
  sampler: the predicted x_0 and eps at (x_t, t), whatever the network predicts (eps, x0 or v), guided by
  `guidance_scale` for the labels the denoiser carries and clipped when `clip_denoised`; and the network's v
  when it learned its variances.
- `x_T` (B, ...): the initial noise, drawn at t = T - 1. `noise` (`diffusion.core.noise.Generators`): where any
  further noise comes from, `randn(shape, noise, device)`. With `PerSampleNoise`, draw k of sample i depends only
  on (seed, k, i), so a sample does not depend on the batch or the rank it is drawn in.
- Yields a `Step(t, x, x0)` after every step (the notebook draws the trajectory from them); the last x is the
  sample.

Class attributes say what a sampler is: `name` (its key in `diffusion.core.sampling.SAMPLERS` and the value of
`--sampler`), `summary` (one line of --help), `default_steps` (None: every timestep of the schedule), and what it
takes: classifier-free guidance, a network with learned variances, a schedule with alpha_bar_T = 0 (zero terminal
SNR). `check_fits` (called by `DiffusionModule.sampler` and `reverse_steps`) refuses the others in one line before
any time is spent: a sampler that cannot take one says so with one class attribute. Two properties say what the
contract test may expect: `deterministic` (x_T alone fixes the sample) and `uses_learned_variance`. The timesteps
it visits come from its `spacing` option (`diffusion.core.samplers.spacing`; each sampler has its own default).
`steps` counts the timesteps visited (one `Step` each); `evaluations(steps)` the network evaluations a sample
costs (a guided evaluation's doubled batch is one), which differ for samplers with several evaluations a step.
With `compile`, the denoiser's evaluation runs compiled (`diffusion.core.compiling`).

An option is declared with `option(default, help)`: `SamplingOptions`, the commands' flags and their --help are
made from these fields, so a new option needs no other line.
"""

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn
from tqdm import tqdm

from diffusion.core.compiling import compiled
from diffusion.core.guidance import guided_output
from diffusion.core.noise import Generators
from diffusion.core.samplers.spacing import Spacing, check_steps, spaced_timesteps
from diffusion.core.schedule import NoiseSchedule, PredictionType
from diffusion.core.variance import check_output_fits, split_output
from diffusion.errors import InvalidValue, OutOfRange, WrongType, check_choice

SPACING_HELP = (
    "the timesteps visited (diffusion/core/samplers/spacing.py): uniform (both ends), trailing (from T - 1, "
    "Lin et al. 2024), log_snr (even in log-SNR, DPM-Solver) or karras (Karras et al. 2022's sigmas, rho 7)"
)


def option(default: Any, help: str) -> Any:
    """A sampler option: a dataclass field with its help, which `SamplingOptions` and the commands' flags read."""
    return field(default=default, metadata={"help": help})


def check_eta(eta: float, fix: str) -> None:
    """A sampler's noise scale eta (DDIM's, Euler ancestral's) lies in [0, 1]: 0 deterministic, 1 ancestral."""
    if not 0.0 <= eta <= 1.0:
        raise OutOfRange("eta", eta, "in [0, 1]", fix)


class Step(NamedTuple):
    """What a sampler yields after every step: the timestep it stepped from, x_{t_prev} and the predicted x_0."""

    t: int
    x: torch.Tensor
    x0: torch.Tensor


class Prediction(NamedTuple):
    """The network's answer at (x_t, t): x_0 (clipped when asked), the eps consistent with it, and v, the learned
    variance's interpolation (`diffusion.core.variance`; None for a network with fixed variances)."""

    x0: torch.Tensor
    eps: torch.Tensor
    v: torch.Tensor | None


@dataclass(frozen=True)
class Denoiser:
    """The network as every sampler sees it: `model(x_t, t)` or, with `labels`, `model(x_t, t, labels)` (one class
    per sample, NO_LABEL for none), whose output is eps, x_0 or v (`prediction_type`), followed by its learned
    variance's v when `learned_variance` (2C channels)."""

    network: nn.Module
    schedule: NoiseSchedule
    prediction_type: PredictionType = "eps"
    learned_variance: bool = False
    labels: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.prediction_type == "eps" and self.schedule.zero_terminal_snr:
            raise InvalidValue(
                "eps-prediction is undefined at alpha_bar_T = 0 (zero terminal SNR: x_0 = (x_T - eps) / 0)",
                "train with {DiffusionModule:--prediction_type} v (Lin et al. 2024), or without "
                "{DiffusionModule:--zero_terminal_snr}",
            )

    def __call__(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        guidance_scale: float,
        clip_denoised: bool,
        compile: bool = False,
    ) -> Prediction:
        """x_0, eps and v at (x, t) for t (B,) int64: guided (`guided_output`), x_0 clipped to [-1, 1] when
        `clip_denoised` and eps then recomputed from it, so the two stay consistent (Ho et al., Eq. 15).
        With `compile`, all of it runs as one compiled graph (`diffusion.core.compiling`)."""
        args = (self.network, self.schedule, self.prediction_type, self.learned_variance, self.labels, x, t)
        with torch.no_grad():  # the network's parameters need gradients in training; sampling never does
            if not compile:
                return Prediction(*evaluate(*args, guidance_scale, clip_denoised))
            return Prediction(*compiled(evaluate, x.device)(*args, guidance_scale, clip_denoised))


def evaluate(
    network: nn.Module, schedule: NoiseSchedule, prediction_type: PredictionType, learned_variance: bool,
    labels: torch.Tensor | None, x: torch.Tensor, t: torch.Tensor, guidance_scale: float, clip_denoised: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """What `Denoiser` computes, as a plain function of tensors and settings (which torch.compile traces)."""
    output = guided_output(network, x, t, labels, guidance_scale, learned_variance)
    check_output_fits(output, x, learned_variance)  # said of the network, not of a formula's `output`
    prediction, v = split_output(output, learned_variance)
    x0, eps = schedule.split_prediction(prediction_type, x, t, prediction, check_range=False)
    if clip_denoised:
        x0 = x0.clamp(-1, 1)
        eps = schedule.predict_eps_from_x0(x, t, x0, check_range=False)
    return x0, eps, v


@dataclass(frozen=True)
class Sampler:
    """The options every sampler has, and what the contract gives every sampler (see the module's docstring)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    default_steps: ClassVar[int | None] = None
    takes_guidance: ClassVar[bool] = True
    takes_learned_variance: ClassVar[bool] = True
    takes_zero_terminal_snr: ClassVar[bool] = True

    steps: int | None = option(None, "reverse steps: the timesteps visited, one network evaluation each")
    clip_denoised: bool = option(True, "clip the predicted x_0 to [-1, 1] at every step")
    guidance_scale: float = option(
        1.0,
        "classifier-free guidance s for class-conditional models: eps = eps_uncond + s (eps_cond - eps_uncond); "
        "1 plain conditional sampling, 0 unconditional, > 1 guided. Ignored without labels",
    )
    spacing: Spacing = option("uniform", SPACING_HELP)
    compile: bool = option(
        False,
        "compile the network's evaluation (torch.compile) once for the whole loop, with fixed shapes; on a CUDA "
        "GPU with CUDA graphs (mode reduce-overhead). The first batch pays the compilation",
    )

    def __post_init__(self) -> None:
        check_choice("spacing", self.spacing, Spacing)
        if self.steps is not None and self.steps < 1:
            raise OutOfRange(
                "steps", self.steps, ">= 1", "pass a step count, or leave it unset for the sampler's default"
            )
        if not (math.isfinite(self.guidance_scale) and self.guidance_scale >= 0):
            raise OutOfRange(
                "guidance_scale", self.guidance_scale, "a finite number >= 0",
                "pass 0 for unconditional, 1 for plain conditional, > 1 for guided (Ho & Salimans' w is "
                "guidance_scale - 1)",
            )  # fmt: skip

    def __call__(
        self, denoiser: Denoiser, x_T: torch.Tensor, noise: Generators = None, progress: bool = False
    ) -> Iterator[Step]:
        raise NotImplementedError(f"{type(self).__name__} does not implement the reverse process")

    @classmethod
    def default_steps_text(cls) -> str:
        return "all T" if cls.default_steps is None else str(cls.default_steps)

    def steps_for(self, num_timesteps: int) -> int:
        """The steps this sampler takes on a schedule of `num_timesteps`: its option, else its default (capped
        at T)."""
        if self.steps is not None:
            return self.steps
        return num_timesteps if self.default_steps is None else min(self.default_steps, num_timesteps)

    def timesteps(self, schedule: NoiseSchedule) -> torch.Tensor:
        """The training timesteps this sampler visits on `schedule`, ascending (int64): `spacing`'s rule."""
        return spaced_timesteps(self.spacing, schedule.alphas_cumprod, self.steps_for(schedule.num_timesteps))

    @classmethod
    def evaluations(cls, steps: int) -> int:
        """Network evaluations per sample of `steps` steps (a guided evaluation's doubled batch counts once)."""
        return steps

    @property
    def deterministic(self) -> bool:
        """Whether x_T alone fixes the sample (no noise is drawn after it)."""
        return False

    @property
    def uses_learned_variance(self) -> bool:
        """Whether the steps use a learned variance's v (a sampler taking such a network may use only its
        prediction)."""
        return False

    def check_fits(self, schedule: NoiseSchedule, learned_variance: bool, conditional: bool) -> None:
        """Refuse in one line what this sampler cannot sample: guidance (of a class-conditional model), a network
        with learned variances, a schedule that ends at alpha_bar_T = 0, more steps than the schedule's (refused
        here, as the sampler is built, not at its first sample)."""
        check_steps(schedule.num_timesteps, self.steps_for(schedule.num_timesteps))
        if conditional and self.guidance_scale != 1 and not self.takes_guidance:
            raise InvalidValue(
                f"sampler {self.name} does not take classifier-free guidance (guidance_scale="
                f"{self.guidance_scale:g})",
                "pass guidance_scale 1, or choose another sampler",
            )
        if learned_variance and not self.takes_learned_variance:
            raise InvalidValue(
                f"sampler {self.name} does not take a network with learned variances",
                "choose another sampler",
            )
        if not self.takes_zero_terminal_snr and schedule.zero_terminal_snr:
            raise InvalidValue(
                f"sampler {self.name} does not take a schedule with alpha_bar_T = 0 (zero terminal SNR)",
                "choose another sampler",
            )

    def predict(self, denoiser: Denoiser, x: torch.Tensor, t: torch.Tensor) -> Prediction:
        """Step 1 of every sampler: the denoiser at (x, t), guided and clipped as this sampler's options say."""
        return denoiser(x, t, self.guidance_scale, self.clip_denoised, self.compile)

    def step_pairs(self, timesteps: Sequence[int], progress: bool) -> Iterable[tuple[int, int]]:
        """(t, t_prev) over ascending `timesteps` from the largest down, t_prev = -1 (the data) last, under a
        progress bar when asked."""
        timesteps = list(timesteps)
        pairs = list(zip(reversed(timesteps), [*reversed(timesteps[:-1]), -1], strict=True))
        return tqdm(pairs, desc=f"{self.name} sampling", disable=not progress, leave=False)


def timestep_batch(t: int, x: torch.Tensor) -> torch.Tensor:
    """t for every sample of x: (B,) int64 on x's device, as networks take it."""
    return torch.full((x.shape[0],), t, device=x.device, dtype=torch.long)


def final_sample(steps: Iterator[Step]) -> torch.Tensor:
    """Run a reverse process to the end and return its last x (x_0), keeping no intermediate x_t."""
    if isinstance(steps, torch.Tensor) or not isinstance(steps, Iterable):
        raise WrongType(
            "steps", steps, "the steps of a reverse process", "pass final_sample(reverse_steps(...))"
        )
    last = deque(steps, maxlen=1)
    if not last or not isinstance(last[0], Step):
        raise WrongType(
            "steps", steps, "the steps of a reverse process (it yielded no Step)",
            "pass what reverse_steps or module.trajectory returns",
        )  # fmt: skip
    return last[0].x
