"""A trained model from its checkpoint alone: no config file, no code run (``weights_only=True``)."""

import os
from typing import Literal

import torch

from diffusion.errors import check_choice
from diffusion.training.checkpoint_files import check_written_by_train, read_checkpoint
from diffusion.training.module import DiffusionModule

Weights = Literal["ema", "raw"]


def load_checkpoint(
    path: str | os.PathLike, weights: Weights = "ema", map_location: str | torch.device = "cpu"
) -> DiffusionModule:
    """A DiffusionModule from a checkpoint alone (no config), with its EMA weights or its raw ones.

    Lightning's EMA callback stores the averaged weights under "state_dict" and the raw ones under
    "current_model_state"; a run without EMA has only raw weights, which both choices then return.
    """
    check_choice("weights", weights, Weights)
    checkpoint = read_checkpoint(path, map_location=map_location)  # checked before Lightning reads it again
    check_written_by_train(checkpoint, path)
    module = DiffusionModule.load_from_checkpoint(path, map_location=map_location, weights_only=True)
    if weights == "raw" and "current_model_state" in checkpoint:
        module.load_state_dict(checkpoint["current_model_state"])
    return module.eval()
