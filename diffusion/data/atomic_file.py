"""A file written whole or not at all: `write_atomically` writes it under a hidden temporary name in its own folder
and renames it into place (`os.replace`, atomic on one filesystem), so a full disk, a kill or Ctrl+C leaves the file
of that name as it was and no partial file. Here, below generation/ and training/, which both write so (image grids,
a run's previews; training's checkpoints add their own torch writer in `diffusion.training.atomic_writes`).
"""

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from diffusion.errors import FREE_SPACE, CannotReplace, naming_a_full_disk

T = TypeVar("T")


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
    `full_disk_fix`), and on any failure (Ctrl+C too) no temporary file stays behind."""
    path = Path(path)
    temporary = path.with_name(f".{path.stem}.{secrets.token_hex(4)}.tmp{path.suffix}")
    try:
        with naming_a_full_disk(path, full_disk_fix):
            written = write(temporary)
            replace_into(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return written
