"""User errors as one line: `error: <what is wrong> — <how to fix it>` on stderr, exit status 2.

Only the project's own user-error types are the user's (`diffusion.errors.UserError` and its subclasses, and a
command line the parser refuses): every command's `main` runs inside `reporting_user_errors`, which turns one into
that line. A library's error that the user's input caused (a file that cannot be read, a shape that does not fit)
is caught where that input is read and raised again as a UserError naming it. Anything else is a bug: one line
says so, then its traceback, exit status 1. `DIFFUSION_DEBUG=1` or `--debug` lets user errors through with their
traceback too.

Interrupts end every command the same way: SIGINT (Ctrl+C) or SIGTERM raise `diffusion.errors.Interrupted` in
the command's process, which ends it with `error: stopped by SIGINT — ...` and exit status 130 (143 for SIGTERM),
no traceback. Training takes both signals over while it runs (`diffusion.training.callbacks.preemption`): it saves
the step it reached, then exits with the same status; Ctrl+C again before that save stops at once, its line
saying which steps are lost (`StoppedUnsaved`).
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

from diffusion.cli.command_line import remember_shorthands, remember_written, said_as_written
from diffusion.cli.flag_names import flag_text
from diffusion.cli.flags import debug_requested
from diffusion.errors import CallerError, Interrupted, UserError, said
from diffusion.training.callbacks.preemption import StoppedUnsaved

USER_ERROR_EXIT_STATUS = 2  # argparse's status for a bad command line; here for every user error
BUG = (
    "error: this is a bug in diffusion, not in what you gave — please report it with the command you ran and "
    "the traceback below"
)

# What a user can cause and fix, by type: the project's user errors (raised where the input is read, naming it),
# a command line the parser refuses, a batch that does not fit the GPU. Anything else is a bug.
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, ArgumentError, torch.cuda.OutOfMemoryError)


def is_user_error(error: BaseException) -> bool:
    return isinstance(error, USER_ERRORS) and not isinstance(error, CallerError)


def is_bug(error: BaseException) -> bool:
    """An exception of the code's own making (not a signal, an exit, or a caller's misuse in Python)."""
    return isinstance(error, Exception) and not isinstance(error, CallerError)


@contextmanager
def reporting_user_errors(argv: Sequence[str] | None = None) -> Iterator[None]:
    """Around a command's main: a user error (see USER_ERRORS) becomes one line and exit 2; any other exception
    a line saying it is a bug, then its traceback (exit 1); SIGINT and SIGTERM one line and exit 130 / 143."""
    remember_written(())  # a command run before in this process wrote its own
    remember_shorthands(())
    try:
        with stopping_on_signals():
            yield
    except (Interrupted, KeyboardInterrupt) as error:
        signum = error.signum if isinstance(error, Interrupted) else signal.SIGINT
        line = (
            f"stopped by {signal.Signals(signum).name} — nothing finished was written "
            "(files it writes appear only once complete); run the command again"
        )
        if isinstance(error, StoppedUnsaved):  # training: what the stop lost, and how to go on
            line = f"{said(error.problem)} — {said(error.fix)}"
        print(f"error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum) from None
    except BaseException as error:
        if is_user_error(unwrapped(error)):
            if debug_requested(argv):
                raise
            report(unwrapped(error))
        if is_bug(error):
            print(BUG, file=sys.stderr, flush=True)  # then Python prints the traceback, exit status 1
        raise
    finally:
        remember_written(())
        remember_shorthands(())


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
    while inner is not None and _raised_in(inner, "jsonargparse") and not is_user_error(inner):
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
    """The error's message on one line: a UserError's options said as the user wrote them, a flag
    (`diffusion.cli.flag_names`) or a config file's key (`said_as_written`); the parser's refusal with where to look; anything else as it is."""
    if isinstance(error, UserError):  # a flag a config file set said as that file's key
        problem = said_as_written(said(error.problem, flag_text, error.owner))
        text = f"{problem} — {said(error.fix, flag_text, error.owner)}"
    elif isinstance(
        error, torch.cuda.OutOfMemoryError
    ):  # torch's report runs to a paragraph: said by its type
        return (
            "the GPU ran out of memory — use a smaller batch (the command's batch size), or free the GPU of other "
            "processes"
        )
    else:
        text = str(error).strip() or type(error).__name__
    line = " ".join(line.strip() for line in text.splitlines() if line.strip())
    if isinstance(error, ArgumentError):  # a refusal parse_command_line did not explain: the parser's words
        return f"{line} — see --help for the options (--print_config for a full config)"
    return line


def not_a_command(fix: str) -> NoReturn:
    """`python -m diffusion.cli.<name>` of a part of the commands whose name reads like one (to_diffusers,
    evaluate_nll, evaluate_quality, train): one line naming the command to run (`fix`) and exit status 2, rather
    than importing, ignoring every argument and exiting 0."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    name = spec.name if spec is not None else "this module"
    print(f"error: {name} is a library module, not a command — {fix}", file=sys.stderr, flush=True)
    raise SystemExit(2)
