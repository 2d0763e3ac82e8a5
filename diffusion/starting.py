"""A command stopped while it is still starting: one line, not a traceback from inside an import.

`python -m diffusion.X` and `python train.py` spend their first seconds importing torch, Lightning and the rest,
before `main` is running and `diffusion.cli.reporting.reporting_user_errors` takes SIGINT and SIGTERM over. A
signal in that window would print a KeyboardInterrupt traceback from somewhere inside an import (SIGINT) or end
the process without a word (SIGTERM). Each entry point imports its command inside `stopping_while_starting`,
which ends the process then with `error: stopped by SIGINT while starting — nothing was written; ...` and exit
status 130 (143 for SIGTERM), as a command stopped later ends. It imports nothing heavy itself.
"""

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stopped_while_starting(signum: int, frame: object) -> None:
    """The handler: the line, then exit at once (nothing was written yet; a half-done import is not run on)."""
    name = signal.Signals(signum).name
    sys.stderr.write(
        f"error: stopped by {name} while starting — nothing was written; run the command again\n"
    )
    sys.stderr.flush()
    os._exit(128 + signum)


@contextmanager
def stopping_while_starting(module_name: str) -> Iterator[None]:
    """SIGINT and SIGTERM end the process with one line while the block imports the command, when `module_name` is
    "__main__" (the entry point runs as the program: imported by a user's code or a notebook, it changes nothing),
    in the main thread, and for a signal the process does not ignore (a background job's SIGINT stays ignored).
    The handlers found are back after the block: the command's own take over from there."""
    if module_name != "__main__" or threading.current_thread() is not threading.main_thread():
        yield
        return
    # None: a handler not set from Python, which could not be put back.
    found = {signum: signal.getsignal(signum) for signum in STOPPING_SIGNALS}
    taken = {signum: handler for signum, handler in found.items() if handler not in (signal.SIG_IGN, None)}
    for signum in taken:
        signal.signal(signum, stopped_while_starting)
    try:
        yield
    finally:
        for signum, handler in taken.items():
            signal.signal(signum, handler)
