"""The variational bound on the negative log-likelihood (Ho et al. 2020, Eq. 5), in bits per dimension:

    L = L_T + sum_{t=2}^{T} L_{t-1} + L_0,
    L_T     = KL(q(x_T | x_0) || N(0, I))                       the prior term (no parameters),
    L_{t-1} = KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t))     against the true posterior (Eq. 6-7),
    L_0     = -log p(x_0 | x_1)                                 a discretized Gaussian decoder (Eq. 13),

for 8-bit images in model units [-1, 1] (bins of width 2/255, the outermost reaching to -inf and +inf).
Timesteps here count from 0, as everywhere in this package: the term at t = 0 is the decoder, the term at
t > 0 the KL of the step t -> t - 1. Each term is averaged over the dimensions and divided by ln 2, so the
terms of one sample add up to its bits/dim. `bound_terms` evaluates every term of a batch (T network
evaluations); `vlb_term` one term at a given t, which with t uniform and weighted by T is an unbiased estimate
of the sum (and, with learned variances, the L_vlb of Nichol & Dhariwal's hybrid loss).

The Gaussians are compared in float64: KL terms of nearly equal distributions and the probability of a narrow
bin far in a Gaussian's tail lose every digit in float32. The network itself runs in its own precision.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm import tqdm

from diffusion.core import noise as counter_noise
from diffusion.core.schedule import NoiseSchedule, PredictionType
from diffusion.core.variance import VarianceType, reverse_log_variance, split_output, step_log_variances

EIGHT_BIT_BIN = 2 / 255
"""Width of one of the 256 levels of 8-bit data in model units [-1, 1]."""

ModelFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""model(x_t, t) -> network output (the prediction, and v with learned variances): a network, or a closure that
passes labels."""


@dataclass(frozen=True)
class ReverseProcess:
    """How a network output defines p(x_{t-1} | x_t): what it predicts, its variance, and whether the predicted
    x_0 is clipped to [-1, 1] (as the samplers do by default; improved-diffusion's bpd evaluation too)."""

    prediction_type: PredictionType = "eps"
    variance: VarianceType = "fixedlarge"
    learned_variance: bool = False
    clip_denoised: bool = True


def normal_kl(
    mean1: torch.Tensor, log_var1: torch.Tensor, mean2: torch.Tensor | float, log_var2: torch.Tensor | float
) -> torch.Tensor:
    """KL(N(mean1, e^log_var1) || N(mean2, e^log_var2)) in nats, elementwise (broadcast), float64."""
    mean1, log_var1, mean2, log_var2 = (
        torch.as_tensor(a).double() for a in (mean1, log_var1, mean2, log_var2)
    )
    return 0.5 * (
        log_var2
        - log_var1
        + torch.exp(log_var1 - log_var2)
        + (mean1 - mean2).square() * torch.exp(-log_var2)
        - 1
    )


def discretized_gaussian_log_likelihood(
    x: torch.Tensor, mean: torch.Tensor, log_variance: torch.Tensor, bin_width: float = EIGHT_BIT_BIN
) -> torch.Tensor:
    """log P(the bin of x) under N(mean, e^log_variance), elementwise, float64, for x on a grid of bins of
    `bin_width` across [-1, 1]: the bin of -1 reaches down to -inf, that of +1 up to +inf (Ho et al. Eq. 13).

    Computed from log Phi (torch.special.log_ndtr) on the side of the Gaussian where the bin's mass is the
    smaller tail, so a bin far from the mean keeps its digits rather than becoming log(1 - 1) = -inf.
    """
    x, mean = x.double(), mean.double()
    inv_std = torch.exp(-0.5 * log_variance.double())
    upper = (x - mean + bin_width / 2) * inv_std  # standardized bin edges
    lower = (x - mean - bin_width / 2) * inv_std
    log_below_upper = torch.special.log_ndtr(upper)  # log P(z < upper): the lowest bin
    log_above_lower = torch.special.log_ndtr(-lower)  # log P(z > lower): the highest bin
    # Inner bins: log(Phi(a) - Phi(b)), a > b, mirrored to (-lower, -upper) when the bin lies above the mean.
    above = (upper + lower) > 0
    a, b = torch.where(above, -lower, upper), torch.where(above, -upper, lower)
    log_a = torch.special.log_ndtr(a)
    inner = log_a + torch.log(-torch.expm1(torch.special.log_ndtr(b) - log_a))
    lowest, highest = x < -1 + bin_width / 2, x > 1 - bin_width / 2
    return torch.where(lowest, log_below_upper, torch.where(highest, log_above_lower, inner))


def prior_bpd(schedule: NoiseSchedule, x0: torch.Tensor) -> torch.Tensor:
    """L_T = KL(q(x_T | x_0) || N(0, I)) in bits/dim, (B,) float64: near 0 for the standard schedules."""
    last = torch.full((x0.shape[0],), schedule.num_timesteps - 1, device=x0.device, dtype=torch.long)
    log_abar = schedule.log_alphas_cumprod_at(last, x0.ndim, check_range=False)
    kl = normal_kl(log_abar.mul(0.5).exp() * x0.double(), torch.log(-torch.expm1(log_abar)), 0.0, 0.0)
    return kl.flatten(1).mean(1) / math.log(2)


def model_posterior(
    schedule: NoiseSchedule,
    process: ReverseProcess,
    output: torch.Tensor,
    x_t: torch.Tensor,
    t: torch.Tensor,
    detach_mean: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and log-variance (float64) of the model's p(x_{t-1} | x_t) from the network output at (x_t, t): the
    mean is the posterior mean at the predicted x_0 (Eq. 7 with x_0 predicted, Eq. 11 for eps), the variance
    `reverse_log_variance`'s. `detach_mean`: no gradient through the mean (the L_vlb of the hybrid loss trains
    only the variance, Nichol & Dhariwal Sec. 3.1)."""
    prediction, v = split_output(output, process.learned_variance)
    if detach_mean:
        prediction = prediction.detach()
    x0, _ = schedule.split_prediction(process.prediction_type, x_t, t, prediction.float(), check_range=False)
    if process.clip_denoised:
        x0 = x0.clamp(-1, 1)
    mean, _, _ = schedule.q_posterior(x0.double(), x_t.double(), t, check_range=False)
    log_variance = reverse_log_variance(schedule, process.variance, t, t - 1, x_t.ndim, v)
    return mean, log_variance


def bound_term(
    schedule: NoiseSchedule,
    x0: torch.Tensor,
    x_t: torch.Tensor,
    t: torch.Tensor,
    model_mean: torch.Tensor,
    model_log_variance: torch.Tensor,
    bin_width: float = EIGHT_BIT_BIN,
) -> torch.Tensor:
    """The bound's term at each sample's t, in bits/dim, (B,) float64: L_0, the decoder's -log p(x_0 | x_1),
    where t = 0, else KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t)) with p = N(model_mean, e^model_log_variance)."""
    true_mean, _, _ = schedule.q_posterior(x0.double(), x_t.double(), t, check_range=False)
    _, true_log_variance = step_log_variances(schedule, t, t - 1, x0.ndim)
    kl = normal_kl(true_mean, true_log_variance, model_mean, model_log_variance).flatten(1).mean(1)
    nll = (
        -discretized_gaussian_log_likelihood(x0, model_mean, model_log_variance, bin_width).flatten(1).mean(1)
    )
    return torch.where(t == 0, nll, kl) / math.log(2)


def vlb_term(
    model: ModelFn,
    schedule: NoiseSchedule,
    process: ReverseProcess,
    x0: torch.Tensor,
    t: torch.Tensor,
    noise: torch.Tensor,
    bin_width: float = EIGHT_BIT_BIN,
) -> torch.Tensor:
    """The bound's term at each sample's t (B,) in bits/dim, for x_t = q_sample(x0, t, noise)."""
    x_t = schedule.q_sample(x0, t, noise, check_range=False)
    mean, log_variance = model_posterior(schedule, process, model(x_t, t), x_t, t)
    return bound_term(schedule, x0, x_t, t, mean, log_variance, bin_width)


@dataclass
class BoundTerms:
    """Every term of the bound for a batch, in bits/dim: `prior` (B,) is L_T, `terms` (B, T) holds L_0 at
    column 0 and the KL of step t -> t - 1 at column t."""

    prior: torch.Tensor
    terms: torch.Tensor

    @property
    def total(self) -> torch.Tensor:
        """Each sample's bound on -log2 p(x_0) per dimension, (B,): its bits/dim."""
        return self.prior + self.terms.sum(1)


@torch.no_grad()
def bound_terms(
    model: ModelFn,
    schedule: NoiseSchedule,
    process: ReverseProcess,
    x0: torch.Tensor,
    indices: torch.Tensor,
    seed: int = 0,
    bin_width: float = EIGHT_BIT_BIN,
    progress: bool = False,
) -> BoundTerms:
    """All T + 1 terms of the bound for a batch x0 (B, ...) in model units, on 8-bit bins (Ho et al. Eq. 5;
    improved-diffusion's ``calc_bpd_loop``): T network evaluations, t = T - 1 down to 0.

    The noise of x_t is per sample: a function of (seed, t, indices[b]) (`diffusion.core.noise`), so a sample's
    terms do not depend on its batch, rank or device.
    """
    T = schedule.num_timesteps
    terms = torch.empty(x0.shape[0], T, dtype=torch.float64, device=x0.device)
    indices = indices.to(x0.device)
    for t in tqdm(range(T - 1, -1, -1), desc="bound terms", disable=not progress, leave=False):
        t_batch = torch.full((x0.shape[0],), t, device=x0.device, dtype=torch.long)
        noise = counter_noise.normal(
            x0.shape, counter_noise.noise_key(seed, counter_noise.LIKELIHOOD_NOISE, t), indices
        )
        terms[:, t] = vlb_term(model, schedule, process, x0, t_batch, noise.to(x0.dtype), bin_width)
    return BoundTerms(prior_bpd(schedule, x0), terms)
