"""Samplers in Karras et al.'s sigma form (Karras et al. 2022, "Elucidating the Design Space of Diffusion-Based
Generative Models", EDM): Heun's second-order method (Algorithm 1) with their stochastic churn (Algorithm 2), and
Euler ancestral (Crowson's k-diffusion, ``sample_euler_ancestral``), on Karras et al.'s sigmas by default.

The variance-preserving x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps of this project is, divided by sqrt(abar_t),
Karras et al.'s x~ = x_0 + sigma_t eps with sigma_t = sqrt((1 - abar_t) / abar_t) (their "VP" column, Table 1,
on a discrete schedule). The probability-flow ODE is then dx~/dsigma = (x~ - D(x~; sigma)) / sigma = eps, with
D the predicted x_0; the samplers step in x~ and keep x = sqrt(abar) x~, which the network takes. Every sigma a
sampler visits is a training timestep's (`spacing.nearest_timesteps`), so the network is always asked at the t it
was trained at, and the steps use that t's sigma. On a zero-terminal-SNR schedule sigma_{T-1} is infinite and
x~ is not defined there; the step from it is written as x~' = D + sigma' eps, the limit of Euler's step.
"""

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch

from diffusion.core.noise import Generators, randn
from diffusion.core.samplers.contract import (
    SPACING_HELP,
    Denoiser,
    Sampler,
    Step,
    check_eta,
    option,
    timestep_batch,
)
from diffusion.core.samplers.spacing import Spacing, half_log_snr, nearest_timestep
from diffusion.errors import InvalidValue, OutOfRange


class NoiseLevels:
    """sigma_t and sqrt(abar_t) as plain floats from a CPU copy of the schedule (no device sync per step);
    t = -1 is the data (sigma 0, abar 1)."""

    def __init__(self, alphas_cumprod: torch.Tensor) -> None:
        self.alphas_cumprod = alphas_cumprod.double().cpu()
        self.lambdas = half_log_snr(self.alphas_cumprod)  # sigma = exp(-lambda); -inf where abar = 0

    def sigma(self, t: int) -> float:
        return 0.0 if t < 0 else math.exp(-self.lambdas[t].item())

    def sqrt_alphas_cumprod(self, t: int) -> float:
        return 1.0 if t < 0 else self.alphas_cumprod[t].sqrt().item()

    def nearest(self, sigma: float) -> int:
        """The training timestep nearest `sigma` in log sigma."""
        return nearest_timestep(self.lambdas, sigma)


@dataclass(frozen=True)
class Heun(Sampler):
    """Karras et al.'s Heun sampler: Algorithm 1 (deterministic, s_churn = 0) and Algorithm 2 (stochastic).

    For sigma_0 > ... > sigma_{N-1} (the `steps` timesteps' sigmas) and sigma_N = 0, step i:
      1. churn (Algorithm 2): gamma = min(s_churn / N, sqrt(2) - 1) where s_tmin <= sigma_i <= s_tmax, else 0;
         sigma^ = the training sigma nearest (1 + gamma) sigma_i in log sigma (sigma_i itself when it is
         nearest: no churn), x~^ = x~_i + sqrt(sigma^2 - sigma_i^2) s_noise z.
      2. D and eps = (x~^ - D) / sigma^ at (x~^, sigma^): the Euler step x~' = x~^ + (sigma_{i+1} - sigma^) eps.
      3. unless sigma_{i+1} = 0, Heun's correction: eps' at (x~', sigma_{i+1}), then
         x~_{i+1} = x~^ + (sigma_{i+1} - sigma^) (eps + eps') / 2.
    Network evaluations: 2 a step but the last (to sigma = 0), where Euler's step is exact for the predicted x_0:
    `steps` N costs 2N - 1 (Karras et al.'s CIFAR-10 setting, N = 18, is 35). At an infinite sigma (zero
    terminal SNR) the first step is Euler's alone, one evaluation fewer.
    """

    name: ClassVar[str] = "heun"
    summary: ClassVar[str] = (
        "Heun's 2nd-order method, Karras et al. 2022 (EDM; 2 evaluations a step but the last)"
    )
    default_steps: ClassVar[int | None] = 18

    steps: int | None = option(
        None,
        "heun: Karras et al.'s N, the sigmas visited, at 2 network evaluations each but the last (2N - 1)",
    )
    spacing: Spacing = option("karras", SPACING_HELP)
    s_churn: float = option(
        0.0, "Karras et al.'s S_churn: noise added back before each step, gamma = min(S_churn / N, sqrt 2 - 1); 0 "
        "deterministic (Algorithm 1)",
    )  # fmt: skip
    s_tmin: float = option(0.0, "Karras et al.'s S_tmin: churn only at sigma >= s_tmin")
    s_tmax: float = option(math.inf, "Karras et al.'s S_tmax: churn only at sigma <= s_tmax")
    s_noise: float = option(1.0, "Karras et al.'s S_noise: the churn noise's standard deviation")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("s_churn", "s_tmin", "s_noise"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise OutOfRange(name, value, "a finite number >= 0", "pass e.g. 0 (Karras et al.'s)")
        if math.isnan(self.s_tmax):  # below nothing: not a bound at all (inf, the default, is none)
            fix = "pass e.g. 50, or leave it out for no bound"
            raise OutOfRange("s_tmax", self.s_tmax, "a number (inf: no bound)", fix)
        if not self.s_tmax >= self.s_tmin:
            raise InvalidValue(  # the options said as a command's flags there (`--s_tmax 1.0 is below ...`)
                f"{{--s_tmax}} {self.s_tmax} is below {{--s_tmin}} {self.s_tmin}",
                "pass {--s_tmax} >= {--s_tmin} (default: no bound)",
            )

    @property
    def deterministic(self) -> bool:
        return self.s_churn == 0

    @classmethod
    def evaluations(cls, steps: int) -> int:
        return 2 * steps - 1

    def __call__(
        self, denoiser: Denoiser, x_T: torch.Tensor, noise: Generators = None, progress: bool = False
    ) -> Iterator[Step]:
        levels = NoiseLevels(denoiser.schedule.alphas_cumprod)
        timesteps = self.timesteps(denoiser.schedule).tolist()
        gamma = min(self.s_churn / len(timesteps), math.sqrt(2) - 1)
        x = x_T
        for t, t_next in self.step_pairs(timesteps, progress):
            sigma, sigma_next = levels.sigma(t), levels.sigma(t_next)
            scale_next = levels.sqrt_alphas_cumprod(t_next)
            # 1. churn: raise the noise to a training sigma near (1 + gamma) sigma (x~ scaled back to x).
            t_hat = t
            if gamma > 0 and math.isfinite(sigma) and self.s_tmin <= sigma <= self.s_tmax:
                t_hat = max(levels.nearest((1 + gamma) * sigma), t)
            sigma_hat, scale_hat = levels.sigma(t_hat), levels.sqrt_alphas_cumprod(t_hat)
            if t_hat != t:
                added = math.sqrt(sigma_hat**2 - sigma**2) * self.s_noise
                x_tilde = x / levels.sqrt_alphas_cumprod(t) + added * randn(x.shape, noise, x.device)
                x = scale_hat * x_tilde
            # 2. D and eps at sigma^, then Euler's step x~' = D + sigma_{i+1} eps (= x~^ + (sigma_{i+1} - sigma^) eps).
            x0, eps, _ = self.predict(denoiser, x, timestep_batch(t_hat, x))
            x_next = scale_next * (x0 + sigma_next * eps)
            # 3. Heun's correction with eps' at sigma_{i+1}, except to sigma = 0 and from sigma = inf.
            if t_next >= 0 and math.isfinite(sigma_hat):
                _, eps_next, _ = self.predict(denoiser, x_next, timestep_batch(t_next, x))
                x_tilde_next = x / scale_hat + (sigma_next - sigma_hat) * (eps + eps_next) / 2
                x_next = scale_next * x_tilde_next
            x = x_next
            yield Step(t, x, x0)


@dataclass(frozen=True)
class EulerAncestral(Sampler):
    """Euler ancestral (k-diffusion's ``sample_euler_ancestral``): from sigma to sigma', an Euler step of the ODE
    down to sigma_down, then fresh noise up to sigma':

        sigma_up = eta sqrt(sigma'^2 (sigma^2 - sigma'^2) / sigma^2),  sigma_down = sqrt(sigma'^2 - sigma_up^2),
        x~' = D + sigma_down eps + sigma_up z.

    In this parameterisation the step is DDIM's (Song et al. 2021, Eq. 12) with the same eta
    (tests/core/test_karras_samplers.py checks it): what differs is Karras et al.'s sigmas and eta = 1 by
    default (the DDPM posterior's variance). k-diffusion's eta > 1 (sigma_up capped at sigma') is not offered:
    it adds more noise than the step removes. One network evaluation a step.
    """

    name: ClassVar[str] = "euler_ancestral"
    summary: ClassVar[str] = "Euler ancestral (k-diffusion; stochastic, Karras et al.'s sigmas)"
    default_steps: ClassVar[int | None] = 35

    spacing: Spacing = option("karras", SPACING_HELP)
    eta: float = option(
        1.0,
        "euler_ancestral: the noise of each step in [0, 1]: 0 deterministic (DDIM), 1 k-diffusion's default",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_eta(self.eta, "pass 1 for ancestral steps, 0 for deterministic")

    @property
    def deterministic(self) -> bool:
        return self.eta == 0

    def __call__(
        self, denoiser: Denoiser, x_T: torch.Tensor, noise: Generators = None, progress: bool = False
    ) -> Iterator[Step]:
        levels = NoiseLevels(denoiser.schedule.alphas_cumprod)
        x = x_T
        for t, t_next in self.step_pairs(self.timesteps(denoiser.schedule).tolist(), progress):
            sigma, sigma_next = levels.sigma(t), levels.sigma(t_next)
            # 1. D and eps at (x_t, t).
            x0, eps, _ = self.predict(denoiser, x, timestep_batch(t, x))
            # 2. the ancestral split of sigma' (sigma' / sigma = 0 from an infinite sigma: zero terminal SNR).
            sigma_up = self.eta * sigma_next * math.sqrt(1 - (sigma_next / sigma) ** 2)
            sigma_down = math.sqrt(sigma_next**2 - sigma_up**2)
            # 3. the Euler step to sigma_down, then noise up to sigma' (none on the last step: sigma' = 0).
            scale_next = levels.sqrt_alphas_cumprod(t_next)
            x = scale_next * (x0 + sigma_down * eps)
            if sigma_up > 0:
                x = x + scale_next * sigma_up * randn(x.shape, noise, x.device)
            yield Step(t, x, x0)
