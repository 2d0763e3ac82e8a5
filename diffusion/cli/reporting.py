"""User errors as one line: `error: <what is wrong> — <how to fix it>` on stderr, exit status 2.

Library code raises (`ValueError`, `FileNotFoundError`, `diffusion.errors.UserError`, ...); every command's `main`
runs inside `reporting_user_errors`, which turns a user error into that one line. Bugs keep their traceback
(exit status 1). `DIFFUSION_DEBUG=1` or `--debug` lets user errors through with their traceback too.

Interrupts end every command the same way: SIGINT (Ctrl+C) or SIGTERM raise `diffusion.errors.Interrupted` in
the command's process, which ends it with `error: stopped by SIGINT — ...` and exit status 130 (143 for SIGTERM),
no traceback. Training takes both signals over while it runs (`diffusion.training.callbacks.preemption`): it saves
the step it reached, then exits with the same status.
"""

import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

import torch
from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException

from diffusion.cli.flags import debug_requested
from diffusion.errors import CallerError, Interrupted, UserError

USER_ERROR_EXIT_STATUS = 2  # argparse's status for a bad command line; here for every user error


# What a user can cause and fix: bad values, missing or unreadable files, a Trainer setting Lightning rejects,
# a batch that does not fit the GPU. Anything else is a bug in this project or below it.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, OSError, EOFError, ArgumentError, UserError, MisconfigurationException,
    torch.cuda.OutOfMemoryError,
)  # fmt: skip


def is_user_error(error: BaseException, also: tuple[type[BaseException], ...] = ()) -> bool:
    return isinstance(error, USER_ERRORS + also) and not isinstance(error, CallerError)


@contextmanager
def reporting_user_errors(
    argv: Sequence[str] | None = None, also: tuple[type[BaseException], ...] = ()
) -> Iterator[None]:
    """Around a command's main: a user error (see USER_ERRORS, plus `also`) becomes one line and exit 2; SIGINT
    and SIGTERM one line and exit 130 / 143."""
    try:
        with stopping_on_signals():
            yield
    except (Interrupted, KeyboardInterrupt) as error:
        signum = error.signum if isinstance(error, Interrupted) else signal.SIGINT
        print(
            f"error: stopped by {signal.Signals(signum).name} — nothing finished was written "
            "(files it writes appear only once complete); run the command again",
            file=sys.stderr, flush=True,
        )  # fmt: skip
        raise SystemExit(128 + signum) from None
    except BaseException as error:
        if not is_user_error(error, also) or debug_requested(argv):
            raise
        report(unwrapped(error))


STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stopping_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` in this process while the block runs (then the handlers found are
    back). Processes forked inside it (DataLoader workers) behave as without it: their parent stops them."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    owner = os.getpid()

    def stop(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Interrupted(signum)

    found = {signum: signal.signal(signum, stop) for signum in STOPPING_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in found.items():
            signal.signal(signum, handler)


def unwrapped(error: BaseException) -> BaseException:
    """The error itself, or the one it wraps where jsonargparse re-raised a class's own error inside its report of
    the types it tried (a union such as `--data`'s): the first error of the chain raised outside jsonargparse,
    known by where it was raised, not by its words."""
    inner: BaseException | None = error
    while inner is not None and _raised_in(inner, "jsonargparse"):
        inner = inner.__cause__ or inner.__context__
    return inner if inner is not None and inner is not error and is_user_error(inner) else error


def _raised_in(error: BaseException, package: str) -> bool:
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and frame.tb_frame.f_globals.get("__name__", "").partition(".")[0] == package


def report(error: BaseException) -> NoReturn:
    """Print `error: <one line>` on stderr and exit with status 2."""
    print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
    raise SystemExit(USER_ERROR_EXIT_STATUS)


def one_line(error: BaseException) -> str:
    """The error's message on one line; a DataLoader worker's re-raised error reduced to the worker's own."""
    text = str(error).strip() or type(error).__name__
    if isinstance(error, ArgumentError):  # a refusal parse_command_line did not explain: the parser's words
        return f"{' '.join(text.split())} — see --help for the options (--print_config for a full config)"
    if "Original Traceback" in text:  # torch re-raises a worker's error with its traceback; its last line:
        text = text.strip().splitlines()[-1].partition(": ")[2]  # "ValueError: <the message>"
    line = " ".join(line.strip() for line in text.splitlines() if line.strip())
    if " — " not in line and "; " in line:
        line = line.replace("; ", " — ", 1)  # the library's messages put the fix after "; "
    return line
