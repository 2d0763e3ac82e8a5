"""Noise schedules and the closed-form pieces of the forward process (Ho et al. 2020, Sec. 2).

Every quantity is computed in float64 and stored as a float32 buffer, so it moves with ``.to()``, lives in
checkpoints and never loses precision under mixed-precision training (buffers are not autocast).
"""

import math
import warnings
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from diffusion.core.schedule_inputs import check_inputs, check_step_back, check_timesteps
from diffusion.errors import (
    InvalidValue,
    OutOfRange,
    check_bool,
    check_choice,
    check_fits_memory,
    check_real,
    check_whole_number,
)

BetaSchedule = Literal["linear", "cosine", "sigmoid", "trained"]
PredictionType = Literal["eps", "x0", "v"]
BETA_START, BETA_END = 1e-4, 0.02  # a linear schedule's betas at T = 1000 (Ho et al.)
# What a schedule holds per timestep: seven float32 buffers and the float64 values they are computed from.
SCHEDULE_BYTES_PER_STEP = 7 * 4 + 10 * 8


def make_betas(
    schedule: BetaSchedule,
    num_timesteps: int,
    beta_start: float = BETA_START,
    beta_end: float = BETA_END,
    trained_betas: Sequence[float] | None = None,
) -> torch.Tensor:
    """Return float64 betas of shape (num_timesteps,).

    linear: Ho et al. 2020 (1e-4 to 0.02 over T=1000). ``beta_start`` and ``beta_end`` are the values at
        T = 1000 and are scaled by 1000 / T for other T, as in improved-diffusion (Nichol & Dhariwal 2021,
        ``get_named_beta_schedule``), so that alphas_cumprod at T stays near 4e-5 and x_T near N(0, I) for
        any T (unscaled, T = 100 would end at alphas_cumprod 0.36). Betas are clipped at 0.999, as the
        cosine's, which the defaults reach only for T <= 20: said in a warning (`clipped_linear_betas`), since
        the schedule is then not the one asked for (kept, not refused: checkpoints of such schedules load).
    cosine: Nichol & Dhariwal 2021, alphas_cumprod = cos^2(((t/T + s) / (1 + s)) * pi/2), s = 0.008,
        betas clipped at 0.999.
    sigmoid: Jabri et al. 2022 (RIN), alphas_cumprod follows a reversed sigmoid of t/T mapped to [-3, 3],
        which keeps more signal at high t than linear.
    trained: the `trained_betas` given, as diffusers' DDPMScheduler takes them (its ``trained_betas``): a schedule
        no name here builds, such as a diffusers model's, or one of these read back from a diffusers export.
    """
    check_choice("beta_schedule", schedule, BetaSchedule)
    if (schedule == "trained") != (trained_betas is not None):
        raise InvalidValue(
            f"{{--beta_schedule}} {schedule} needs {{--trained_betas}}"
            if trained_betas is None
            else f"{{--trained_betas}}: {{--beta_schedule}} {schedule} takes none",
            "pass {--beta_schedule} trained with {--trained_betas} (one beta per timestep), or another "
            "beta_schedule without them",
        )
    num_timesteps = check_whole_number(
        "num_timesteps", num_timesteps, 2, "pass an integer >= 2 (Ho et al. use 1000)"
    )  # one step cannot go from data to noise (a linear schedule's beta would be 0.1)
    check_fits_memory(
        "num_timesteps", num_timesteps, num_timesteps * SCHEDULE_BYTES_PER_STEP, "the schedule's tensors",
        "pass fewer timesteps (Ho et al. use 1000)",
    )  # fmt: skip
    if trained_betas is not None:
        return checked_betas(trained_betas, num_timesteps)
    if schedule == "linear":
        beta_start = check_real("beta_start", beta_start)
        beta_end = check_real("beta_end", beta_end)
        if not 0 < beta_start < 1:
            raise OutOfRange("beta_start", beta_start, "in (0, 1)", "pass e.g. 1e-4 (Ho et al.)")
        start_past_end = beta_end == BETA_END and beta_start >= beta_end  # the start moved, not the end
        if start_past_end:
            requirement = f"in (0, beta_end) = (0, {beta_end:g})"
            raise OutOfRange("beta_start", beta_start, requirement, "pass e.g. 1e-4 (Ho et al.)")
        if not beta_start < beta_end < 1:
            example = "e.g. 0.02 (Ho et al.)" if beta_start < BETA_END else f"a value in ({beta_start:g}, 1)"
            raise OutOfRange(
                "beta_end", beta_end, f"in (beta_start, 1) = ({beta_start:g}, 1)", f"pass {example}"
            )
        scale = 1000 / num_timesteps
        betas = torch.linspace(scale * beta_start, scale * beta_end, num_timesteps, dtype=torch.float64)
        if (note := clipped_linear_betas(betas, beta_end)) is not None:
            warnings.warn(note, stacklevel=2)
        return betas.clamp(max=0.999)
    steps = torch.arange(num_timesteps + 1, dtype=torch.float64) / num_timesteps  # t/T for t = 0..T
    if schedule == "cosine":
        s = 0.008
        alphas_cumprod = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
    else:  # sigmoid
        start, end, tau = -3.0, 3.0, 1.0
        v_start, v_end = torch.tensor(start / tau).sigmoid(), torch.tensor(end / tau).sigmoid()
        alphas_cumprod = (-((steps * (end - start) + start) / tau).sigmoid() + v_end) / (v_end - v_start)
    alphas_cumprod = alphas_cumprod / alphas_cumprod[0]
    betas = 1 - alphas_cumprod[1:] / alphas_cumprod[:-1]
    return betas.clamp(0, 0.999)


def scaled_beta_end(num_timesteps: int, beta_end: float) -> float:
    """The last beta of a linear schedule over `num_timesteps`: `beta_end` scaled by 1000 / T (`make_betas`)."""
    return 1000 / num_timesteps * beta_end


def clipped_linear_betas(betas: torch.Tensor, beta_end: float) -> str | None:
    """A note when a linear schedule's scaled betas reach 0.999 and are clipped there (a short run's T: alpha_bar
    would reach 0 partway through), with the fewest timesteps that clip none."""
    clipped = int((betas > 0.999).sum())
    if clipped == 0:
        return None
    num_timesteps = len(betas)
    fewest = max(2, math.floor(1000 * beta_end / 0.999))
    while scaled_beta_end(fewest, beta_end) > 0.999:
        fewest += 1
    return (
        f"linear betas over num_timesteps={num_timesteps} end at {scaled_beta_end(num_timesteps, beta_end):g} "
        f"(beta_end={beta_end:g} scaled by 1000/num_timesteps): the last {clipped} are clipped at 0.999, a "
        f"schedule other than the linear one; pass num_timesteps {fewest} or more, a smaller beta_end, or "
        "beta_schedule cosine"
    )


def unused_beta_range(beta_schedule: str, beta_start: float, beta_end: float) -> str | None:
    """A note when beta_start or beta_end differ from their defaults for a schedule that takes none (cosine,
    sigmoid, trained): they would be ignored without a word."""
    given = [
        f"{name}={value}"
        for name, value, default in (("beta_start", beta_start, BETA_START), ("beta_end", beta_end, BETA_END))
        if value != default
    ]
    if beta_schedule == "linear" or not given:
        return None
    return (
        f"{' and '.join(given)} not used: beta_schedule={beta_schedule!r} takes no beta_start or beta_end (only "
        "'linear' does)"
    )


def schedule_betas(
    beta_schedule: BetaSchedule = "linear",
    num_timesteps: int = 1000,
    beta_start: float = BETA_START,
    beta_end: float = BETA_END,
    zero_terminal_snr: bool = False,
    trained_betas: Sequence[float] | None = None,
) -> torch.Tensor:
    """The float64 betas of `NoiseSchedule` with the same arguments (`make_betas`, rescaled for zero terminal SNR):
    what an export writes, since float32 betas near 1 lose most digits of 1 - beta."""
    betas = make_betas(beta_schedule, num_timesteps, beta_start, beta_end, trained_betas)
    return rescale_zero_terminal_snr(betas) if zero_terminal_snr else betas


def checked_betas(betas: Sequence[float], num_timesteps: int) -> torch.Tensor:
    """Given betas as float64, refused in one line (`InvalidValue`, which summarises them) unless they are a noise
    schedule: `num_timesteps` finite numbers in (0, 1), the last one in (0, 1] (1: alpha_bar_T = 0, zero terminal
    SNR). Each beta > 0 keeps alpha_bar strictly decreasing, which every sampler's timesteps and the posterior's
    1 / (1 - alpha_bar_t) need; they need not be increasing."""
    fix = f"pass num_timesteps={num_timesteps} betas, each in (0, 1) and the last in (0, 1]"
    try:
        values = torch.as_tensor(betas, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise InvalidValue(
            f"trained_betas of type {type(betas).__name__} are not a list of numbers", fix
        ) from err
    if values.ndim != 1 or len(values) != num_timesteps:
        raise InvalidValue(
            f"trained_betas={summarise(values)} are not one beta per timestep (num_timesteps={num_timesteps})",
            f"pass {num_timesteps} betas, or num_timesteps equal to their count",
        )
    inside = values.isfinite() & (values > 0) & (values < 1)
    inside[-1] = values[-1].isfinite() & (values[-1] > 0) & (values[-1] <= 1)
    if not inside.all():
        bad = [int(i) for i in (~inside).nonzero().flatten()]
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise InvalidValue(
            f"trained_betas={summarise(values)} are not a noise schedule: beta[{bad[0]}]="
            f"{values[bad[0]].item():g}{more} outside (0, 1)",
            fix,
        )
    return values


def summarise(betas: torch.Tensor) -> str:
    """A schedule's betas in a few words, for a line that must stay one line: their count, first and last."""
    if betas.ndim != 1 or len(betas) == 0:
        return f"<{tuple(betas.shape)} values>"
    return f"<{len(betas)} betas, {betas[0].item():g} ... {betas[-1].item():g}>"


def rescale_zero_terminal_snr(betas: torch.Tensor) -> torch.Tensor:
    """Betas rescaled so that alphas_cumprod at T is 0 (zero terminal SNR), float64.

    Lin et al. 2024 ("Common Diffusion Noise Schedules and Sample Steps are Flawed", Algorithm 1): shift
    sqrt(abar_t) so its last value is 0 and scale it so its first stays, then recover the betas; the last beta
    is 1. Without it a schedule ends with some signal left (4e-5 of abar for Ho et al.'s), which training
    shows the network at t = T but sampling from pure noise never gives it.
    """
    sqrt_alphas_cumprod = torch.cumprod(1 - betas, dim=0).sqrt()
    first, last = sqrt_alphas_cumprod[0].clone(), sqrt_alphas_cumprod[-1].clone()
    sqrt_alphas_cumprod = (sqrt_alphas_cumprod - last) * first / (first - last)
    alphas_cumprod = sqrt_alphas_cumprod**2
    alphas = torch.cat([alphas_cumprod[:1], alphas_cumprod[1:] / alphas_cumprod[:-1]])
    return 1 - alphas


def extract(values: torch.Tensor, t: torch.Tensor, ndim: int) -> torch.Tensor:
    """Gather values[t] for a batch of timesteps and shape it (B, 1, ..., 1) to broadcast against x."""
    return values[t].reshape(-1, *([1] * (ndim - 1)))


class NoiseSchedule(nn.Module):
    """The forward process q(x_t | x_0) and its posterior q(x_{t_prev} | x_t, x_0) for a beta schedule.

    No learnable parameters; all tensors are buffers indexed by the timestep t in [0, T). With
    `zero_terminal_snr` the betas are rescaled so that alpha_bar_T = 0 (`rescale_zero_terminal_snr`): x_T is
    pure noise, eps-prediction is undefined there (x_0 = (x_T - eps) / 0), and the network must predict v or x_0.
    Trained betas whose last is 1 end there already (the rescaling leaves them as they are), and the schedule says
    so alike (`self.zero_terminal_snr`).
    """

    # The buffers, registered in __init__ (declared for the type checker: nn.Module's attributes are untyped).
    betas: torch.Tensor
    alphas: torch.Tensor
    alphas_cumprod: torch.Tensor
    sqrt_alphas_cumprod: torch.Tensor
    sqrt_one_minus_alphas_cumprod: torch.Tensor
    sqrt_recip_alphas_cumprod: torch.Tensor
    sqrt_recipm1_alphas_cumprod: torch.Tensor

    def __init__(
        self,
        beta_schedule: BetaSchedule = "linear",
        num_timesteps: int = 1000,
        beta_start: float = BETA_START,
        beta_end: float = BETA_END,
        zero_terminal_snr: bool = False,
        trained_betas: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        zero_terminal_snr = check_bool("zero_terminal_snr", zero_terminal_snr)
        self.beta_schedule = beta_schedule
        self.num_timesteps = num_timesteps
        betas = schedule_betas(
            beta_schedule, num_timesteps, beta_start, beta_end, zero_terminal_snr, trained_betas
        )
        note = unused_beta_range(beta_schedule, beta_start, beta_end)
        if note is not None:  # a warning, not an error: the schedule built is the one its name says
            warnings.warn(note, stacklevel=2)
        alphas = 1.0 - betas
        alphas_cumprod = torch.cumprod(alphas, dim=0)
        self.zero_terminal_snr = bool(alphas_cumprod[-1] == 0)  # rescaled, or trained betas ending at 1
        buffers = {
            "betas": betas,
            "alphas": alphas,
            "alphas_cumprod": alphas_cumprod,
            "sqrt_alphas_cumprod": alphas_cumprod.sqrt(),
            "sqrt_one_minus_alphas_cumprod": (1 - alphas_cumprod).sqrt(),
            "sqrt_recip_alphas_cumprod": alphas_cumprod.rsqrt(),
            "sqrt_recipm1_alphas_cumprod": (1 / alphas_cumprod - 1).sqrt(),
        }
        for name, value in buffers.items():
            self.register_buffer(name, value.to(torch.float32))

    def q_sample(
        self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, *, check_range: bool = True
    ) -> torch.Tensor:
        """Sample x_t ~ q(x_t | x_0) = N(sqrt(abar_t) x_0, (1 - abar_t) I), Eq. (4).

        Every method refuses a t outside 0..num_timesteps - 1 (OutOfRange, never counted from the end);
        `check_range=False` skips reading t's values (a GPU sync) for a caller that built t itself."""
        check_inputs(self, t, "x0", x0, check_range, noise=noise)
        return (
            extract(self.sqrt_alphas_cumprod, t, x0.ndim) * x0
            + extract(self.sqrt_one_minus_alphas_cumprod, t, x0.ndim) * noise
        )

    def predict_x0_from_eps(
        self, x_t: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, *, check_range: bool = True
    ) -> torch.Tensor:
        """Invert Eq. (4): x_0 = (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t)."""
        check_inputs(self, t, "x_t", x_t, check_range, eps=eps)
        return (
            extract(self.sqrt_recip_alphas_cumprod, t, x_t.ndim) * x_t
            - extract(self.sqrt_recipm1_alphas_cumprod, t, x_t.ndim) * eps
        )

    def predict_eps_from_x0(
        self, x_t: torch.Tensor, t: torch.Tensor, x0: torch.Tensor, *, check_range: bool = True
    ) -> torch.Tensor:
        check_inputs(self, t, "x_t", x_t, check_range, x0=x0)
        eps = (extract(self.sqrt_recip_alphas_cumprod, t, x_t.ndim) * x_t - x0) / extract(
            self.sqrt_recipm1_alphas_cumprod, t, x_t.ndim
        )
        if (
            self.zero_terminal_snr
        ):  # at alpha_bar = 0, x_t is the noise itself (the formula divides inf by inf)
            eps = torch.where(extract(self.alphas_cumprod, t, x_t.ndim) == 0, x_t, eps)
        return eps

    def velocity(
        self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, *, check_range: bool = True
    ) -> torch.Tensor:
        """v = sqrt(abar_t) eps - sqrt(1 - abar_t) x_0 (Salimans & Ho 2022)."""
        check_inputs(self, t, "x0", x0, check_range, noise=noise)
        return (
            extract(self.sqrt_alphas_cumprod, t, x0.ndim) * noise
            - extract(self.sqrt_one_minus_alphas_cumprod, t, x0.ndim) * x0
        )

    def training_target(
        self, prediction_type: PredictionType, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, *,
        check_range: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        """What the network is trained to output for this prediction type."""
        check_choice("prediction_type", prediction_type, PredictionType)
        check_inputs(self, t, "x0", x0, check_range, noise=noise)
        if prediction_type == "eps":
            return noise
        if prediction_type == "x0":
            return x0
        return self.velocity(x0, t, noise, check_range=False)

    def split_prediction(
        self, prediction_type: PredictionType, x_t: torch.Tensor, t: torch.Tensor, output: torch.Tensor, *,
        check_range: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Turn a network output into (predicted x_0, predicted eps), whatever the network predicts."""
        check_choice("prediction_type", prediction_type, PredictionType)
        check_inputs(self, t, "x_t", x_t, check_range, output=output)
        if prediction_type == "eps":
            return self.predict_x0_from_eps(x_t, t, output, check_range=False), output
        if prediction_type == "x0":
            return output, self.predict_eps_from_x0(x_t, t, output, check_range=False)
        # v: x_0 = sqrt(abar) x_t - sqrt(1 - abar) v ; eps = sqrt(1 - abar) x_t + sqrt(abar) v
        sqrt_abar = extract(self.sqrt_alphas_cumprod, t, x_t.ndim)
        sqrt_one_minus_abar = extract(self.sqrt_one_minus_alphas_cumprod, t, x_t.ndim)
        return sqrt_abar * x_t - sqrt_one_minus_abar * output, sqrt_one_minus_abar * x_t + sqrt_abar * output

    def log_alphas_cumprod_at(self, t: torch.Tensor, ndim: int, *, check_range: bool = True) -> torch.Tensor:
        """log abar_t in float64, shaped (B, 1, ..., 1); t = -1 is x_0 itself (abar = 1, log 0).

        Summed from log(1 - beta) in float64 rather than read from the float32 abar: step coefficients such
        as 1 - abar_t / abar_prev lose most of their digits in float32 both near t = 0 (abar ~ 1) and near
        t = T (1 - abar ~ 1). B numbers per step, so the float64 costs nothing.
        """
        ndim = check_whole_number("ndim", ndim, 1, "pass x.ndim, the rank of the batch it broadcasts against")
        check_timesteps("t", t, self.num_timesteps, None, self.betas.device, check_range, lowest=-1)
        log_alphas_cumprod = torch.cumsum(torch.log1p(-self.betas.double()), dim=0)
        log_abar = torch.where(t < 0, 0.0, log_alphas_cumprod[t.clamp(min=0)])
        return log_abar.reshape(-1, *([1] * (ndim - 1)))

    def q_posterior(
        self, x0: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, t_prev: torch.Tensor | None = None, *,
        check_range: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Mean and variance beta~ of q(x_{t_prev} | x_t, x_0), Eq. (6)-(7), and the step's beta.

        t_prev defaults to t - 1. A respaced step from t to any t_prev < t (Nichol & Dhariwal 2021) is the
        same formula with beta = 1 - abar_t / abar_{t_prev}; t_prev = -1 is the step to x_0 (abar = 1).
        Coefficients are formed in float64 (see `log_alphas_cumprod_at`) and cast to x_t's dtype.
        """
        x_t = check_inputs(self, t, "x_t", x_t, check_range, x0=x0)
        t = (
            torch.as_tensor(t, device=x_t.device).reshape(-1).expand(len(x_t))
        )  # one timestep for all, or (B, 1)
        if t_prev is None:
            t_prev = t - 1
        else:
            check_timesteps(
                "t_prev", t_prev, self.num_timesteps, len(x_t), x_t.device, check_range, lowest=-1
            )
            check_step_back(t, t_prev, check_range)
        log_abar_t = self.log_alphas_cumprod_at(t, x_t.ndim, check_range=False)
        log_abar_prev = self.log_alphas_cumprod_at(t_prev, x_t.ndim, check_range=False)
        beta = -torch.expm1(log_abar_t - log_abar_prev)  # 1 - abar_t / abar_prev
        one_minus_abar_t, one_minus_abar_prev = -torch.expm1(log_abar_t), -torch.expm1(log_abar_prev)
        coef_x0 = log_abar_prev.mul(0.5).exp() * beta / one_minus_abar_t
        coef_xt = (1 - beta).sqrt() * one_minus_abar_prev / one_minus_abar_t
        variance = beta * one_minus_abar_prev / one_minus_abar_t
        dtype = x_t.dtype
        mean = coef_x0.to(dtype) * x0 + coef_xt.to(dtype) * x_t
        return mean, variance.to(dtype), beta.to(dtype)

    def snr(self, t: torch.Tensor, *, check_range: bool = True) -> torch.Tensor:
        """Signal-to-noise ratio abar_t / (1 - abar_t), shape (B,)."""
        check_timesteps("t", t, self.num_timesteps, None, self.betas.device, check_range)
        alphas_cumprod = self.alphas_cumprod[t]
        return alphas_cumprod / (1 - alphas_cumprod)

    def extra_repr(self) -> str:
        zero_snr = ", zero_terminal_snr=True" if self.zero_terminal_snr else ""
        return f"beta_schedule={self.beta_schedule!r}, num_timesteps={self.num_timesteps}{zero_snr}"
