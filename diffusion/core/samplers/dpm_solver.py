"""DPM-Solver++(2M) (Lu et al. 2022, "DPM-Solver++: Fast Solver for Guided Sampling of Diffusion Probabilistic
Models", Algorithm 2), a second-order multistep solver of the probability-flow ODE, and its stochastic (SDE)
variant, by default on timesteps spread evenly in the half log-SNR (`spacing` log_snr; karras, uniform or trailing
on request)."""

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch

from diffusion.core.noise import Generators, randn
from diffusion.core.samplers.contract import SPACING_HELP, Denoiser, Sampler, Step, option, timestep_batch
from diffusion.core.samplers.spacing import Spacing, half_log_snr


@dataclass(frozen=True)
class DPMSolverPP2M(Sampler):
    """DPM-Solver++(2M) from x_T, deterministic: x_T fixes the sample.

    The multistep second-order solver of the probability-flow ODE in its data-prediction form (Lu et al. 2022,
    Algorithm 2), with alpha_t = sqrt(abar_t), sigma_t = sqrt(1 - abar_t), lambda_t = log(alpha_t / sigma_t)
    and h = lambda_{t_prev} - lambda_t:

        x_{t_prev} = (sigma_{t_prev} / sigma_t) x_t - alpha_{t_prev} (e^{-h} - 1) D,
        D = (1 + 1 / (2 r)) x0(x_t, t) - 1 / (2 r) x0(x_{t_last}, t_last),  r = h_last / h,

    where t_last is the timestep visited before t. The first step has no earlier x0 and is first order
    (D = x0: a DDIM step). The `steps` timesteps are spread evenly in lambda by default (`spacing`), from
    T - 1 down to 0, one network evaluation each; the last step goes from t = 0 to the data (sigma = 0,
    lambda = infinity), where the first-order update is exact and returns the predicted x0 itself (DDIM's
    last step too; the reference code's ``denoise_to_zero``). With clip_denoised, the predicted x0 is
    clipped to [-1, 1] before it enters D (static thresholding, as DPM-Solver++ allows for data prediction).
    Guided x0 is the data prediction DPM-Solver++ was designed for (Lu et al.'s "guided sampling"). With
    learned variances the solver uses only the prediction (its steps have no free variance to learn). At
    alpha_bar_T = 0 (zero terminal SNR) lambda_{T-1} = -inf: h = inf, e^{-h} = 0, and the first step is DDIM's
    from pure noise; the second, with r = h_last / h = inf, is first order too.
    """

    name: ClassVar[str] = "dpmpp_2m"
    summary: ClassVar[str] = "DPM-Solver++(2M), Lu et al. 2022 (deterministic, few steps)"
    default_steps: ClassVar[int | None] = 20
    stochastic: ClassVar[bool] = False

    spacing: Spacing = option("log_snr", SPACING_HELP)

    @property
    def deterministic(self) -> bool:
        return not self.stochastic

    def __call__(
        self, denoiser: Denoiser, x_T: torch.Tensor, noise: Generators = None, progress: bool = False
    ) -> Iterator[Step]:
        schedule = denoiser.schedule
        timesteps = self.timesteps(schedule)
        # Plain floats from a CPU copy: no device sync per step.
        alphas_cumprod = schedule.alphas_cumprod.double().cpu()
        lambdas = half_log_snr(alphas_cumprod)
        x = x_T
        x0_last, h_last = None, None
        for t, t_prev in self.step_pairs(timesteps.tolist(), progress):
            # 1. the data prediction x0(x_t, t) from any parameterization, optionally clipped.
            x0 = self.predict(denoiser, x, timestep_batch(t, x)).x0
            if t_prev < 0:
                # 2a. the last step, to sigma = 0: e^{-h} = 0 and alpha = 1, so x_0 = D = x0 (first order).
                x, h = x0, None
            else:
                # 2b. step size in lambda, then the second-order combination D (first order on the first step).
                h = (lambdas[t_prev] - lambdas[t]).item()
                if x0_last is None:
                    d = x0
                else:
                    r = h_last / h  # type: ignore[operator]  # set with x0_last
                    d = (1 + 1 / (2 * r)) * x0 - (1 / (2 * r)) * x0_last
                # 3. the exponential-integrator update (Algorithm 2, line 6 / line 3 for the first step).
                sigma_prev = (1 - alphas_cumprod[t_prev]).sqrt().item()
                sigma_ratio = sigma_prev / (1 - alphas_cumprod[t]).sqrt().item()
                alpha_prev = alphas_cumprod[t_prev].sqrt().item()
                if self.stochastic:
                    x = sigma_ratio * math.exp(-h) * x - alpha_prev * math.expm1(-2 * h) * d
                    x = x + sigma_prev * math.sqrt(-math.expm1(-2 * h)) * randn(x.shape, noise, x.device)
                else:
                    x = sigma_ratio * x - alpha_prev * math.expm1(-h) * d
            x0_last, h_last = x0, h
            yield Step(t, x, x0)


@dataclass(frozen=True)
class DPMSolverPP2MSDE(DPMSolverPP2M):
    """The SDE variant of DPM-Solver++(2M) (diffusers' ``sde-dpmsolver++``, k-diffusion's ``sample_dpmpp_2m_sde``):
    the reverse SDE with the same D and z ~ N(0, I) from `noise`,

        x_{t_prev} = (sigma_{t_prev} / sigma_t) e^{-h} x_t + alpha_{t_prev} (1 - e^{-2h}) D
                     + sigma_{t_prev} sqrt(1 - e^{-2h}) z.

    Its first-order step is the DDPM posterior step with variance beta~ (DDIM with eta = 1). The noise
    corrects part of the network's error that the ODE carries along: on the digits recipe, 20 steps of it
    score close to DDPM-1000 where every ODE solver (DDIM, dpmpp_2m) levels off higher
    (benchmarks/results/quality.md).
    """

    name: ClassVar[str] = "dpmpp_2m_sde"
    summary: ClassVar[str] = "the SDE variant of DPM-Solver++(2M) (stochastic, few steps)"
    stochastic: ClassVar[bool] = True
