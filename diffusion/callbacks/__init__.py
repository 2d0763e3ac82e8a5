"""Training-time hooks: EMA of the weights, atomic checkpoints, sample grids (TensorBoard and PNG) and FID.

Configs name them by these paths (`diffusion.callbacks.FIDCallback`), whichever file holds them.
"""

from diffusion.callbacks.checkpoint import Checkpoint
from diffusion.callbacks.ema import EMA
from diffusion.callbacks.fid import FIDCallback
from diffusion.callbacks.grids import EveryNValidations, SampleGrid

__all__ = ["EMA", "Checkpoint", "EveryNValidations", "FIDCallback", "SampleGrid"]
