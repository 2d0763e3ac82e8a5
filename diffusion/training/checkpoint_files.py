"""Checkpoint files read safely: tensors and plain data only (``weights_only=True``), so loading never runs code
from the file, and a checkpoint that carries other pickled objects is refused with one clear error."""

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from diffusion.errors import UserError
from diffusion.training.from_diffusers import diffusers_folders, read_init_weights


def read_checkpoint(
    path: str | os.PathLike, flag: str = "checkpoint", map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """A checkpoint file's contents (tensors memory-mapped, no code run), or one clear error naming `flag`.

    Raises FileNotFoundError (no such file) or UserError (a folder, an empty, truncated or foreign file, or
    one that carries pickled objects other than tensors and plain data, which could run code when loaded).
    """
    path = Path(path).expanduser()
    fix = "pass an intact .ckpt, e.g. runs/<name>/version_N/checkpoints/last.ckpt"
    if path.is_dir():
        inside = sorted(path.glob("**/last.ckpt"))
        raise UserError(
            f"{flag} {path} is a folder, not a checkpoint file", f"pass {inside[0]}" if inside else fix
        )
    if not path.is_file():
        raise FileNotFoundError(f"{flag}: no checkpoint at {path} — {fix}")
    if path.stat().st_size == 0:
        raise UserError(f"{flag} {path} is empty (0 bytes)", fix)
    if not zipfile.is_zipfile(path):
        # torch.save writes zip archives; a truncated one has lost its central directory at the end.
        raise UserError(
            f"{flag} {path} is truncated or not a PyTorch checkpoint (no intact zip archive)", fix
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err):
            raise UserError(
                f"{flag} {path} holds pickled objects other than tensors and plain data, which could run code "
                "when loaded; it was refused",
                "load only checkpoints written by this project (or that you trust)",
            ) from err
        raise UserError(
            f"{flag} {path} cannot be read as a checkpoint ({str(err).splitlines()[0]})", fix
        ) from err
    except (EOFError, RuntimeError, OSError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{flag} {path} cannot be read as a checkpoint ({first_line})", fix) from err
    if not isinstance(checkpoint, dict):
        raise UserError(f"{flag} {path} holds a {type(checkpoint).__name__}, not a checkpoint", fix)
    return checkpoint


def check_written_by_train(
    checkpoint: dict[str, Any], path: str | os.PathLike, flag: str = ""
) -> dict[str, Any]:
    """The checkpoint holds what a model is rebuilt from, the network's settings and weights (train.py writes
    both); returns its hyperparameters. `flag` names the option that gave `path` in the error."""
    hparams = checkpoint.get("hyper_parameters")
    if not (
        isinstance(hparams, dict)
        and isinstance(hparams.get("network"), dict)
        and isinstance(checkpoint.get("state_dict"), dict)
    ):
        raise UserError(
            f"{flag} {path}".strip()
            + " is not a checkpoint written by train.py (it lacks the network's settings "
            "or weights)",
            "pass a runs/<name>/version_N/checkpoints/*.ckpt (a model built in Python loads with "
            "DiffusionModule.load_from_checkpoint(path, network=...))",
        )
    return hparams


def read_network_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Network weights from a checkpoint of this project (its `network.` entries), a plain state_dict, or a
    diffusers DDPMPipeline / UNet2DModel folder (renamed to this project's UNet)."""
    if diffusers_folders(path) is not None:
        return read_init_weights(path)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"init_from: no such file {path}; pass a .ckpt of this project or a state_dict"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    if any(key.startswith("network.") for key in state):
        state = {
            key.removeprefix("network."): value for key, value in state.items() if key.startswith("network.")
        }
    return state
