"""Training-time hooks: EMA of the weights, atomic checkpoints, sample grids (TensorBoard and PNG), FID and a
step timer.

Configs name them by these paths (`diffusion.training.callbacks.FIDCallback`), whichever file holds them.
"""

from diffusion.training.callbacks.checkpoint import Checkpoint
from diffusion.training.callbacks.ema import EMA
from diffusion.training.callbacks.fid import FIDCallback
from diffusion.training.callbacks.grids import EveryNValidations, SampleGrid
from diffusion.training.callbacks.step_timer import StepTimer

__all__ = ["EMA", "Checkpoint", "EveryNValidations", "FIDCallback", "SampleGrid", "StepTimer"]
