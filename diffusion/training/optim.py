"""How the optimizer steps: Adam (fused where torch has the kernel), gradient clipping before a fused step, the
learning-rate schedule (linear warmup, then constant as Ho et al. or a cosine decay to zero) and TF32 matmuls on
CUDA."""

import functools
import math
from collections.abc import Iterable
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import GradClipAlgorithmType

from diffusion.errors import InvalidValue
from diffusion.training.option_notes import RunNote

LRSchedule = Literal["constant", "cosine"]


def lr_factor(step: int, *, schedule: LRSchedule, warmup_steps: int, total_steps: int) -> float:
    """The factor on the base learning rate after `step` optimizer steps.

    Warmup rises linearly over `warmup_steps`; then "constant" stays at 1 and "cosine" falls as half a cosine
    to 0 at `total_steps`. Decaying to 0 lets a short run end on a quiet optimizer, so the last weights (and
    their EMA) settle into fine structure that a constant rate keeps shaking (benchmarks/quality/vectors.py).
    """
    warmup_steps = max(warmup_steps, 1)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_scheduler(
    optimizer: torch.optim.Optimizer, schedule: LRSchedule, warmup_steps: int, total_steps: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step LambdaLR of `lr_factor`. `total_steps` is the run's current length: LambdaLR checkpoints
    the __dict__ of a callable object and writes it back on resume, which would pin the first run's length;
    a partial has none, so a run extended with a larger max_steps decays over its new length."""
    if schedule != "constant" and not math.isfinite(total_steps):
        raise InvalidValue(
            f"lr_schedule={schedule} decays to the run's last step, and the run has none",
            "set {--max_steps}, or train with lr_schedule constant",
            L.Trainer,
        )
    total = int(min(total_steps, 2**62))
    factor = functools.partial(lr_factor, schedule=schedule, warmup_steps=warmup_steps, total_steps=total)
    return RunLengthSchedule(optimizer, factor)


class RunLengthSchedule(torch.optim.lr_scheduler.LambdaLR):
    """`warmup_scheduler`'s LambdaLR, which says on resume where the rate jumps: a decaying schedule follows the
    run's current max_steps from where it stands, so a run resumed with another length than the one it decayed
    over leaves the rate of its last step at once (a shortened cosine run fell 30x, tester round 21a), without a
    word otherwise. A jump of less than a tenth of the peak rate (a length changed a little) is not said."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        factor = self.lr_lambdas[0]
        if not isinstance(factor, functools.partial) or factor.keywords["schedule"] == "constant":
            return  # (a schedule changed on resume is `check_resumed_checkpoint`'s to say)
        peak, before = self.base_lrs[0], self._last_lr[0]  # the rate of the checkpoint's last step
        now = peak * factor(self.last_epoch)
        if abs(now - before) > 0.1 * peak:
            from lightning.pytorch.utilities import rank_zero_warn

            jump = f"the learning rate jumps from {before:.3g} to {now:.3g} at the resumed step {self.last_epoch}"
            rank_zero_warn(
                f"{jump}: the {factor.keywords['schedule']} schedule follows this run's max_steps "
                f"({factor.keywords['total_steps']}), not the length the checkpoint's run decayed over — resume "
                "with the max_steps the run was started with to keep its decay (a longer run: start one with the "
                "longer max_steps)",
                category=RunNote,
            )


def use_tf32_on_cuda(device: torch.device) -> None:
    """TF32 tensor cores for float32 matmuls on a CUDA device (Ampere and newer; cuDNN convolutions use them
    by default): products with a 10-bit mantissa, float32 accumulation, several times the float32 rate.
    A precision the user set explicitly (anything but torch's default "highest") is kept."""
    if device.type == "cuda" and torch.get_float32_matmul_precision() == "highest":
        torch.set_float32_matmul_precision("high")


def adam(
    parameters: Iterable[torch.nn.Parameter],
    device: torch.device,
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
) -> torch.optim.Adam:
    """Adam with the fused kernel on CPU and CUDA, in every precision; torch's foreach loop elsewhere.

    The fused kernel updates all parameters at once: about half the time of the per-tensor loop a CPU gets by
    default, and what CUDA runs fastest. Under a GradScaler (16-mixed) it also keeps the step free of host-device
    syncs: the scaler hands it the found-inf flag as a device tensor and the kernel skips the update itself,
    where a foreach or per-tensor step is skipped from the host, which reads the flag (`.item()`) every step.
    Lightning will not clip the gradients of such a step (it unscales inside), so the module clips them itself
    (`clip_gradients`).

    A checkpoint whose optimizer state names another implementation (a foreach Adam's) resumes with this one:
    on load, the saved flags would replace the constructor's.
    """
    fused = device.type in ("cpu", "cuda")
    flags: dict[str, Any] = {"fused": fused, "foreach": None if fused else True}
    optimizer = torch.optim.Adam(parameters, lr=lr, betas=betas, weight_decay=weight_decay, **flags)

    def keep_implementation(_: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
        # Before the state is moved: a fused step keeps its step counts on the parameters' device.
        groups = [{**group, **flags} for group in state_dict["param_groups"]]
        return {**state_dict, "param_groups": groups}

    optimizer.register_load_state_dict_pre_hook(keep_implementation)
    return optimizer


def clip_gradients(
    module: L.LightningModule,
    optimizer: torch.optim.Optimizer,
    clip_val: float | None,
    algorithm: str | None,
) -> None:
    """`LightningModule.configure_gradient_clipping` that also clips before a fused step.

    Lightning's mixed-precision plugin refuses to clip for an optimizer whose step unscales the gradients itself
    (`_step_supports_amp_scaling`: the fused ones), since they would still be scaled. Here the scaler (16-mixed)
    unscales them first, so the clip sees their true values, and the step that follows is told so (GradScaler
    then passes it no scale, only the found-inf flag, on the device). Nothing here reads the device:
    `clip_grad_norm_` scales by min(1, max_norm / norm) there and, as in Lightning's own clipping, does not check
    that the norm is finite (with a scaler, a non-finite gradient makes a step the fused kernel skips).
    Other optimizers take Lightning's path."""
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        module.clip_gradients(optimizer, clip_val, algorithm)
        return
    if not clip_val:
        return
    scaler = getattr(module.trainer.precision_plugin, "scaler", None)
    if scaler is not None:
        scaler.unscale_(optimizer)
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    if GradClipAlgorithmType(algorithm or "norm") == GradClipAlgorithmType.VALUE:
        torch.nn.utils.clip_grad_value_(parameters, clip_val)
    else:
        torch.nn.utils.clip_grad_norm_(parameters, clip_val)
