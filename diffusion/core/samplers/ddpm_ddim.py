"""Ancestral DDPM (Ho et al. 2020, Algorithm 2), DDPM on a respaced subsequence of timesteps (Nichol & Dhariwal
2021) and DDIM (Song et al. 2021): a loop over a subsequence tau_S > ... > tau_1 of the training timesteps (by
default `uniform_timesteps`); the two differ in step 4, the variance of x_{t_prev}. Both take a zero-terminal-SNR
schedule: their steps need abar_{t_prev} > 0 only, and at abar_T = 0 the posterior's mean is sqrt(abar_prev) x_0. A network with learned variances
(2C output channels, `diffusion.core.variance`) gives DDPM its variance; DDIM uses only its prediction."""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch

from diffusion.core.noise import Generators, randn
from diffusion.core.samplers.contract import Denoiser, Sampler, Step, check_eta, option, timestep_batch
from diffusion.core.schedule import NoiseSchedule
from diffusion.core.variance import VarianceType, reverse_log_variance
from diffusion.errors import InvalidValue, check_choice


@dataclass(frozen=True)
class DDPM(Sampler):
    """Ancestral sampling: x_{t_prev} ~ N(mu~(x_t, x_0), sigma_t^2), over all T steps or respaced."""

    name: ClassVar[str] = "ddpm"
    summary: ClassVar[str] = "ancestral sampling (Ho et al. 2020, Algorithm 2), respaced when steps < T"
    default_steps: ClassVar[int | None] = None

    variance: VarianceType = option(
        "fixedlarge",
        "DDPM's sigma_t^2: fixedlarge = beta_t (Ho et al.'s CIFAR-10 choice), fixedsmall = beta~_t, or "
        "learned_range: the network's own (Nichol & Dhariwal 2021; the default of a model trained with "
        "variance learned_range)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("variance", self.variance, VarianceType)

    @property
    def uses_learned_variance(self) -> bool:
        return self.variance == "learned_range"

    def check_fits(self, schedule: NoiseSchedule, learned_variance: bool, conditional: bool) -> None:
        super().check_fits(schedule, learned_variance, conditional)
        if self.variance == "learned_range" and not learned_variance:
            raise InvalidValue(
                "variance='learned_range' needs a network that learned its variance",
                "train with {DiffusionModule:--variance} learned_range, or sample with fixedlarge or fixedsmall",
            )

    def __call__(
        self, denoiser: Denoiser, x_T: torch.Tensor, noise: Generators = None, progress: bool = False
    ) -> Iterator[Step]:
        schedule = denoiser.schedule
        timesteps = self.timesteps(schedule)
        x = x_T
        for t, t_prev in self.step_pairs(timesteps.tolist(), progress):
            t_batch, t_prev_batch = timestep_batch(t, x), timestep_batch(t_prev, x)
            # 1-2. predicted x_0 and eps (Eq. 15 for eps-prediction), x_0 optionally clipped; v: the learned
            # variance's.
            x0, _, v = self.predict(denoiser, x, t_batch)
            # 3. the posterior q(x_{t_prev} | x_t, x_0) of this (possibly respaced) step, Eq. (6)-(7).
            mean, posterior_variance, beta = schedule.q_posterior(
                x0, x, t_batch, t_prev_batch, check_range=False
            )
            # 4. x_{t_prev} ~ N(mu~, sigma_t^2) with sigma_t^2 = beta_t or beta~_t (Sec. 3.2), or learned:
            # Nichol & Dhariwal Eq. 15 between this (respaced) step's beta and beta~.
            if self.variance == "learned_range":
                log_variance = reverse_log_variance(schedule, self.variance, t_batch, t_prev_batch, x.ndim, v)
                sigma2 = log_variance.exp().to(x.dtype)
            else:
                sigma2 = beta if self.variance == "fixedlarge" else posterior_variance
            x = mean
            # 5. add noise, except on the last step (Algorithm 2, line 3: z = 0 when t = 1).
            if t_prev >= 0:
                x = x + sigma2.sqrt() * randn(x.shape, noise, x.device)
            yield Step(t, x, x0)


@dataclass(frozen=True)
class DDIM(Sampler):
    """Song et al. 2021's generalized reverse process, Eq. (12): deterministic at eta = 0."""

    name: ClassVar[str] = "ddim"
    summary: ClassVar[str] = "DDIM, Song et al. 2021 (deterministic at eta 0)"
    default_steps: ClassVar[int | None] = 50

    eta: float = option(0.0, "DDIM noise in [0, 1]: 0 deterministic, 1 the DDPM posterior variance")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_eta(self.eta, "pass 0 for deterministic DDIM, 1 for the DDPM variance")

    @property
    def deterministic(self) -> bool:
        return self.eta == 0

    def __call__(
        self, denoiser: Denoiser, x_T: torch.Tensor, noise: Generators = None, progress: bool = False
    ) -> Iterator[Step]:
        schedule = denoiser.schedule
        timesteps = self.timesteps(schedule)
        x = x_T
        for t, t_prev in self.step_pairs(timesteps.tolist(), progress):
            t_batch, t_prev_batch = timestep_batch(t, x), timestep_batch(t_prev, x)
            # 1-2. predicted x_0 (optionally clipped) and the eps consistent with it.
            x0, eps, _ = self.predict(denoiser, x, t_batch)
            # 3. the posterior variance beta~ of this (possibly respaced) step, Eq. (7).
            _, posterior_variance, _ = schedule.q_posterior(x0, x, t_batch, t_prev_batch, check_range=False)
            # 4. Eq. (12), with sigma_t^2 = eta^2 beta~_t from Eq. (16).
            sigma2 = self.eta**2 * posterior_variance
            log_abar_prev = schedule.log_alphas_cumprod_at(t_prev_batch, x.ndim, check_range=False)
            coef_eps = (-torch.expm1(log_abar_prev) - sigma2.double()).clamp(min=0).sqrt()
            x = log_abar_prev.mul(0.5).exp().to(x.dtype) * x0 + coef_eps.to(x.dtype) * eps
            # 5. add noise, except on the last step and for eta = 0.
            if t_prev >= 0 and self.eta > 0:
                x = x + sigma2.sqrt() * randn(x.shape, noise, x.device)
            yield Step(t, x, x0)
