"""How the optimizer steps: the learning-rate schedule (linear warmup, then constant as Ho et al. or a cosine
decay to zero) and TF32 matmuls on CUDA."""

import functools
import math
from typing import Literal

import torch

LRSchedule = Literal["constant", "cosine"]


def lr_factor(step: int, *, schedule: LRSchedule, warmup_steps: int, total_steps: int) -> float:
    """The factor on the base learning rate after `step` optimizer steps.

    Warmup rises linearly over `warmup_steps`; then "constant" stays at 1 and "cosine" falls as half a cosine
    to 0 at `total_steps`. Decaying to 0 lets a short run end on a quiet optimizer, so the last weights (and
    their EMA) settle into fine structure that a constant rate keeps shaking (benchmarks/vectors.py).
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
        raise ValueError(f"lr_schedule={schedule} decays to the run's last step: set trainer.max_steps")
    total = int(min(total_steps, 2**62))
    factor = functools.partial(lr_factor, schedule=schedule, warmup_steps=warmup_steps, total_steps=total)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def use_tf32_on_cuda(device: torch.device) -> None:
    """TF32 tensor cores for float32 matmuls on a CUDA device (Ampere and newer; cuDNN convolutions use them
    by default): products with a 10-bit mantissa, float32 accumulation, several times the float32 rate.
    A precision the user set explicitly (anything but torch's default "highest") is kept."""
    if device.type == "cuda" and torch.get_float32_matmul_precision() == "highest":
        torch.set_float32_matmul_precision("high")
