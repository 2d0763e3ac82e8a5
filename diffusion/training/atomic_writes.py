"""Atomic writes of checkpoints and the other files a run keeps (post-hoc EMA snapshots): written to a hidden
temporary file in their own folder, fsynced, renamed into place.

Lightning's TorchCheckpointIO stages a checkpoint in the system temp dir (fsspec's `mkstemp`) and moves it,
which across filesystems is a copy: a kill then leaves a truncated checkpoint under its final name and a temp
file in /tmp. Here `os.replace` (atomic on one filesystem) swaps in a complete file or nothing: a kill or a
full disk leaves the previous file of that name intact. A kill -9 can still leave `.<name>.<random>.tmp` in
the checkpoint folder (nowhere else); `remove_leftovers` clears those when the next run starts.

A full disk at any point of a save (opening the temporary file, torch's zip writer, the fsync, the rename) ends in
`diffusion.errors.DiskFull` naming the folder, with no temporary file left; a folder that refuses the write in
`CannotWrite`, one flagged immutable (`chattr +i`, which refuses root too) in `FlaggedFolder`, said by its flag.
torch's writer swallows the OSError its file's `write` raised and raises a RuntimeError of its own ("unexpected
pos"), so the file it is handed records that OSError (`RecordingWrites`) and the save raises it instead: the cause
is known by its errno, not read from torch's words.
`diffusion.training.callbacks.Checkpoint` installs all of this for every run of the CLI, and
`DiffusionModule.setup` for a user's own Trainer, whose `ckpt_path` Lightning reads after `setup`:
`AtomicCheckpointIO.load_checkpoint` checks that file first (`checkpoint_files.checked_checkpoint_file`).

A folder of files written whole (an export: `writing_whole`) is written into a hidden staging folder beside it and
its files moved in once complete, all of them or none (`move_into`, the export command's way): a full disk or a
folder that refuses writes leaves no partial export, and an export already there as it was.
"""

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
from lightning.pytorch.strategies import Strategy

from diffusion.data import staging
from diffusion.data.staging import replace_into as replace_into
from diffusion.errors import FREE_SPACE, CannotWrite, InvalidValue, UserError, is_disk_full

# The refusals of a flagged file or folder live in the lowest layer (image grids say them too); kept importable
# from here, where the writes are.
from diffusion.errors import CannotReplace as CannotReplace
from diffusion.errors import FlaggedFolder as FlaggedFolder
from diffusion.errors import check_can_replace as check_can_replace
from diffusion.errors import check_replaceable as check_replaceable
from diffusion.errors import naming_a_refusing_folder as naming_a_refusing_folder
from diffusion.errors import refusing_flag as refusing_flag
from diffusion.training.checkpoint_files import check_holds_weights, checked_checkpoint_file

T = TypeVar("T")
LEFTOVERS = ".*.ckpt.*.tmp"  # temporary names never end in .ckpt, so no glob for checkpoints picks them up
RUN_ON_ANOTHER_DISK = (
    "free space there, or put the run on another disk ({Trainer:--logger.init_args.save_dir} DIR, or "
    "{Trainer:--default_root_dir} DIR without a logger); any checkpoint saved before is intact"
)


def temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose local saves are atomic, and whose loads (a fit's, validate's, ... `ckpt_path`) check
    the file first; remote paths (s3://, ...) keep Lightning's writer and reader."""

    def save_checkpoint(self, checkpoint: dict, path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        save_atomically(checkpoint, path, RUN_ON_ANOTHER_DISK)

    def load_checkpoint(self, path: _PATH, *args: Any, **kwargs: Any) -> dict[str, Any]:
        # A missing, truncated, damaged or foreign file (an export folder, an .npz) said in one line naming it, as
        # load_checkpoint says it: Lightning's reader raised fsspec's `OSError: [Errno 22] Invalid argument` for a
        # truncated one. The zip checksums are read once per file version (train.py's --ckpt_path checks did).
        if not isinstance(get_filesystem(path), LocalFileSystem):
            return super().load_checkpoint(path, *args, **kwargs)
        path = checked_checkpoint_file(path, "ckpt_path")
        checkpoint = super().load_checkpoint(path, *args, **kwargs)
        check_holds_weights(checkpoint, path, "ckpt_path")  # weights alone, or saved by hand
        return checkpoint


class RecordingWrites:
    """The file torch.save writes to, keeping the OSError its `write` raised (`error`): torch's zip writer drops
    it and raises a RuntimeError that does not say why."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = error
            raise

    def __getattr__(self, name: str) -> Any:  # the rest as the file has it (name, fileno, flush, ...)
        return getattr(self.file, name)


def save_atomically(contents: Any, path: _PATH, full_disk_fix: str | None = None) -> None:
    """`torch.save(contents, path)` through a hidden temporary file in the same folder, fsynced and renamed
    into place: `path` ends up complete or as it was. A full disk raises `DiskFull` (its fix `full_disk_fix`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_name(path)
    try:
        # a folder flagged immutable (`chattr +i`; root is refused too, whatever the mode bits) said by its flag
        with naming_a_refusing_folder(path.parent, path.name, full_disk_fix or FREE_SPACE):
            with open(temporary, "xb") as file:
                writes = RecordingWrites(file)
                try:
                    torch.save(contents, writes)
                except RuntimeError as error:
                    if writes.error is None:
                        raise
                    raise writes.error from error
                file.flush()
                os.fsync(file.fileno())
            replace_into(temporary, path)
    except BaseException:  # a full disk, Ctrl+C, ...: no temporary file stays behind
        temporary.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)  # so that the rename itself survives a power cut


def write_atomically(path: _PATH, write: Callable[[Path], T], full_disk_fix: str = RUN_ON_ANOTHER_DISK) -> T:
    """`diffusion.data.staging.write_atomically`, a full disk's fix the run's (`RUN_ON_ANOTHER_DISK`)."""
    return staging.write_atomically(path, write, full_disk_fix)


def link_atomically(target: _PATH, link: _PATH) -> None:
    """Make `link` a symlink to `target` (a copy where symlinks fail, as on Windows without the privilege),
    replacing whatever `link` was in one step."""
    link = Path(link)
    temporary = temporary_name(link)
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    try:
        with naming_a_refusing_folder(link.parent, link.name, RUN_ON_ANOTHER_DISK):
            try:
                temporary.symlink_to(os.path.relpath(target, link.parent))
            except OSError as error:
                if is_disk_full(error):
                    raise
                shutil.copyfile(target, temporary)
                with open(temporary, "rb+") as file:
                    os.fsync(file.fileno())
            replace_into(temporary, link)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


# A folder of files written whole: an export (`diffusion.training.exported.write_export`, the diffusers pipeline's
# `save_pipeline`), written into a staging folder and moved in once complete, all of its files or none (the export
# command's way). What an export writes at the top of its folder, of either format (safetensors: config.json and its
# weights; diffusers: a pipeline's model_index.json, unet/ and scheduler/).
EXPORT_ENTRIES = ("config.json", "model.safetensors", "model_index.json", "unet", "scheduler")
AGAIN = "or export again into a new {command:--out}"  # the export command's; a Python writer says its own


class CannotPutBack(CannotWrite):
    """A failed move of an export's files into `out` (`move_into`) whose files set aside (those it replaced) could
    not be put back either: they are in `aside`. An OSError too, as every CannotWrite."""

    def __init__(self, out: Path, aside: Path, reason: str, again: str) -> None:
        UserError.__init__(
            self,
            f"cannot write the export into {out}, nor put back the files it replaced ({reason})",
            f"they are in {aside}: move them back into {out}, {again}",
        )
        self.folder, self.name = out, "the export"


def staging_folder(out: Path) -> Path:
    """Where the export is written, and what it replaces set aside, before the moves into the existing folder
    `out`: next to it where a rename into it works (the same filesystem, and a folder that can be written), else in
    `out` itself: a mount point's parent is another filesystem, and a rename across them failed with EXDEV
    ("Invalid cross-device link")."""
    try:
        if os.stat(out.parent).st_dev == os.stat(out).st_dev and os.access(out.parent, os.W_OK | os.X_OK):
            return out.parent
    except OSError:
        pass
    return out


def move_into(
    staged: Path, out: Path, stale_entries: tuple[str, ...] = EXPORT_ENTRIES, again: str = AGAIN
) -> None:
    """Move every file of `staged` to the same place under `out`, all of them or none: each file of `out` it
    replaces is first tried for writing (`chattr +i` refused only the move, the files before it moved in already:
    `check_can_replace`) and set aside, and where a move fails the files moved in go and those set aside come back.
    The entries of `stale_entries` in `out` that the new files do not replace go too (an earlier export of the other
    format, which the folder loaded as); `again`: the fix where the files set aside cannot be put back ("or ...")."""
    sources = sorted(p for p in staged.rglob("*") if p.is_file())
    targets = [out / source.relative_to(staged) for source in sources]
    earlier = [out / name for name in stale_entries if (out / name).exists()]
    targets_within = {entry for target in targets for entry in (target, *target.parents)}
    stale = [entry for entry in earlier if entry not in targets_within]
    for target in [*targets, *stale]:
        if target.is_file():
            check_can_replace(target)
    taken = next((target for target in targets if target.is_dir()), None)
    if taken is not None:  # it would be set aside with what it holds, and removed with the files replaced
        raise InvalidValue(
            f"{taken} is a folder, where the file {taken.relative_to(out)} of the export goes",
            f"move that folder away (it is as it was), {again.removeprefix('or ')}",
        )
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".replaced", dir=staging_folder(out)))
    done: list[tuple[Path, Path]] = []  # (from, to), undone last first
    made: list[Path] = []  # the folders under `out` the moves made, removed with them
    try:
        for entry in stale:  # set aside whole, as the replaced files are
            os.rename(entry, aside / entry.name)
            done.append((entry, aside / entry.name))
        for target in targets:
            if target.exists():
                (aside / target.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
                os.rename(target, aside / target.relative_to(out))
                done.append((target, aside / target.relative_to(out)))
        for source, target in zip(sources, targets, strict=True):
            made += [d for d in (target.parent, *target.parent.parents) if d not in made and not d.exists()]
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(source, target)
            done.append((source, target))
    except BaseException:
        try:
            for before, after in reversed(done):
                os.rename(after, before)
            for folder in sorted(made, key=lambda d: len(d.parts), reverse=True):
                folder.rmdir()
        except OSError as error:
            raise CannotPutBack(out, aside, error.strerror or type(error).__name__, again) from error
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def writing_whole(folder: Path, name: str, fix: str, again: str) -> Iterator[Path]:
    """A new hidden folder for the block to write `name` (an export's files) into, moved into `folder` once the
    block ends (`move_into`, replacing the files of the same names there): a failure (a full disk, a folder that
    refuses writes, Ctrl+C) leaves `folder` as it was (one it made is removed again) and no staging folder, and a
    full disk or a refusing folder is said in one line naming `folder`: `DiskFull` (its fix `fix`), `FlaggedFolder`
    (`chattr +i`), `CannotWrite`."""
    # save_pipeline's folder may be new (save_pretrained's is): made with its missing parents, a refusal said as
    # the refusal of the folder that exists (`chattr +i` on it)
    made = [] if folder.exists() else [folder, *(p for p in folder.parents if not p.exists())]
    try:
        if made:
            base = made[-1].parent
            with naming_a_refusing_folder(base, str(folder.relative_to(base)), fix):
                folder.mkdir(parents=True)
        with naming_a_refusing_folder(folder, name, fix):
            staged = Path(
                tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=staging_folder(folder))
            )
            try:
                yield staged
                move_into(staged, folder, (), again)
            finally:
                shutil.rmtree(staged, ignore_errors=True)
    except BaseException:
        for path in made:  # the deepest first, each while it is empty
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
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
