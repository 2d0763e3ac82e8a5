"""Checkpoints: safe loading (tensors and plain data only), EMA or raw weights, and the run-folder layout.

A run lives in ``<save_dir>/<name>/version_<N>/`` (TensorBoardLogger's layout) with its checkpoints in
``checkpoints/``; `run_checkpoints` is the one function that knows it. Loading never runs code from the file
(``weights_only=True``): a checkpoint that carries other pickled objects is refused.
"""

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, Literal

import torch

from diffusion.errors import UserError, check_choice

Weights = Literal["ema", "raw"]


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


def load_checkpoint(
    path: str | os.PathLike, weights: Weights = "ema", map_location: str | torch.device = "cpu"
) -> "DiffusionModule":  # noqa: F821
    """A DiffusionModule from a checkpoint alone (no config), with its EMA weights or its raw ones.

    Lightning's EMA callback stores the averaged weights under "state_dict" and the raw ones under
    "current_model_state"; a run without EMA has only raw weights, which both choices then return.
    """
    from diffusion.module import DiffusionModule  # here: the module reads init_from weights through this file

    check_choice("weights", weights, Weights)
    checkpoint = read_checkpoint(path, map_location=map_location)  # checked before Lightning reads it again
    if "state_dict" not in checkpoint or "network" not in checkpoint.get("hyper_parameters", {}):
        raise UserError(
            f"{path} is not a checkpoint written by train.py (it lacks the network's settings or weights)",
            "pass a runs/<name>/version_N/checkpoints/*.ckpt (a model built in Python loads with "
            "DiffusionModule.load_from_checkpoint(path, network=...))",
        )
    module = DiffusionModule.load_from_checkpoint(path, map_location=map_location, weights_only=True)
    if weights == "raw" and "current_model_state" in checkpoint:
        module.load_state_dict(checkpoint["current_model_state"])
    return module.eval()


def read_network_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Network weights from a checkpoint of this project (its `network.` entries) or a plain state_dict."""
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


def run_checkpoints(
    save_dir: str | os.PathLike, name: str, filename: str = "last.ckpt"
) -> list[tuple[int, Path]]:
    """(version, path) of every ``<save_dir>/<name>/version_<N>/checkpoints/<filename>``, by version."""
    found = []
    for path in Path(save_dir, name).glob(f"version_*/checkpoints/{filename}"):
        version = path.parent.parent.name.removeprefix("version_")
        if version.isdigit():
            found.append((int(version), path))
    return sorted(found)


def latest_run(save_dir: str | os.PathLike, name: str) -> tuple[int, Path]:
    """(version, last.ckpt) of the newest run of this name (highest N)."""
    found = run_checkpoints(save_dir, name)
    if not found:
        raise FileNotFoundError(
            f"no last.ckpt under {Path(save_dir, name)}/version_*/checkpoints/: train first "
            f"(python train.py), or pass the path of a checkpoint"
        )
    return found[-1]


def latest_checkpoint(save_dir: str | os.PathLike, name: str) -> Path:
    """The newest run's ``last.ckpt`` (see `latest_run`)."""
    return latest_run(save_dir, name)[1]
