"""What a path given for a checkpoint is, told before torch reads it: a checkpoint (`CHECKPOINT`, the files a folder
is searched for), a folder of another model (post-hoc EMA snapshots, an export, a diffusers model), an export's
weights that lost their config.json (the folder or the file), a safetensors file, or a path of another filesystem
that Lightning reads itself. `checkpoint_files` reads the checkpoint; every loader of a checkpoint path (load_checkpoint,
the commands' --ckpt, init_from, `DiffusionModule.load_from_checkpoint`) says these the same way through it.
"""

import json
import os
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem

from diffusion.data.file_in_folder import FileKind, files_of_kind
from diffusion.errors import MissingFile
from diffusion.training.export_files import CONFIG, WEIGHTS, is_export
from diffusion.training.from_diffusers import diffusers_folders

# A run's post-hoc EMA folder and its snapshots' names: run_folders' POST_HOC_EMA and SNAPSHOT_FILES (it imports
# checkpoint_files; tests/cli/test_local_paths.py holds them equal)
POST_HOC_EMA, SNAPSHOT_FILES = "post_hoc_ema", "step=*-sigma_rel=*.pt"


def checkpoint_folder_said(folder: Path, flag: str) -> tuple[str, str] | None:
    """What a folder holding no checkpoint is, where it is a folder of a model that is no training checkpoint:
    a run's post-hoc EMA snapshots, an export, a diffusers model (`FileKind.folder_said`: every command's --ckpt,
    train.py's --ckpt_path and --model.init_from say it the same way; "holds no checkpoint" would call it empty)."""
    if folder.name == POST_HOC_EMA or any(p.is_file() for p in folder.glob(SNAPSHOT_FILES)):
        run = f" {folder.parent}" if folder.name == POST_HOC_EMA else ""
        return (
            "is a post-hoc EMA snapshots folder, which holds one profile's averages, not a model",
            f"reconstruct a model from the snapshots first (python -m diffusion.phema with the run{run} and a "
            "sigma_rel writes a .ckpt), then pass that checkpoint",
        )
    if is_export(folder) or diffusers_folders(folder, flag) is not None:
        what = "a diffusers folder" if not is_export(folder) else "an export (python -m diffusion.export)"
        return (
            f"is {what}, which holds one set of weights and no training state",
            "pass a training checkpoint (runs/<name>/version_N/checkpoints/*.ckpt); python -m diffusion.sample "
            "and load_checkpoint take it as it is",
        )
    return None


CHECKPOINT = FileKind(
    "checkpoint",
    ("*.ckpt",),
    "train.py writes them into runs/<name>/version_N/checkpoints/",
    checkpoint_folder_said,
)


def is_local_file_path(path: object) -> bool:
    """Whether `path` is a path of the local disk (not a file object, a URL or another fsspec filesystem's path),
    which this package checks before Lightning reads it."""
    return (
        isinstance(path, str | os.PathLike)
        and "://" not in str(path)
        and isinstance(get_filesystem(str(path)), LocalFileSystem)
    )


def is_safetensors(path: Path) -> bool:
    """Whether the file at `path` is laid out as a safetensors file: the length of its header (8 bytes, little
    endian, within the file), then the header, a JSON object. Asked before a file is told a pickle by its first byte:
    a header whose length is 128 more than a multiple of 256 starts with that byte (0x80)."""
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        if not 2 <= length <= min(path.stat().st_size - 8, 100_000_000):
            return False
        header = file.read(length)
    try:
        return isinstance(json.loads(header), dict)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False


def check_not_an_export_without_config(path: str | os.PathLike, flag: str) -> None:
    """An export's weights without the config.json that holds the model's settings (a partial copy), given as its
    folder (holding no checkpoint it could stand for) or as the model.safetensors file itself, are refused as that,
    by every loader of a checkpoint path: "it holds no checkpoint" called the folder empty, and the file was said
    to hold pickled objects."""
    if not is_export_without_config(path):
        return
    given = Path(path).expanduser()
    problem = (
        f"{flag} {given} is a folder holding an export's model.safetensors without its config.json (the model's settings)"
        if given.is_dir()
        else f"{flag} {given} is an export's model.safetensors without its config.json beside it (the model's settings)"
    )
    raise MissingFile(
        problem,
        "copy the export's folder again whole, or export the checkpoint again (python -m diffusion.export)",
    )


def is_export_without_config(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder holding an export's weights (model.safetensors) and neither its config.json nor a
    checkpoint, or such a model.safetensors file itself (a safetensors file, no config.json beside it)."""
    given = Path(path).expanduser()
    folder = given if given.is_dir() else given.parent
    if given.is_dir():
        if files_of_kind(given, CHECKPOINT):
            return False
    elif given.name != WEIGHTS:
        return False
    weights = folder / WEIGHTS
    try:
        return (
            weights.is_file()
            and not (folder / CONFIG).is_file()
            and (given.is_dir() or is_safetensors(weights))
        )
    except OSError:  # an unreadable file: said as what it is where it is read
        return False
