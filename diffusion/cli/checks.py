"""Checks that more than one command makes before any time is spent."""

import os
import tempfile
from pathlib import Path

from diffusion.errors import UserError


def check_writable_folder(path: str | os.PathLike, flag: str) -> None:
    """Raise UserError unless `path` is a folder this process can write into, or could create.

    Nothing is created: the nearest existing ancestor is tested by writing a temporary file there.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a folder", "pass a folder (it is created if missing)")
    existing = next(p for p in [path, *path.absolute().parents] if p.exists())
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is a file, not a folder", "pass a path through folders")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise UserError(
            f"{flag} {path}: cannot write into {existing} ({err.strerror or err})",
            "pick a folder you can write to",
        ) from err
