"""The faults of a write, said as the user's to mend: a full disk (DiskFull), a folder that refuses (CannotWrite,
FlaggedFolder: one flagged `chattr +i`), a file that refuses to be replaced (CannotReplace); `naming_a_full_disk`
turns the OS's error inside a write into one of them, naming the folder and the file. Re-exported by
`diffusion.errors`, the layer every writer imports them from."""

import errno
import os
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeGuard

from diffusion.errors import InvalidValue, MissingFile, UserError

FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left; the user's quota used up
FREE_SPACE = (
    "free space on that disk, or write to a folder on another disk; the files written there before are intact"
)


def is_disk_full(error: BaseException) -> TypeGuard[OSError]:
    """The OS refused a write for want of room (by errno: the same on every platform's message)."""
    return isinstance(error, OSError) and error.errno in FULL_DISK_ERRNOS


class DiskFull(UserError, OSError):
    """No room left for a file being written: `no space left on the disk of <folder> while saving <name> — <fix>`.
    Raised where the project writes (`naming_a_full_disk`), which knows the file; it carries `folder` and `name`.
    An OSError too, for Python callers (its errno None: `is_disk_full` does not take it for the OS's own)."""

    def __init__(self, folder: Path, name: str, fix: str = FREE_SPACE) -> None:
        super().__init__(f"no space left on the disk of {folder} while saving {name}", fix)
        self.folder, self.name = folder, name


REFUSED_WRITE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)  # no permission; an immutable file; read-only
MAKE_WRITABLE = "make that folder writable for this user, or write to another folder; the files written there before are intact"


class CannotWrite(UserError, OSError):
    """A folder that refuses a write (no permission, a read-only disk, an immutable folder): `cannot write <name>
    into <folder> (<the system's reason>) — <fix>`. It carries `folder` and `name`, as DiskFull does; an OSError
    too."""

    def __init__(self, folder: Path, name: str, reason: str, fix: str = MAKE_WRITABLE) -> None:
        super().__init__(f"cannot write {name} into {folder} ({reason})", fix)
        self.folder, self.name = folder, name


@contextmanager
def naming_a_full_disk(path: str | Path, fix: str = FREE_SPACE) -> Iterator[None]:
    """A full disk (OSError ENOSPC or EDQUOT) while the block writes `path` becomes `DiskFull` naming its folder
    (the outermost naming's: a grid's temporary file is said as the run's grid), and a folder that refuses the write
    (EACCES, EPERM, EROFS) `CannotWrite`; any other error passes as it is."""
    with _naming_the_write(Path(path).parent, Path(path).name, fix):
        yield


@contextmanager
def _naming_the_write(folder: Path, name: str, fix: str) -> Iterator[None]:
    """`naming_a_full_disk` of `name` in `folder`: a name said in words ("the lock file X of --out A/B") kept whole."""
    try:
        yield
    except OSError as error:
        # An inner naming's (a temporary file's) is said again: this one knows what the user asked for
        if isinstance(error, DiskFull) and isinstance(error.__cause__, OSError):
            error = error.__cause__
        if is_disk_full(error):
            raise DiskFull(folder, name, fix) from error
        if error.errno in REFUSED_WRITE_ERRNOS:
            raise CannotWrite(folder, name, error.strerror or type(error).__name__) from error
        raise


# A file or folder flagged immutable or append-only (`chattr +i` / `+a`) refuses whatever its mode bits say: said
# by its flag (here, below every layer that writes: training's saves, the image grids).
class CannotReplace(CannotWrite):
    """The file already at a path refuses to be replaced, in a folder that takes new files (the new version was
    written there): an immutable or append-only file (`chattr +i`), or another user's in a sticky folder. A
    CannotWrite, whose usual fix (make the folder writable) would not help."""

    def __init__(self, path: Path, reason: str) -> None:
        UserError.__init__(
            self,
            f"cannot replace {path.name} in {path.parent} ({reason}): the folder takes new files, but {path.name} "
            "itself refuses to be replaced",
            f"check its attributes (lsattr {path}; chattr -i clears an immutable flag) and its owner, or move it "
            "away; it is as it was, and the files written there before are intact",
        )
        self.folder, self.name = path.parent, path.name


# Linux's file flags (linux/fs.h): FS_IOC_GETFLAGS, and the flags that make a file refuse to be replaced
FS_IOC_GETFLAGS, REFUSING_FLAGS = 0x80086601, {0x10: "it is immutable", 0x20: "it is append-only"}


def refusing_flag(path: Path) -> str | None:
    """Why the file or folder at `path` refuses changes whatever its mode bits say ("it is immutable", "it is
    append-only": `chattr +i` / `+a`), or None. Linux only; elsewhere, and on a file system without the flags,
    nothing is known: None."""
    if not sys.platform.startswith("linux") or not path.exists():
        return None
    import fcntl  # Unix only

    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a folder opens too
        try:
            found = fcntl.ioctl(descriptor, FS_IOC_GETFLAGS, struct.pack("i", 0))
        finally:
            os.close(descriptor)
    except OSError:
        return None
    flags = struct.unpack("i", found)[0]
    return next((reason for flag, reason in REFUSING_FLAGS.items() if flags & flag), None)


def check_replaceable(path: Path) -> None:
    """Raise CannotReplace where the file at `path`, which a run is about to replace, is immutable or append-only
    (`chattr +i` / `+a`), before any work is spent: the save at the end would fail. Linux only; elsewhere, and on a
    file system without the flags, nothing is known and nothing raised."""
    reason = refusing_flag(path) if path.is_file() else None
    if reason is not None:
        raise CannotReplace(path, reason)


def check_can_replace(target: Path) -> None:
    """Refuse, before any work is spent, a file that a command will replace (a new one written beside it, then
    renamed over it) and that refuses to be: one flagged immutable or append-only (`check_replaceable`), or one that
    refuses to be opened for writing while its folder takes new files, is said as the file (CannotReplace: "check
    its attributes"), not as its folder; a folder that refuses is said as the folder (CannotWrite)."""
    if not target.is_file():
        return
    check_replaceable(target)
    with naming_a_full_disk(target):
        try:
            with open(target, "r+b"):
                pass
        except PermissionError as error:
            if not os.access(target.parent, os.W_OK | os.X_OK):
                raise  # the folder refuses: said of the folder (CannotWrite)
            raise CannotReplace(target, error.strerror or type(error).__name__) from error


class FlaggedFolder(CannotWrite):
    """A folder that refuses writes for a flag of its own (`chattr +i` / `+a`), whatever its mode bits say: making
    it "writable for this user" would not help (root is refused too)."""

    def __init__(self, folder: Path, name: str, reason: str) -> None:
        UserError.__init__(
            self,
            f"cannot write {name} into {folder} ({reason})",
            f"check its attributes (lsattr -d {folder}; chattr -i clears an immutable flag), "
            "or write to another folder; the files written there before are intact",
        )
        self.folder, self.name = folder, name


@contextmanager
def naming_a_refusing_folder(folder: Path, name: str, fix: str = FREE_SPACE) -> Iterator[None]:
    """`naming_a_full_disk(folder / name, fix)`, a refusal of a folder flagged immutable or append-only said as its
    flag (FlaggedFolder), not as its mode bits."""
    try:
        with _naming_the_write(folder, name, fix):
            yield
    except CannotWrite as error:
        reason = refusing_flag(folder)
        if reason is None or isinstance(error, CannotReplace):
            raise
        raise FlaggedFolder(folder, name, reason) from error.__cause__


def check_folder_exists(path: Path, name: str) -> None:
    """The folder a file of a Python caller's is to be written into (`name`=`path`) exists: a missing folder
    (MissingFile) or a file where a folder goes (`samples.npz/grid.png`: InvalidValue) said of `path`, where the
    write said the OS's error naming its temporary file."""
    if path.parent.is_dir():
        return
    existing = next((folder for folder in path.parents if folder.exists()), None)
    if existing is not None and not existing.is_dir():
        raise InvalidValue(
            f"{name}={str(path)!r}: {existing} is a file, not a folder", "pass a path in a folder"
        )
    raise MissingFile(
        f"{name}={str(path)!r}: the folder {path.parent} does not exist",
        "make the folder first, or pass a path in a folder that exists",
    )
