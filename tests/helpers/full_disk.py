"""A disk that fills up, faked where the OS would refuse a write: files whose `write` puts bytes on disk until
`room` is used up and then raises OSError(ENOSPC), as a real full disk does (a short write, then the error).

`FullDiskAt` makes the checkpoint writer's disk full at a step of a `train.py` run (by class path:
`helpers.full_disk.FullDiskAt`); tests/training/test_full_disk.py also hands `full_open` to the writers directly.
`on_a_small_disk` runs a command with a real, small disk: a tmpfs in a mount namespace of its own.
`immutable` makes a file or folder refuse every write (`chattr +i`) for the length of a `with` block.
"""

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest

from diffusion.training import atomic_writes


def no_space(path: Any = None) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([str(path)] if path is not None else []))


class FillingFile:
    """A real file that takes `room` bytes in all, then refuses the rest of a write with ENOSPC."""

    def __init__(self, file: Any, room: int) -> None:
        self.file, self.room = file, room

    def write(self, data: Any) -> int:
        data = memoryview(data).cast("B")
        if len(data) > self.room:
            self.file.write(data[: self.room])
            self.room = 0
            raise no_space()
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)

    def __enter__(self) -> "FillingFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.file.close()


def full_open(room: int):
    """`open` for a disk with `room` bytes left: opening fails when there is none (no room for the file's entry)."""

    def opening(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if room <= 0:
            raise no_space(path)
        return FillingFile(open(path, mode, *args, **kwargs), room)

    return opening


class FullDiskAt(L.Callback):
    """From optimizer step `step` on, rank 0's checkpoint writer finds the disk full after `room` bytes of a file;
    first it copies `<watch>` (last.ckpt as the step before saved it) to `<reference>`, for the test to compare."""

    def __init__(self, step: int, watch: str, reference: str, room: int = 1000) -> None:
        self.step, self.watch, self.reference, self.room = step, watch, reference, room

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, index: int
    ) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero and not hasattr(atomic_writes, "open"):
            shutil.copyfile(self.watch, self.reference)
            atomic_writes.open = full_open(self.room)  # the module's `open`, ahead of the builtin

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if hasattr(atomic_writes, "open"):
            del atomic_writes.open
        Path(self.reference).touch()  # exists even when the step was never reached (the test then says so)


class FullDiskOutsideTheProject(L.Callback):
    """A write of Lightning's or a logger's (hparams.yaml, an event file) refused by a full disk as training starts:
    an OSError(ENOSPC) naming `path`, raised where the project does not write itself."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        raise no_space(self.path)


@contextlib.contextmanager
def immutable(folder: Path) -> Iterator[None]:
    """`folder` refuses every write, as `chattr +i` makes it (even for root, as tests here run): skipped where the
    file system or the process cannot set the flag."""
    made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i refused here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def on_a_small_disk(
    disk: Path, size: str, command: str, cwd: Path, timeout: int = 120
) -> subprocess.CompletedProcess:
    """`command` (a shell line; `{python}` is this interpreter) run where `disk`, a new folder, is a tmpfs of `size`
    (`64k`) in a mount namespace of its own (`unshare -rm`, as root of it): skipped where there is no `unshare` or
    user namespaces are off. The project is on the command's PYTHONPATH."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces here: {probe.stderr.decode().strip()}")
    disk.mkdir()
    line = f"mount -t tmpfs -o size={size} tmpfs {disk} && {command.format(python=sys.executable)}"
    process = subprocess.Popen(
        ["unshare", "-rm", "sh", "-c", line], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except (
        subprocess.TimeoutExpired
    ):  # a command that hangs: all its processes go (subprocess.run's kill left
        os.killpg(process.pid, signal.SIGKILL)  # the command's own children running after the test)
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
