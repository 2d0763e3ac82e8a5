"""Checkpoints: safe loading (tensors and plain data only), EMA or raw weights, and the run-folder layout.

A run lives in ``<save_dir>/<name>/version_<N>/`` (TensorBoardLogger's layout) with its checkpoints in
``checkpoints/`` and its config in ``config.yaml``; `run_checkpoints` and `run_folder_of` are the functions that
know it, and `newest_checkpoint` is what `--ckpt_path last` resumes. Loading never runs code from the file
(``weights_only=True``): a checkpoint that carries other pickled objects is refused.
"""

import os
import pickle
import re
import zipfile
from dataclasses import dataclass
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


RUN_FOLDER = re.compile(r"version_(\d+)")


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint `--ckpt_path last` resumes: its file, run version and step, and the unreadable
    checkpoints of that run it passed over (path, why)."""

    path: Path
    version: int
    step: int
    skipped: tuple[tuple[Path, str], ...] = ()


@dataclass(frozen=True)
class RunFolder:
    """Where a checkpoint's run lives: ``<save_dir>/<name>/version_<version>/``."""

    save_dir: Path
    name: str
    version: int

    @property
    def path(self) -> Path:
        return self.save_dir / self.name / f"version_{self.version}"

    @property
    def config_file(self) -> Path:
        return self.path / "config.yaml"


def run_folder_of(checkpoint: str | os.PathLike) -> RunFolder | None:
    """The run a checkpoint belongs to, when it sits at ``<save_dir>/<name>/version_<N>/checkpoints/``."""
    path = Path(checkpoint).expanduser().absolute()
    version = RUN_FOLDER.fullmatch(path.parent.parent.name)
    if path.parent.name != "checkpoints" or version is None:
        return None
    return RunFolder(path.parents[3], path.parents[2].name, int(version.group(1)))


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoints in a folder (``last.ckpt``, ``last-v1.ckpt``, ``step=N.ckpt``, ...), not the hidden
    temporary files of saves in progress or killed."""
    return sorted(p for p in folder.glob("*.ckpt") if not p.name.startswith(".") and p.is_file())


def run_checkpoints(save_dir: str | os.PathLike, name: str) -> list[tuple[int, list[Path]]]:
    """(version, checkpoint files) of every ``<save_dir>/<name>/version_<N>/`` holding any, by version."""
    found = []
    for folder in Path(save_dir, name).glob("version_*/checkpoints"):
        version = RUN_FOLDER.fullmatch(folder.parent.name)
        files = checkpoint_files(folder)
        if version and files:
            found.append((int(version.group(1)), files))
    return sorted(found)


def newest_checkpoint(save_dir: str | os.PathLike, name: str) -> ResumePoint:
    """The newest intact checkpoint of the newest run of this name (highest N holding a checkpoint).

    Newest = highest global step (``last.ckpt``, ``last-vN.ckpt`` and ``step=N.ckpt`` alike; a tie goes to a
    ``last`` file, then to the file written last). Files that cannot be read (empty, truncated, foreign) are passed over and listed in
    `skipped`; a run without a readable checkpoint is an error, never a silent fall back to an older run.
    """
    runs = run_checkpoints(save_dir, name)
    if not runs:
        raise FileNotFoundError(
            f"no checkpoint under {Path(save_dir, name)}/version_*/checkpoints/: train first "
            f"(python train.py), or pass the path of a checkpoint"
        )
    version, files = runs[-1]
    intact, skipped = [], []
    for path in files:
        try:
            step = int(read_checkpoint(path, "checkpoint").get("global_step", -1))
        except (UserError, OSError) as err:
            skipped.append((path, str(err).split(" — ")[0].removeprefix(f"checkpoint {path} ")))
            continue
        intact.append((step, path.name.startswith("last"), path.stat().st_mtime, path))
    if not intact:
        reasons = "; ".join(f"{path.name} {why}" for path, why in skipped)
        raise UserError(
            f"--ckpt_path last: no readable checkpoint in {files[0].parent} ({reasons})",
            "pass the path of an intact checkpoint, or start a new run without --ckpt_path",
        )
    step, _, _, path = max(intact)
    return ResumePoint(path, version, step, tuple(skipped))


def latest_run(save_dir: str | os.PathLike, name: str) -> tuple[int, Path]:
    """(version, newest intact checkpoint) of the newest run of this name (see `newest_checkpoint`)."""
    point = newest_checkpoint(save_dir, name)
    return point.version, point.path


def latest_checkpoint(save_dir: str | os.PathLike, name: str) -> Path:
    """The newest run's newest intact checkpoint (see `newest_checkpoint`)."""
    return newest_checkpoint(save_dir, name).path
