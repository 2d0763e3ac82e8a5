"""The variance of the reverse process p(x_{t_prev} | x_t) = N(mu_theta(x_t, t), sigma_t^2 I): fixed at the step's
beta_t or at the posterior's beta~_t (Ho et al. 2020, Sec. 3.2), or learned (Nichol & Dhariwal 2021, "Improved
Denoising Diffusion Probabilistic Models", Eq. 15) as an interpolation between the two in the log domain:

    log sigma_t^2 = frac log beta_t + (1 - frac) log beta~_t,   frac = (v + 1) / 2,

where v is the network's second set of C output channels (a network with learned variances outputs 2C channels:
the usual prediction, eps, x0 or v-prediction, then v; v = 0 is the geometric mean of the two bounds, as in the
authors' code).

On a respaced subsequence of timesteps (t -> t_prev), beta and beta~ are those of the respaced process,
beta = 1 - abar_t / abar_{t_prev} and beta~ = beta (1 - abar_{t_prev}) / (1 - abar_t), and the network's v
interpolates between them: the paper's rule (Sec. 4), so a model trained on T steps samples with fewer.
"""

from typing import Literal

import torch

from diffusion.core.schedule import NoiseSchedule
from diffusion.errors import InvalidValue

VarianceType = Literal["fixedlarge", "fixedsmall", "learned_range"]


def split_output(output: torch.Tensor, learned_variance: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(prediction, v) from a network output: the first C channels and, with learned variances, the next C
    (dim 1: channels of images, features of vectors); v is None for a fixed-variance network."""
    if not learned_variance:
        return output, None
    if output.shape[1] % 2:
        raise InvalidValue(
            f"a network with learned variances outputs 2C channels (the prediction, then v), got "
            f"{output.shape[1]}",
            "build it with out_channels = 2 x in_channels (train.py does for {DiffusionModule:--variance} "
            "learned_range)",
        )
    prediction, v = output.chunk(2, dim=1)
    return prediction, v


def check_output_fits(output: torch.Tensor, x: torch.Tensor, learned_variance: bool) -> None:
    """The network's output at x_t said of the network, at a sampler's evaluation (a shape compare costs nothing):
    x_t's shape, with 2C channels (features of vectors) when it learned its variances."""
    count, given = x.shape[1] if x.ndim > 1 else 0, output.shape[1] if output.ndim > 1 else 0
    wanted = 2 * count if learned_variance else count
    if output.ndim != x.ndim or output.shape[0] != x.shape[0] or output.shape[2:] != x.shape[2:]:
        raise InvalidValue(
            f"the network outputs shape {tuple(output.shape)} for x_t of shape {tuple(x.shape)}",
            "make model(x_t, t) return one prediction of x_t's shape per sample"
            + (" (2C channels with learned variances)" if learned_variance else ""),
        )
    if given == wanted:
        return
    unit = ("channel" if x.ndim > 2 else "feature") + "s" * (given != 1)
    if learned_variance:
        other = (
            (  # a DiffusionModule's option too: the user's own Trainer, or generate(module)
                " (or pass learned_variance=False: it outputs the prediction alone; a DiffusionModule: "
                "{DiffusionModule:--variance} fixed)"
            )
            if given == count
            else ""
        )
        raise InvalidValue(
            f"the network outputs {given} {unit} and x_T has {count}: a network with learned variances outputs "
            f"2 x {count} (the prediction, then v)",
            f"build it with out_channels {wanted}{other}",
        )
    other = (
        (
            f" (or pass learned_variance=True for 2 x {count}; a DiffusionModule: {{DiffusionModule:--variance}} "
            "learned_range)"
        )
        if given == 2 * count
        else ""
    )
    raise InvalidValue(
        f"the network outputs {given} {unit} and x_T has {count}",
        f"build it with out_channels {count}{other}",
    )


def step_log_variances(
    schedule: NoiseSchedule, t: torch.Tensor, t_prev: torch.Tensor, ndim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log beta, log beta~) of the step t -> t_prev in float64, shaped (B, 1, ..., 1).

    beta~ is 0 on the step to x_0 (t_prev = -1), whose log is no variance at all: there it is replaced by the
    full chain's first nonzero one, beta~ of the step 1 -> 0, as Ho et al.'s and Nichol & Dhariwal's code
    ("posterior_log_variance_clipped"). That step adds no noise when sampling; it is the decoder's variance.
    """
    log_beta, log_posterior = _log_beta_and_posterior(
        schedule.log_alphas_cumprod_at(t, ndim, check_range=False),
        schedule.log_alphas_cumprod_at(t_prev, ndim, check_range=False),
    )
    one = torch.ones(1, dtype=torch.long, device=t.device)
    _, log_first_posterior = _log_beta_and_posterior(
        schedule.log_alphas_cumprod_at(one, 1, check_range=False),
        schedule.log_alphas_cumprod_at(one - 1, 1, check_range=False),
    )
    last_step = (t_prev < 0).reshape(log_posterior.shape)  # there log beta~ = log 0 = -inf
    log_posterior = torch.where(last_step, log_first_posterior.reshape(()), log_posterior)
    return log_beta, log_posterior


def _log_beta_and_posterior(
    log_abar_t: torch.Tensor, log_abar_prev: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """log beta = log(1 - abar_t / abar_prev) and log beta~ = log beta + log(1 - abar_prev) - log(1 - abar_t)
    (Eq. 7), from float64 log abar (expm1 keeps the digits of 1 - abar near both ends)."""
    log_beta = torch.log(-torch.expm1(log_abar_t - log_abar_prev))
    return log_beta, log_beta + torch.log(-torch.expm1(log_abar_prev)) - torch.log(-torch.expm1(log_abar_t))


def reverse_log_variance(
    schedule: NoiseSchedule,
    variance: VarianceType,
    t: torch.Tensor,
    t_prev: torch.Tensor,
    ndim: int,
    v: torch.Tensor | None = None,
) -> torch.Tensor:
    """log sigma_t^2 of the step t -> t_prev in float64: (B, 1, ..., 1) for the fixed variances, v's shape for
    the learned one (which needs the network's v).

    fixedlarge: beta_t, but beta~ of the step 1 -> 0 on the step to x_0 (as Ho et al.'s code, for a better
    decoder likelihood); fixedsmall: beta~_t (clipped the same way); learned_range: Eq. 15 between beta_t and
    the clipped beta~_t.
    """
    log_beta, log_posterior = step_log_variances(schedule, t, t_prev, ndim)
    if variance == "fixedsmall":
        return log_posterior
    if variance == "fixedlarge":
        return torch.where((t_prev < 0).reshape(log_beta.shape), log_posterior, log_beta)
    if v is None:
        raise ValueError(  # the sampler checks the network before it steps (check_fits): a bug if reached
            "variance='learned_range' needs the network's v: a model trained with variance learned_range"
        )
    frac = (v.double() + 1) / 2
    return frac * log_beta + (1 - frac) * log_posterior
