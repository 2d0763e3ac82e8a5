"""Where an option of a class the commands build is a flag: the one table of owners and their flag prefixes.

Below diffusion/cli/ a check names an option by its class (the error's `owner`) and its parameter
(`{--batch_size}` in a UserError's message, or an OutOfRange's `name`), never by a flag: train.py builds the data
module from `--data.*`, the network from `--model.network.*`, and so on, and only this table knows it. Renaming a
flag group is one line here.
"""

import torch
from lightning.pytorch import LightningDataModule, Trainer

from diffusion.cli.trainer_options import SHORTHANDS
from diffusion.errors import COMMAND
from diffusion.models import MLP, UNet
from diffusion.training.callbacks.checkpoint import Checkpoint
from diffusion.training.callbacks.ema import EMA
from diffusion.training.callbacks.grids import SampleGrid
from diffusion.training.module import DiffusionModule

# The classes train.py builds from a group of flags, by the group's prefix (`parser.add_lightning_class_args`,
# LightningCLI's `--model` and `--data`). A data module or network of the user's own is found by its base class
# or by the class train.py chose (the groups `naming_the_flag` is given).
PREFIXES: dict[type, str] = {
    DiffusionModule: "model",
    LightningDataModule: "data",
    UNet: "model.network",
    MLP: "model.network",
    EMA: "ema",
    Checkpoint: "checkpoint",
    SampleGrid: "sample_grid",
    Trainer: "trainer",  # its common options have shorthands: --precision for --trainer.precision
}


def prefix_of(owner: type | str | None, chosen: dict[type, str] | None = None) -> str | None:
    """The flag group of `owner`'s options ('data', 'model.network'), by its class or the nearest base class
    listed (or by a listed class's name, where a lower layer cannot import the class); None for a class no flags
    build (a network's parts: their options are no flag of the user's)."""
    tables = [chosen or {}, PREFIXES]
    if owner == COMMAND:  # the command's own flags: no group
        return ""
    if isinstance(owner, str):
        return next((table[cls] for table in tables for cls in table if cls.__name__ == owner), None)
    if owner is None:
        return None
    for cls in owner.__mro__:
        if cls in (object, torch.nn.Module):
            break
        for table in tables:
            if cls in table:
                return table[cls]
    return None


def flag_text(owner: type | str | None, name: str, chosen: dict[type, str] | None = None) -> str:
    """The flag of `owner`'s option `name` as the user writes it (`--data.batch_size`, `--precision`), or the
    class and parameter (`SampleQualityCallback sampling.steps`, a class given by class path) where no flag group
    builds `owner`."""
    prefix = prefix_of(owner, chosen)
    if prefix == "trainer" and name in SHORTHANDS:
        return f"--{name}"
    if prefix is None:
        return name if owner is None else f"{getattr(owner, '__name__', owner)} {name}"
    return f"--{prefix}.{name}" if prefix else f"--{name}"
