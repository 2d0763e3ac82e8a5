"""Power-function EMA profiles and the post-hoc EMA solver (Karras et al. 2024, "Analyzing and Improving the
Training Dynamics of Diffusion Models", EDM2, Sec. 3 and Appendix C). Torch only, all math in float64.

A power-function EMA of exponent gamma, read at time t, averages the weights theta(tau) seen so far with the
density (EDM2 Eq. 121)

    p_{t,gamma}(tau) = (gamma + 1) tau^gamma / t^(gamma + 1),   0 <= tau <= t.

Its width relative to its time, sigma_rel = std(tau) / t = sqrt((gamma + 1) / ((gamma + 2)^2 (gamma + 3)))
(Eq. 123), is the one number that says how long the average is, whatever the run's length: sigma_rel 0.05
puts 90% of its weight on the last 12% of the steps. Tracked once per optimizer step t = 1, 2, ... (Eq. 127):

    1. beta_t = (1 - 1/t)^(gamma + 1)                       (beta_1 = 0: the first update copies the weights)
    2. ema_t = beta_t ema_{t-1} + (1 - beta_t) theta_t,

which puts the weight (tau^(gamma+1) - (tau-1)^(gamma+1)) / t^(gamma+1) on the weights after step tau (the
product of the betas telescopes): exactly the mass of p_{t,gamma} over (tau - 1, tau]. The discrete average is
the continuous one binned per step, so the continuous math below holds for it (`step_weights`).

Post-hoc (EDM2 Sec. 3.2, Appendix C.3): snapshots of a few such averages at several times each carry one known
profile; the average of any other sigma_rel at the time of a snapshot is approximated by the combination of
snapshots whose profile is closest to the target's in L2 over time. With A_ij = <p_i, p_j> (snapshots) and
b_i = <p_i, p_target> in closed form (`profile_inner_products`), the coefficients x minimize
||sum_i x_i p_i - p_target||^2 = x^T A x - 2 x^T b + <p_target, p_target> subject to sum_i x_i = 1, so the
combination is an average and keeps the weights' scale (EDM2 instead rescales the unconstrained solution to
sum 1; both coincide when the fit is exact). Binning per step only shrinks an L2 error (Cauchy-Schwarz), so the
reconstructed step weights are at least as close to the target's as the continuous profiles are.
"""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from diffusion.errors import InvalidValue, check_real

# gamma = 0 (a plain running mean over the whole run) is the widest profile: sigma_rel = sqrt(1/12).
MAX_SIGMA_REL = math.sqrt(1 / 12)


def check_sigma_rel(sigma_rel: float, name: str = "sigma_rel") -> None:
    """Refuse what is not a number (WrongType: text, a bool) or a number outside (0, sqrt(1/12)]."""
    check_real(name, sigma_rel, f"pass {name} as a float, e.g. 0.05")
    if not 0.0 < sigma_rel <= MAX_SIGMA_REL:
        raise InvalidValue(
            f"{name}={sigma_rel} is out of range",
            f"pass a value in (0, {MAX_SIGMA_REL:.4f}] (EDM2 tracks 0.05 and "
            "0.10; the widest profile, a mean over the whole run, has sqrt(1/12))",
        )


def sigma_rel_of(gamma: float) -> float:
    """The relative width of the power-function profile of exponent `gamma` >= 0 (EDM2 Eq. 123)."""
    return math.sqrt((gamma + 1) / ((gamma + 2) ** 2 * (gamma + 3)))


def gamma_of(sigma_rel: float) -> float:
    """The exponent of the profile of relative width `sigma_rel` (EDM2 Eq. 126): the largest real root of
    gamma^3 + 7 gamma^2 + (16 - s) gamma + (12 - s) with s = sigma_rel^-2, which is Eq. 123 squared and
    multiplied out. Found as the largest eigenvalue of the cubic's companion matrix, in float64."""
    check_sigma_rel(sigma_rel)
    s = sigma_rel**-2
    companion = torch.tensor(
        [[-7.0, -(16.0 - s), -(12.0 - s)], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64
    )
    roots = torch.linalg.eigvals(companion)
    real = roots.real[roots.imag.abs() <= 1e-9 * (1 + roots.abs())]
    return max(float(real.max()), 0.0)  # at sigma_rel = sqrt(1/12) the root is 0 (up to rounding)


def update_weight(gamma: float, step: int, steps_since_update: int = 1) -> float:
    """1 - beta of the update at optimizer step `step` (1-based) of a profile last updated `steps_since_update`
    steps before (Eq. 127: beta = (1 - delta / t)^(gamma + 1)); 1 at the first update, a copy."""
    if step < 1 or not 1 <= steps_since_update <= step:
        raise ValueError(f"an update at step {step}, {steps_since_update} step(s) after the previous one")
    return 1.0 - (1.0 - steps_since_update / step) ** (gamma + 1.0)


def step_weights(step: int, gamma: float) -> torch.Tensor:
    """(step,) float64: the weight the profile read at `step` puts on the weights after steps 1..step."""
    tau = torch.arange(step + 1, dtype=torch.float64) / step
    cumulative = tau ** (gamma + 1.0)  # the profile's mass up to each step
    return cumulative[1:] - cumulative[:-1]


def profile_inner_products(
    steps_a: Sequence[float], gammas_a: Sequence[float], steps_b: Sequence[float], gammas_b: Sequence[float]
) -> torch.Tensor:
    """(len(a), len(b)) float64: the L2 inner products <p_{t_a,gamma_a}, p_{t_b,gamma_b}> over time.

    Both densities are zero past their own time, so the integral of their product runs to m = min(t_a, t_b):
    (gamma_a + 1)(gamma_b + 1) m^(gamma_a + gamma_b + 1) / ((gamma_a + gamma_b + 1) t_a^(gamma_a + 1)
    t_b^(gamma_b + 1)), computed through its logarithm (the powers alone overflow float64 for long runs).
    """
    as_column = lambda v: torch.as_tensor(v, dtype=torch.float64).reshape(-1, 1)  # noqa: E731
    t_a, g_a = as_column(steps_a), as_column(gammas_a)
    t_b, g_b = as_column(steps_b).T, as_column(gammas_b).T
    m = torch.minimum(t_a, t_b)
    log = (
        torch.log((g_a + 1) * (g_b + 1) / (g_a + g_b + 1))
        + (g_a + g_b + 1) * torch.log(m)
        - (g_a + 1) * torch.log(t_a)
        - (g_b + 1) * torch.log(t_b)
    )
    return torch.exp(log)


@dataclass(frozen=True)
class Solution:
    """The snapshots' coefficients (float64, summing to 1) and how far their combined profile is from the
    target's: ||sum_i x_i p_i - p_target|| / ||p_target|| in L2 over time (0: exact)."""

    coefficients: torch.Tensor
    relative_error: float


def solve(
    snapshot_steps: Sequence[int], snapshot_gammas: Sequence[float], target_step: int, target_gamma: float
) -> Solution:
    """The average of snapshots (at `snapshot_steps`, of exponents `snapshot_gammas`) whose profile is closest
    in L2 to the power-function profile of `target_gamma` read at `target_step` (see the module docstring).

    Solves the equality-constrained least squares through its KKT system
        [[A, 1], [1^T, 0]] [x; lambda] = [b; 1],
    with every inner product scaled by `target_step` (they shrink as 1/t) so the system is of order 1.
    """
    count = len(snapshot_steps)
    if count == 0 or count != len(snapshot_gammas):
        raise ValueError(
            f"{count} snapshot steps and {len(snapshot_gammas)} exponents: need as many, at least 1"
        )
    if max(snapshot_steps) > target_step or min(snapshot_steps) < 1:
        raise ValueError(
            f"snapshots must lie in steps 1..{target_step} (the target's), got {list(snapshot_steps)}"
        )
    gram = (
        profile_inner_products(snapshot_steps, snapshot_gammas, snapshot_steps, snapshot_gammas) * target_step
    )
    cross = profile_inner_products(snapshot_steps, snapshot_gammas, [target_step], [target_gamma])[:, 0]
    cross = cross * target_step
    target_norm = float(profile_inner_products([target_step], [target_gamma], [target_step], [target_gamma]))
    target_norm *= target_step
    ones = torch.ones(count, dtype=torch.float64)
    system = torch.zeros(count + 1, count + 1, dtype=torch.float64)
    system[:count, :count], system[:count, count], system[count, :count] = gram, ones, ones
    right = torch.cat([cross, torch.ones(1, dtype=torch.float64)])
    # lstsq (SVD) rather than solve: snapshots whose profiles nearly coincide make the system near-singular,
    # where the minimum-norm solution avoids huge coefficients of opposite signs.
    x = torch.linalg.lstsq(system, right[:, None], driver="gelsd").solution[:count, 0]
    squared_error = float(x @ gram @ x - 2 * x @ cross + target_norm)
    return Solution(x, math.sqrt(max(squared_error, 0.0) / target_norm))


def combine(weighted: Iterable[tuple[float, dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    """sum_i x_i state_i over (x_i, state_i) pairs, streamed (one state in memory at a time), summed in float64:
    coefficients of opposite signs cancel, which float32 sums would round. Returned in each entry's dtype."""
    total: dict[str, torch.Tensor] | None = None
    dtypes: dict[str, torch.dtype] = {}
    for coefficient, state in weighted:
        if total is None:
            total = {key: torch.zeros(value.shape, dtype=torch.float64) for key, value in state.items()}
            dtypes = {key: value.dtype for key, value in state.items()}
        if state.keys() != total.keys():
            raise ValueError("the snapshots hold different parameters: they come from different networks")
        for key, value in state.items():
            total[key].add_(value.to(torch.float64), alpha=coefficient)
    if total is None:
        raise ValueError("nothing to combine: no snapshots")
    return {key: value.to(dtypes[key]) for key, value in total.items()}
