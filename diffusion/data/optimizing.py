"""`litdata.optimize` run for `diffusion.data.preparing` in a child process that leads a process group of its own,
killed whole once it returns, fails or is interrupted, or once the prepare that started it is gone; a user's error
met in one of litdata's workers raised as itself, a full disk as one line.
"""

import contextlib
import errno
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from diffusion.errors import DiskFull

_DISK_FULL_EXIT = 28  # the optimizing process's exit status for a full disk (ENOSPC's number)
PREPARE_ON_ANOTHER_DISK = "free space there, or pass another {command:--out}; what this prepare wrote is removed, nothing else touched"


def in_a_process_group_of_its_own(optimize: Any, kwargs: dict[str, Any], errors: str) -> None:
    """litdata.optimize(**kwargs) in a child process leading a process group of its own, which is killed whole once
    it returns, fails or is interrupted: when one of litdata's workers fails it stops the others with SIGTERM, and
    the processes those had started (uploaders, removers) would outlive the prepare. A user's error met in a worker
    (`SampleWriter`) is raised here as itself; any other failure is a bug, with litdata's report."""
    process = multiprocessing.get_context("fork").Process(target=_optimizing, args=(optimize, kwargs, errors))
    process.start()
    try:
        process.join()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # type: ignore[arg-type]  # started: it has a pid
        process.join()
    met = sorted(Path(errors).glob("*.pickle"))
    if met:
        raise pickle.loads(met[0].read_bytes())
    if process.exitcode == _DISK_FULL_EXIT:
        raise DiskFull(Path(kwargs["output_dir"]), "the prepared set's chunks", PREPARE_ON_ANOTHER_DISK)
    if process.exitcode != 0:
        raise RuntimeError(
            f"litdata.optimize failed (its process's exit status {process.exitcode}; its report above)"
        )


def _optimizing(optimize: Any, kwargs: dict[str, Any], errors: str) -> None:
    os.setpgrp()
    threading.Thread(target=_ending_with_parent, args=(os.getppid(),), daemon=True).start()
    # Forked from a process whose OpenMP threads ran (reading and resizing the source): their pool does not exist
    # here, and the first parallel region would wait on it for ever. One thread, as DataLoader workers do.
    torch.set_num_threads(1)
    try:
        optimize(**kwargs)
    except Exception as error:
        full = _says_the_disk_is_full(error)  # said by the parent: a full disk may not take even a report
        if not full and not any(
            Path(errors).glob("*.pickle")
        ):  # a bug: its report; a user's error: the parent's
            traceback.print_exc()
        sys.stderr.flush()
        # Not sys.exit: a process that exits so joins its children first, and a litdata worker left waiting on its
        # queue (one worker on a full disk) would hold the prepare for ever; the parent kills the group.
        os._exit(_DISK_FULL_EXIT if full else 1)


def _says_the_disk_is_full(error: BaseException) -> bool:
    """A full disk met by one of litdata's workers: litdata passes on a worker's error as the text of its
    traceback, in a RuntimeError of its own, so the OSError's errno is read from that text."""
    full = [f"[Errno {code}] {os.strerror(code)}" for code in (errno.ENOSPC, errno.EDQUOT)]
    return any(text in str(error) for text in full) or (
        isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
    )


def _ending_with_parent(parent: int) -> None:
    """The whole group killed once the prepare that started it is gone: a prepare killed by SIGKILL (or the OOM
    killer) cannot kill the group itself, and its writers would go on writing chunks nobody will index."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)
