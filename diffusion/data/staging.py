"""A prepare's `--out` folder around the writing of its chunks (`diffusion.data.preparing`): one prepare at a time
(`writing_alone`, its lock in `PREPARE_LOCK`: `diffusion.data.folder_lock`), a finished set replaced by the one
written beside it in `STAGING` (`swap_in`, the old one set aside in `REPLACED` until then), and a prepare's own files
removed, never the user's (`clear`: a stopped prepare's leftovers, a set `--overwrite` replaces, what a failed
prepare wrote). Which files are a prepare's is said by `diffusion.data.prepared` (`written_by_a_prepare`).

A single file written whole or not at all (`write_atomically`): written under a hidden temporary name in its own
folder and renamed into place (`os.replace`, atomic on one filesystem), so a full disk, a kill or Ctrl+C leaves the
file of that name as it was and no partial file. Here, below generation/ and training/, which both write so (image
grids, a run's previews; training's checkpoints add their own torch writer in `diffusion.training.atomic_writes`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from diffusion.data import folder_lock
from diffusion.data.prepared import (
    MANIFEST,
    PARTS,
    PREPARE_LOCK,
    REPLACED,
    STAGING,
    in_object_storage,
    is_url,
    listing,
    prepares_file,
    written_by_a_prepare,
)
from diffusion.errors import FREE_SPACE, CannotReplace, CannotWrite, UserError, naming_a_refusing_folder

T = TypeVar("T")

KEPT_WHERE_REFUSED = "make that folder writable for this user, or write to another folder; what this prepare wrote is removed, the prepared set there before is kept"


@contextlib.contextmanager
def writing_alone(out: str) -> Iterator[None]:
    """Hold `out`'s lock (`PREPARE_LOCK` in it; `folder_lock.writing_alone`, as sample, export and phema hold
    theirs) while the block writes the set there, or refuse at once where another prepare holds it. A folder only:
    object storage has no lock, so two prepares to one URL at once are not told apart (the last to finish wins)."""
    if is_url(out):
        yield
        return
    with folder_lock.writing_alone(out, "prepare", Path(out, PREPARE_LOCK)):
        yield


class SetLeftAside(UserError, OSError):
    """A prepared set replaced on the way, whose old files could not be put back where they were (they are left
    aside, in a folder the message names); an OSError too, as the system's refusal that left them there."""


def swap_in(out: str, staged: str) -> None:
    """Replace the finished set at `out` by the finished set in `staged` (its folder under `out`): renames on one
    disk, the old set first set aside (its manifest first) then the new one moved in (its manifest last), so a set
    stopped on the way is never a mix training accepts; where a rename fails, the old set is put back as it was."""
    base, new, aside = Path(out), Path(staged), Path(out, REPLACED)
    moves = [(base / name, aside / name) for name in (MANIFEST, *PARTS) if (base / name).exists()]
    moves += [(new / name, base / name) for name in (*PARTS, MANIFEST) if (new / name).exists()]
    done: list[tuple[Path, Path]] = []
    try:
        aside.mkdir(exist_ok=True)
        for source, target in moves:
            source.rename(target)
            done.append((source, target))
    except OSError as error:
        reason = error.strerror or type(error).__name__
        try:
            for source, target in reversed(done):
                target.rename(source)
            aside.rmdir()
        except OSError as again:
            raise SetLeftAside(
                f"cannot replace the prepared set in {out} ({reason}), nor put its files back ({again.strerror})",
                f"the set there before is in {aside} ({MANIFEST} last): move it back into {out}, or prepare again",
            ) from error
        raise CannotWrite(base, "the prepared set", reason, KEPT_WHERE_REFUSED) from error
    with contextlib.suppress(FileNotFoundError):
        (base / f"{MANIFEST}.partial").unlink()  # an earlier write's, stopped
    shutil.rmtree(aside, ignore_errors=True)
    new.rmdir()
    if aside.exists():
        warnings.warn(
            f"the replaced prepared set's files are left in {aside}: remove them yourself", stacklevel=2
        )


def clear(root: str) -> None:
    """Remove the files a prepare writes under `root` (`written_by_a_prepare`), and its part folders once empty:
    a set a prepare was asked to replace, or what a prepare that failed wrote. Nothing else is touched."""
    if is_url(root):
        names = [name for name in listing(root) if written_by_a_prepare(name)]
        if names:
            in_object_storage("delete", root, names)
        return
    base = Path(root)
    if not base.is_dir():
        return
    for staged in (base / STAGING, base / REPLACED):  # a stopped prepare's, or a replaced set's
        if staged.is_dir() and not staged.is_symlink():
            clear(str(staged))
            with contextlib.suppress(OSError):
                staged.rmdir()
    for part in PARTS:
        folder = base / part
        if folder.is_dir() and not folder.is_symlink():
            for entry in folder.iterdir():
                if prepares_file(entry, base):
                    entry.unlink()
            with contextlib.suppress(OSError):  # not empty: something of the user's is left there
                folder.rmdir()
    for entry in base.iterdir():
        if prepares_file(entry, base):
            entry.unlink()


def replace_into(temporary: Path, path: Path) -> None:
    """`os.replace(temporary, path)`, where `temporary` was just written in `path`'s folder: a refusal then is the
    file at `path` refusing to go (CannotReplace), unless the folder itself no longer takes writes."""
    try:
        os.replace(temporary, path)
    except PermissionError as error:  # EPERM (an immutable file), EACCES
        if os.path.lexists(path) and os.access(path.parent, os.W_OK | os.X_OK):
            raise CannotReplace(path, error.strerror or type(error).__name__) from error
        raise


def write_atomically(
    path: str | os.PathLike, write: Callable[[Path], T], full_disk_fix: str = FREE_SPACE
) -> T:
    """`write(temporary)` (a hidden name in `path`'s folder that keeps its suffix: image writers choose the format
    by it), then renamed into place; returns what `write` returned. A full disk raises `DiskFull` (its fix
    `full_disk_fix`), a folder flagged immutable `FlaggedFolder` (its flag the fix), and on any failure (Ctrl+C
    too) no temporary file stays behind."""
    path = Path(path)
    temporary = path.with_name(f".{path.stem}.{secrets.token_hex(4)}.tmp{path.suffix}")
    try:
        with naming_a_refusing_folder(path.parent, path.name, full_disk_fix):
            written = write(temporary)
            replace_into(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return written
