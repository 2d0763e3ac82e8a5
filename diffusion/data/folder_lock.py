"""One process at a time writes a folder: an advisory lock (`fcntl.flock`) on a lock file in it, which the kernel lets
go when the process ends, even by SIGKILL, so a killed holder never blocks the next one. The lock file holds a line
about its holder (`"<pid> <host> ..."`), read by whoever is refused. A run folder's (`training_in`, the training
layer's) and a prepared set's folder's (`diffusion.data.staging`); a command's --out (`writing_alone`: sample's, in
the folder; export's and phema's, beside the folder or file they write).

Windows has no advisory locks: there the folders go unguarded. Object storage has none either (a prepare to an
`s3://` URL is not guarded).
"""

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from diffusion.errors import InvalidValue, naming_a_full_disk, naming_a_refusing_folder

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

# The descriptors of the locks this process holds: closed in a child it forks (litdata's writers, DataLoader
# workers), so that the lock goes with its holder alone. A forked child shares the open file, and a holder killed
# by SIGKILL would leave it locked until its children ended too (executed programs do not get it: O_CLOEXEC).
_held: set[int] = set()


def _not_in_a_child() -> None:
    for descriptor in _held:
        with contextlib.suppress(OSError):
            os.close(descriptor)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_not_in_a_child)


@contextlib.contextmanager
def holding_lock(path: Path, holder: str, refused: Callable[[list[str]], Exception]) -> Iterator[None]:
    """Hold the lock on `path` (created where missing; its folder must exist) while the block runs, with `holder`
    written into it; or raise `refused(the words of the holder's line)` at once where another process holds it.

    The lock file is removed on the way out while still locked; a process that opened it before then finds, once it
    holds the lock, that the file under the name is another (or none) and tries again on the one there now."""
    if fcntl is None:
        yield
        return
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the processes it starts
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            words = os.read(descriptor, 4096).decode(errors="replace").split()
            os.close(descriptor)
            raise refused(words) from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
                break
        os.close(descriptor)  # the file was removed by the process that held it: lock the one there now
    _held.add(descriptor)
    try:
        os.ftruncate(descriptor, 0)
        os.write(descriptor, holder.encode())
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        _held.discard(descriptor)
        os.close(descriptor)


@contextlib.contextmanager
def writing_alone(out: str, command: str, lock: Path, flag: str = "out") -> Iterator[None]:
    """Hold `lock` (`holding_lock`: gone with its process, even one killed by SIGKILL) while the block checks what
    `command` replaces at `out` (its option `flag`, --out by default) and writes it there, or refuse at once where
    another one holds it, naming it: "--out OUT is being written by another COMMAND (pid N on host H, started
    ...)". Two at once into one --out both said they wrote it, and one's output was the other's. The folders made
    for `lock` (its folder and those above it that were missing) go again on the way out where they are empty: a
    refused or failed command's."""
    folder = lock.parent.absolute()
    existed = next(p for p in [folder, *folder.parents] if p.exists())
    with naming_a_full_disk(lock):  # a folder that refuses it: CannotWrite
        folder.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S")

    def refused(holder: list[str]) -> InvalidValue:
        pid, host, *when = holder + ["?", "?"]
        return InvalidValue(
            f"{{command:--{flag}}} {out} is being written by another {command} (pid {pid} on host {host}, started "
            f"{' '.join(when[:2])})",
            f"wait for it to finish, or pass another {{command:--{flag}}}",
        )

    # A folder that refuses the lock file (no permission, an immutable folder): one line naming the option, by its
    # flag where it has one (FlaggedFolder), not a PermissionError said as a bug; the block's own errors pass as
    # they are.
    named = f"the lock file {lock.name} of {{command:--{flag}}} {out}"
    try:
        with contextlib.ExitStack() as held:
            with naming_a_refusing_folder(folder, named):
                held.enter_context(
                    holding_lock(lock, f"{os.getpid()} {socket.gethostname()} {started}\n", refused)
                )
            yield
    finally:
        for made in [folder, *folder.parents]:
            if made == existed:
                break
            try:
                made.rmdir()  # only an empty one
            except OSError:
                break
