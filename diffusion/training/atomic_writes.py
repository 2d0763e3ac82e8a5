"""Atomic writes of checkpoints and the other files a run keeps (post-hoc EMA snapshots): written to a hidden
temporary file in their own folder, fsynced, renamed into place.

Lightning's TorchCheckpointIO stages a checkpoint in the system temp dir (fsspec's `mkstemp`) and moves it,
which across filesystems is a copy: a kill then leaves a truncated checkpoint under its final name and a temp
file in /tmp. Here `os.replace` (atomic on one filesystem) swaps in a complete file or nothing: a kill or a
full disk leaves the previous file of that name intact. A kill -9 can still leave `.<name>.<random>.tmp` in
the checkpoint folder (nowhere else); `remove_leftovers` clears those when the next run starts.
`diffusion.training.callbacks.Checkpoint` installs all of this for every run of the CLI.
"""

import contextlib
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
from lightning.pytorch.strategies import Strategy

LEFTOVERS = ".*.ckpt.*.tmp"  # temporary names never end in .ckpt, so no glob for checkpoints picks them up


def temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose local saves are atomic; remote paths (s3://, ...) keep Lightning's writer."""

    def save_checkpoint(self, checkpoint: dict, path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        save_atomically(checkpoint, path)


def save_atomically(contents: Any, path: _PATH) -> None:
    """`torch.save(contents, path)` through a hidden temporary file in the same folder, fsynced and renamed
    into place: `path` ends up complete or as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_name(path)
    try:
        with open(temporary, "xb") as file:
            torch.save(contents, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:  # a full disk (OSError ENOSPC), Ctrl+C, ...: no temporary file stays behind
        temporary.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)  # so that the rename itself survives a power cut


def link_atomically(target: _PATH, link: _PATH) -> None:
    """Make `link` a symlink to `target` (a copy where symlinks fail, as on Windows without the privilege),
    replacing whatever `link` was in one step."""
    link = Path(link)
    temporary = temporary_name(link)
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    try:
        try:
            temporary.symlink_to(os.path.relpath(target, link.parent))
        except OSError:
            shutil.copyfile(target, temporary)
            with open(temporary, "rb+") as file:
                os.fsync(file.fileno())
        os.replace(temporary, link)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def install(strategy: Strategy) -> None:
    """Use `AtomicCheckpointIO` for the strategy's saves, unless a writer other than Lightning's default was
    configured (that one is the user's choice)."""
    writer = strategy.checkpoint_io
    if type(writer) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
    elif isinstance(writer, _WrappingCheckpointIO) and type(writer.checkpoint_io) is TorchCheckpointIO:
        writer.checkpoint_io = AtomicCheckpointIO()  # AsyncCheckpointIO: it runs ours in its thread


def remove_leftovers(folder: Path, pattern: str = LEFTOVERS) -> None:
    """Remove the temporary files of saves that were killed in `folder` (of checkpoints, or `pattern`'s)."""
    for leftover in folder.glob(pattern):
        leftover.unlink(missing_ok=True)


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every OS / filesystem can open or sync a folder
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
