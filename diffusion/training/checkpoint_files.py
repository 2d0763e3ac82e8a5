"""Checkpoint files read safely: tensors and plain data only (``weights_only=True``), so loading never runs code
from the file, and a checkpoint that carries other pickled objects is refused with one clear error.

Files written by ``torch.save`` (checkpoints, post-hoc EMA snapshots, bare state_dicts) are zip archives whose
entries carry a CRC-32 of their bytes; ``torch.load`` does not check them, so a byte changed inside a tensor (a bad
copy, a failing disk) would load as a wrong weight. `check_zip_checksums` checks them, once per file version, before
a file is trusted, and `check_finite` refuses weights that are NaN or infinite before any work is done with them.
What a path given for a checkpoint is, when it is no checkpoint, is told by `checkpoint_paths`.
"""

import contextlib
import os
import pickle
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Self, cast

import lightning as L
import torch
from lightning.fabric.utilities.types import _MAP_LOCATION_TYPE, _PATH
from lightning.pytorch.utilities.model_helpers import _restricted_classmethod

from diffusion.data.file_in_folder import check_local_file, file_in_folder
from diffusion.data.numpy_files import PICKLED, numpy_file_kind
from diffusion.errors import InvalidValue, MissingFile, UserError, check_weights_fit
from diffusion.training.checkpoint_paths import (
    CHECKPOINT,
    check_not_an_export_without_config,
    is_local_file_path,
    is_safetensors,
)
from diffusion.training.checkpoint_paths import POST_HOC_EMA as POST_HOC_EMA  # run_folders' own, held equal
from diffusion.training.checkpoint_paths import SNAPSHOT_FILES as SNAPSHOT_FILES
from diffusion.training.export_files import export_network_weights, folder_of_weights_file, is_export
from diffusion.training.from_diffusers import INIT_FROM, diffusers_folders, read_init_weights

DAMAGED = "its bytes do not match their checksum (a bad copy or a failing disk)"
_INTACT: set[tuple[str, int, int]] = set()  # (path, size, mtime) of file versions whose checksums matched


class UnreadableCheckpoint(UserError, ValueError):
    """A checkpoint (or another file of torch.save) that cannot be read: `<subject> <path> <defect> — <fix>`, its
    parts kept as fields for a caller that lists such files (`--ckpt_path last` passing over them). A ValueError
    too, as InvalidValue is: the file given is what is wrong."""

    def __init__(self, subject: str, path: str | os.PathLike, defect: str, fix: str) -> None:
        super().__init__(f"{subject} {path} {defect}", fix)
        self.subject, self.path, self.defect = subject, Path(path), defect


def check_zip_checksums(path: str | os.PathLike, what: str, fix: str) -> None:
    """Raise UnreadableCheckpoint("<what> <path> is damaged: ...") unless every entry of the zip archive at `path`
    (a file of torch.save or np.savez) matches the CRC-32 stored with it. Reads the whole file once per file
    version."""
    path = Path(path)
    stat = path.stat()
    version = (str(path.absolute()), stat.st_size, stat.st_mtime_ns)
    if version in _INTACT:
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad_entry = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as err:
        raise UnreadableCheckpoint(what, path, f"is damaged: {DAMAGED} ({err})", fix) from err
    if bad_entry is not None:
        raise UnreadableCheckpoint(what, path, f"is damaged: {DAMAGED} (in {bad_entry})", fix)
    _INTACT.add(version)


def check_finite(weights: Mapping[str, torch.Tensor], what: str, fix: str) -> None:
    """Raise InvalidValue naming `what` and the first tensor of `weights` holding a NaN or an infinity."""
    for name, tensor in weights.items():
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            continue
        if not torch.isfinite(tensor).all():
            raise InvalidValue(
                f"{what} holds weights that are not finite (NaN or infinity), first {name}", fix
            )


def check_device_available(map_location: str | torch.device) -> None:
    """`map_location` names a device this machine has: refused by its name (InvalidValue) before the file is read
    (by load_checkpoint and `CheckedLoad.load_from_checkpoint`), where torch's failure to move a tensor there would
    read as a file it cannot load."""
    fix = "pass map_location='cpu' (or a device this machine has), and move the model later with .to(device)"
    try:
        device = torch.device(map_location)
    except (RuntimeError, ValueError) as error:
        raise InvalidValue(f"map_location={map_location!r} is not a device", fix) from error
    if device.type == "meta":  # its tensors have shapes and no values: the weights would be read into nothing
        raise InvalidValue(
            f"map_location={str(map_location)!r}: a tensor on the meta device holds no values, so the weights "
            "cannot be loaded onto it",
            fix,
        )
    # torch.device("cpu:1") is made, and torch.load failed as if the file were broken ("don't know how to restore
    # data location ... (tagged with cpu:1)"), even for cpu:0
    if device.type == "cpu":
        if device.index is not None:
            raise InvalidValue(
                f"map_location={str(map_location)!r}: the CPU takes no index (torch loads a checkpoint onto 'cpu', "
                f"not onto {device})",
                fix,
            )
        return
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.mps, torch.xpu: each says what it sees
    is_available = getattr(backend, "is_available", None)
    if is_available is None or not is_available():
        raise InvalidValue(
            f"map_location={str(map_location)!r}: torch sees no {device.type} device on this machine", fix
        )
    count = getattr(backend, "device_count", None)
    if device.index is not None and count is not None and device.index >= count():
        raise InvalidValue(
            f"map_location={str(map_location)!r}: this machine has {count()} {device.type} device(s), "
            f"{device.type}:0 to {device.type}:{count() - 1}",
            fix,
        )


def checked_checkpoint_file(path: str | os.PathLike, flag: str = "checkpoint", verify: bool = True) -> Path:
    """The checkpoint file at `path` (a folder holding one stands for it: `file_in_folder`), checked before torch
    reads it: a missing, empty, truncated, damaged (`verify`: its zip checksums) or foreign file (an .npz, a
    safetensors file, a pickle, an export folder) raises one clear error naming `flag`, where torch's or fsspec's
    error (`OSError: [Errno 22] Invalid argument` for a truncated file) named neither the file nor its defect."""
    check_not_an_export_without_config(path, flag)  # its folder or its model.safetensors: said as that
    path = file_in_folder(path, flag, CHECKPOINT)
    fix = "pass an intact .ckpt, e.g. runs/<name>/version_N/checkpoints/last.ckpt"
    if not path.is_file():
        raise MissingFile(f"{flag}: no checkpoint at {path}", fix)
    if path.stat().st_size == 0:
        raise UnreadableCheckpoint(flag, path, "is empty (0 bytes)", fix)
    if not zipfile.is_zipfile(path):
        # torch.save writes zip archives; a truncated one has lost its central directory at the end. Files of
        # another kind are named by their first bytes: unpickling a pickle to see what it holds could run code.
        # A safetensors file first: its header's length may start with a pickle's first byte.
        if is_safetensors(path):  # an export's or a diffusers model's weights, or a state_dict saved so
            raise UnreadableCheckpoint(
                flag,
                path,
                "is a safetensors file: weights alone, without the model's settings, not a PyTorch checkpoint",
                "pass a .ckpt written by train.py, or where a model is read (sample, evaluate, init_from) the "
                "folder it belongs to: an export (python -m diffusion.export) or a diffusers model folder",
            )
        kind = numpy_file_kind(path)
        if kind == "pickle":
            raise UnreadableCheckpoint(
                flag,
                path,
                f"{PICKLED} a checkpoint (a zip archive of tensors); it was not read, as "
                "unpickling it could run code",
                f"{fix}; a state_dict you trust: load it and torch.save it again (the zip format)",
            )
        if kind == "npy":
            raise UnreadableCheckpoint(
                flag, path, "is a NumPy array (np.save), not a PyTorch checkpoint", fix
            )
        raise UnreadableCheckpoint(
            flag, path, "is truncated or not a PyTorch checkpoint (no intact zip archive)", fix
        )
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    # An .npz (np.savez: top-level .npy entries) is no torch archive: torch's line was its C++ "enforce fail".
    if names and all(name.endswith(".npy") and "/" not in name for name in names):
        raise UnreadableCheckpoint(
            flag,
            path,
            "is a NumPy archive (np.savez, such as sample's samples.npz), not a PyTorch checkpoint",
            fix,
        )
    # A torch.save archive named .safetensors (phema once wrote one): torch.load, Lightning's too, would read it with
    # safetensors, by its name, and fail in safetensors' words
    if path.suffix == ".safetensors":
        raise UnreadableCheckpoint(
            flag,
            path,
            "is a PyTorch checkpoint (torch.save) named .safetensors",
            f"rename it to .ckpt ({path.with_suffix('.ckpt')}): torch reads a file of that name as safetensors",
        )
    if verify:
        check_zip_checksums(path, flag, "pass an intact checkpoint: an earlier one of the run, or a backup")
    return path


def read_checkpoint(
    path: str | os.PathLike,
    flag: str = "checkpoint",
    map_location: str | torch.device = "cpu",
    verify: bool = True,
) -> dict[str, Any]:
    """A checkpoint file's contents (tensors memory-mapped, no code run), or one clear error naming `flag`.

    A folder holding one checkpoint stands for it (`file_in_folder`). Raises FileNotFoundError (no such file) or
    a ValueError (a folder holding none or several, an empty, truncated, damaged or foreign file, or one that
    carries pickled objects other than tensors and plain data, which could run code when loaded).
    `verify` False skips the checksums (`check_zip_checksums`), for reading a checkpoint's step only.
    """
    path = checked_checkpoint_file(path, flag, verify)
    fix = "pass an intact .ckpt, e.g. runs/<name>/version_N/checkpoints/last.ckpt"
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        # An intact zip archive (its CRCs checked above) whose pickle the weights_only unpickler refused: by
        # what the load asked (weights_only=True), objects other than tensors and plain data.
        raise UnreadableCheckpoint(
            flag,
            path,
            "holds pickled objects other than tensors and plain data, which could run code "
            "when loaded; it was refused",
            "load only checkpoints written by this project (or that you trust)",
        ) from err
    except (EOFError, RuntimeError, OSError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnreadableCheckpoint(flag, path, f"cannot be read as a checkpoint ({first_line})", fix) from err
    if not isinstance(checkpoint, dict):
        raise UnreadableCheckpoint(flag, path, f"holds a {type(checkpoint).__name__}, not a checkpoint", fix)
    return checkpoint


def check_holds_weights(checkpoint: object, path: str | os.PathLike, flag: str) -> None:
    """A checkpoint a Trainer saved holds the model's weights ("state_dict") and the Trainer's own entry
    (`pytorch-lightning_version`): weights alone (`torch.save(network.state_dict())`), weights saved by hand as
    {"state_dict": ...} or other data are refused naming `flag`, where Lightning's reader ended in
    `KeyError: 'pytorch-lightning_version'`."""
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise UnreadableCheckpoint(
            flag, path, "holds no model weights (state_dict): it is not a checkpoint of a Lightning run",
            "pass a checkpoint a Trainer saved, e.g. runs/<name>/version_N/checkpoints/last.ckpt",
        )  # fmt: skip
    if "pytorch-lightning_version" not in checkpoint:
        raise UnreadableCheckpoint(
            flag, path, "holds model weights but no pytorch-lightning_version: a Trainer did not save it",
            "pass a checkpoint a Trainer saved (trainer.save_checkpoint(path), runs/<name>/version_N/checkpoints/"
            "*.ckpt), or load these weights into a module yourself: module.load_state_dict(checkpoint['state_dict'])",
        )  # fmt: skip


def check_holds_the_network(checkpoint: dict[str, Any], path: str | os.PathLike, network_given: bool) -> None:
    """The network's settings, which `load_from_checkpoint` rebuilds the network from unless `network=` is given:
    a module built in Python keeps its network out of its hyperparameters. Said naming the file where Lightning said
    `__init__() missing 1 required positional argument: 'network'`."""
    hparams = checkpoint.get("hyper_parameters")
    if not network_given and not (isinstance(hparams, dict) and isinstance(hparams.get("network"), dict)):
        raise InvalidValue(
            f"checkpoint_path {path} does not hold its network's settings (a module built in Python keeps its "
            "network out of its hyperparameters)",
            "pass the network it was trained with, built with the same settings (a UNet(...), an MLP(...) or your "
            "own): DiffusionModule.load_from_checkpoint(path, network=...)",
        )


def class_count(weights: Mapping[str, Any]) -> int | None:
    """The classes of a network's weights: its `ClassEmbedding`'s rows less the NO_LABEL one (None: unconditional)."""
    embedding = next((v for k, v in weights.items() if k.split(".")[-2:] == ["class_embed", "weight"]), None)
    return None if embedding is None else int(embedding.shape[0]) - 1


def check_network_given(checkpoint: dict[str, Any], path: Path, network: torch.nn.Module) -> None:
    """`load_from_checkpoint`'s `network=` fits the checkpoint's weights (its `network.` entries), said before Lightning
    builds the module: its words were torch's `size mismatch` lines, or class_names said to be given by the user."""
    state = checkpoint.get("state_dict")
    weights = {k.removeprefix("network."): v for k, v in (state or {}).items() if k.startswith("network.")}
    if not weights:  # not this project's kind of checkpoint: Lightning's to say
        return
    trained, given, name = class_count(weights), class_count(network.state_dict()), type(network).__name__
    if trained != given:  # a conditional model's checkpoint and an unconditional network, or the reverse
        said, wanted = "is of an unconditional model", f"{name}(...) without num_classes"
        if trained is not None:
            said = f"is of a class-conditional model of {trained} classes"
            wanted = f"{name}(..., num_classes={trained})"
        has = "no num_classes" if given is None else f"num_classes={given}"
        raise InvalidValue(
            f"checkpoint_path {path} {said}, and the network given has {has}",
            f"pass the network it was trained with: network={wanted}, its other settings those it was trained with",
        )
    fix = f"pass the network it was trained with: network={name}(...) with the settings it was trained with"
    check_weights_fit(network, weights, f"checkpoint_path {path}", fix)


class CheckedLoad(L.LightningModule):
    """Lightning's `load_from_checkpoint`, its file checked first as `load_checkpoint` and a Trainer's `ckpt_path`
    check it (`checked_checkpoint_file`, `check_holds_weights`): a missing, truncated, damaged (its zip checksums)
    or foreign file (an export folder, an .npz, weights alone) is one line naming it, where Lightning loaded a
    damaged file's changed weights without a word and said the others in fsspec's, torch's or its own words. A URL,
    another fsspec path or a file object is Lightning's to read; a `map_location` of no device here is refused first
    (`check_device_available`). `load_checkpoint`, which reads and checks the file itself, calls Lightning's own
    (`super(CheckedLoad, DiffusionModule)`): the file is checked once."""

    @_restricted_classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: _PATH | IO,
        map_location: _MAP_LOCATION_TYPE = None,
        hparams_file: _PATH | None = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Self:
        if isinstance(map_location, str | torch.device):  # as load_checkpoint says it, before a file is read
            check_device_available(map_location)
        if not is_local_file_path(checkpoint_path):
            return super().load_from_checkpoint(
                checkpoint_path, map_location, hparams_file, strict, weights_only, **kwargs
            )
        path = checked_checkpoint_file(cast(_PATH, checkpoint_path), "checkpoint_path")
        network = kwargs.get("network")
        if isinstance(network, torch.nn.Module) and strict is not False:  # cheap: the tensors memory-mapped
            contents: object = None  # a file torch cannot read so is Lightning's to say
            with contextlib.suppress(pickle.UnpicklingError, RuntimeError, OSError, EOFError):
                contents = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            if isinstance(contents, dict):  # the file's own defects said first
                check_holds_weights(contents, path, "checkpoint_path")
                check_network_given(contents, path, network)
        try:
            return super().load_from_checkpoint(
                path, map_location, hparams_file, strict, weights_only, **kwargs
            )
        except (KeyError, TypeError):  # Lightning's words for a file without a checkpoint's keys
            # Read again, the tensors memory-mapped and nothing but tensors and plain data unpickled; a file torch
            # cannot read so keeps Lightning's error
            with contextlib.suppress(pickle.UnpicklingError, RuntimeError, OSError, EOFError):
                checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                check_holds_weights(checkpoint, path, "checkpoint_path")
                check_holds_the_network(checkpoint, path, network_given="network" in kwargs)
            raise


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
        raise InvalidValue(
            f"{flag} {path}".strip()
            + " is not a checkpoint written by train.py (it lacks the network's settings "
            "or weights)",
            "pass a runs/<name>/version_N/checkpoints/*.ckpt (a model built in Python loads with "
            "DiffusionModule.load_from_checkpoint(path, network=...))",
        )
    return hparams


def read_network_weights(
    path: str | os.PathLike, network: torch.nn.Module | None = None
) -> dict[str, torch.Tensor]:
    """Network weights from a checkpoint of this project (its `network.` entries), a plain state_dict, an export
    (`diffusion.training.export_files`: the weights it holds), or a diffusers DDPMPipeline / UNet2DModel folder
    (renamed to this project's UNet, checked to have `network`'s channels)."""
    check_local_file(path, INIT_FROM, "a model")
    if diffusers_folders(path, INIT_FROM) is not None:
        return read_init_weights(path, network)
    if is_export(path) or folder_of_weights_file(path) is not None:  # its one set of weights (ema or raw)
        exported = export_network_weights(path)
        check_finite(exported, f"init_from {path}", "start from an earlier checkpoint of that run")
        return exported
    check_not_an_export_without_config(path, INIT_FROM)  # not "a folder that holds no checkpoint"
    path = file_in_folder(path, INIT_FROM, CHECKPOINT)
    if not path.is_file():
        raise MissingFile(f"init_from: no such file {path}", "pass a .ckpt of this project or a state_dict")
    # read as a checkpoint is: a damaged, cut-short, pickled or foreign file refused in one line (torch's own
    # UnpicklingError, or an AttributeError for a saved tensor, came out of DiffusionModule(init_from=...))
    state = read_checkpoint(path, INIT_FROM)
    state = state.get("state_dict", state)
    if any(key.startswith("network.") for key in state):
        state = {
            key.removeprefix("network."): value for key, value in state.items() if key.startswith("network.")
        }
    check_finite(state, f"init_from {path}", "start from an earlier checkpoint of that run")
    return state


def load_network_weights(network: torch.nn.Module, init_from: str | os.PathLike, owner: type) -> None:
    """Load `init_from`'s network weights (`read_network_weights`) into `network`, refusing weights of another shape
    in one line naming `owner`'s option."""
    weights = read_network_weights(init_from, network)
    fix = "use the {--network} settings of the run that saved them"
    check_weights_fit(network, weights, f"init_from={init_from}", fix, owner)
    network.load_state_dict(weights)


def drop_old_schedule_buffers(checkpoint: dict[str, Any], own: set[str]) -> None:
    """Checkpoints of earlier versions carry six more schedule buffers (posterior terms now computed on use): the
    `schedule.` entries of the module's and the EMA's weights that the module (its state_dict keys, `own`) lacks."""
    for key in ("state_dict", "current_model_state"):
        if key in checkpoint:
            checkpoint[key] = {
                k: v for k, v in checkpoint[key].items() if k in own or not k.startswith("schedule.")
            }
