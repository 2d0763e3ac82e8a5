"""The files of an export (`diffusion.training.exported`), found and read without building a model: which path names
an export, and the weights it holds, checked against its checksum. Below `DiffusionModule`, whose ``init_from``
reads an export's weights (`diffusion.training.checkpoint_files.read_network_weights`), while `exported` builds
modules."""

import hashlib
import json
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from diffusion.data.numpy_files import is_torch_archive
from diffusion.errors import InvalidValue, MissingFile

CONFIG, WEIGHTS = "config.json", "model.safetensors"
FORMAT, FORMAT_VERSION = "diffusion.export", 1
FIX = (
    "pass a folder written by python -m diffusion.export {command:--format} safetensors (or its config.json)"
)
AGAIN = "copy the export again, or export the checkpoint again (python -m diffusion.export)"


def is_export(path: str | os.PathLike) -> bool:
    """Whether `path` names an export: a folder holding config.json, or a .json file."""
    path = Path(path).expanduser()
    return (path.is_dir() and (path / CONFIG).is_file()) or path.suffix == ".json"


def folder_of_weights_file(path: str | os.PathLike) -> Path | None:
    """The export's folder when `path` is its model.safetensors (beside the config.json of an export of this
    project), else None: the weights file alone is no model (its settings are in config.json)."""
    path = Path(path).expanduser()
    if path.name != WEIGHTS or not path.is_file() or not (path.parent / CONFIG).is_file():
        return None
    try:
        config = json.loads((path.parent / CONFIG).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # not an export's config.json: the file is read as what it is
    return path.parent if isinstance(config, dict) and config.get("format") == FORMAT else None


def sha256_of(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def read_export_weights(folder: Path, expected_sha256: object = None) -> dict[str, torch.Tensor]:
    """The state_dict in `folder`'s model.safetensors, refused when its bytes do not match `expected_sha256`
    (config.json's ``weights_sha256``; None: an export written without it, read unchecked). A torch checkpoint
    copied there (a .ckpt renamed) is said as such before the checksum: it is no damaged copy of the weights."""
    if is_torch_archive(folder / WEIGHTS):
        raise InvalidValue(
            f"{folder / WEIGHTS} is a PyTorch checkpoint (torch.save), not the safetensors weights an export holds",
            "pass the .ckpt itself to load_checkpoint (under a .ckpt name), or export it again (python -m "
            f"diffusion.export) into {folder}",
        )
    if expected_sha256 is not None and not (
        isinstance(expected_sha256, str) and re.fullmatch(r"[0-9a-fA-F]{64}", expected_sha256)
    ):  # an edited config.json: the weights are not what is wrong
        raise InvalidValue(
            f"{folder / CONFIG}: weights_sha256={expected_sha256!r} is not a SHA-256 (64 hex digits)",
            f"write back the value export wrote, or export the checkpoint again (python -m diffusion.export) into "
            f"{folder}",
        )
    if (
        expected_sha256 is not None
        and (folder / WEIGHTS).is_file()
        and sha256_of(folder / WEIGHTS) != str(expected_sha256).lower()
    ):
        raise InvalidValue(
            f"{folder / WEIGHTS} is damaged: its bytes do not match the checksum in {CONFIG} (a bad copy or a "
            "failing disk)",
            AGAIN,
        )
    try:
        return load_file(folder / WEIGHTS)
    except (FileNotFoundError, SafetensorError) as err:
        kind = MissingFile if isinstance(err, FileNotFoundError) else InvalidValue
        raise kind(f"{folder / WEIGHTS} cannot be read ({str(err) or type(err).__name__})", FIX) from err


def export_network_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The network weights of the export `path` names (its folder, config.json or model.safetensors): for
    ``init_from``, which takes a network's weights alone (the export's settings are checked by who starts the run:
    train.py's `check_init_from_export`)."""
    path = Path(path).expanduser()
    folder = folder_of_weights_file(path) or (path if path.is_dir() else path.parent)
    try:
        config = json.loads((folder / CONFIG).read_text())
    except FileNotFoundError as err:
        raise MissingFile(f"no export config at {folder / CONFIG}", FIX) from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidValue(f"{folder / CONFIG} cannot be read as an export's config ({err})", FIX) from err
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise InvalidValue(f"{folder / CONFIG} is not the config of an export of this project", FIX)
    return read_export_weights(folder, config.get("weights_sha256"))
