"""Training-time hooks: EMA of the weights (and post-hoc EMA), atomic checkpoints, sample grids (TensorBoard and
PNG), the FID and KID of samples, and a step timer.

Configs name them by these paths (`diffusion.training.callbacks.SampleQualityCallback`), whichever file holds
them; `FIDCallback` is the name configs of earlier versions give `SampleQualityCallback`.
"""

from diffusion.training.callbacks.checkpoint import Checkpoint
from diffusion.training.callbacks.ema import EMA
from diffusion.training.callbacks.grids import EveryNValidations, SampleGrid
from diffusion.training.callbacks.sample_quality import FIDCallback, SampleQualityCallback
from diffusion.training.callbacks.step_timer import StepTimer

__all__ = [
    "EMA",
    "Checkpoint",
    "EveryNValidations",
    "FIDCallback",
    "SampleGrid",
    "SampleQualityCallback",
    "StepTimer",
]
