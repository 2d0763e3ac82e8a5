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
import re
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
        report(error)


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


def report(error: BaseException) -> NoReturn:
    """Print `error: <one line>` on stderr and exit with status 2."""
    print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
    raise SystemExit(USER_ERROR_EXIT_STATUS)


def one_line(error: BaseException) -> str:
    """The error's message on one line: parser reports and DataLoader worker tracebacks reduced to what is
    wrong."""
    text = str(error).strip() or type(error).__name__
    if isinstance(error, ArgumentError) or "Parser key" in text or "Union subtypes" in text:
        text = _parser_message(text)
        if isinstance(error, ArgumentError) and " — " not in text:
            text += " — see --help for the options (--print_config for a full config)"
    if "Original Traceback" in text:  # re-raised from a DataLoader worker: the worker's own message
        text = re.sub(r"^[\w.]+: ", "", text.strip().splitlines()[-1])
    line = " ".join(line.strip() for line in text.splitlines() if line.strip())
    if " — " not in line and "; " in line:
        line = line.replace("; ", " — ", 1)  # the library's messages put the fix after "; "
    return line


def _parser_message(text: str) -> str:
    """jsonargparse's nested multi-line report -> `--flag value: what is wrong — fix`."""
    required = re.search(r'Key "([^"]+)" is required|arguments are required: (\S+)', text)
    if required:
        name = required.group(1) or required.group(2)
        return f"--{name} is required — pass --{name} VALUE (see --help)"
    if text.startswith("Problems parsing config"):
        return f"{' '.join(text.split())} — fix the YAML syntax of the --config file"
    boolean = re.search(r"argument (--\w+)/--no_\w+: invalid _boolean_type value: '([^']*)'", text)
    if boolean:
        return f"{boolean[1]} {boolean[2]} is not a valid bool — pass true or false"
    config = re.search(r"Unable to load config '([^']*?)\s*(?:Unable|')", text)
    if config:  # --model FILE, --ema FILE, ...: a group's options from a YAML file
        group = re.search(r'Parser key "([^"]+)"', text)
        shown = f"--{group[1]} " if group else ""
        return f"{shown}{config[1]}: no such config file — pass a YAML file of these options (see --print_config)"
    flag = ".".join(re.findall(r'Parser key "([^"]+)"', text))
    literal = re.search(r"Not of type (\w+): invalid literal for \w+\(\) with base 10: '([^']*)'", text)
    if flag and literal:
        return f"--{flag} {literal[2]} is not a valid {literal[1]} — pass a value of that type (see --help)"
    interval = re.search(r'Not of type timedelta: .*? but got "([^"]*)"', text)
    if flag and interval:  # --checkpoint.train_time_interval
        return f"--{flag} {interval[1]} is not a valid timedelta — pass a value of that type: h:m:s, e.g. 0:30:00"
    given = re.search(r"(?:Given|Got) value: (.*)|Not of type \w+: (\S+) does not conform", text)
    shown = f"--{flag}" + (f" {(given.group(1) or given.group(2)).strip()}" if given else "")
    noise = re.compile(
        r"^(Does not validate against|Subtypes:|Errors:|Given value|Problem with given class_path|"
        r"- Expected a <class 'NoneType'>)"
    )
    lines = [re.sub(r'Parser key "[^"]+":\s*', "", line).strip() for line in text.splitlines()]
    # A list item's "- ", not a flag's "--" (lstrip("- ") made "--data.path" "data.path").
    detail = "; ".join(re.sub(r"^-\s+", "", line) for line in lines if line and not noise.match(line))
    if not flag:
        return detail or text
    # A class path that imports nothing: say so, whatever else the union of types tried (bool, a list, ...).
    missing = re.search(r"Problem with given class_path '([^']+)':\s*\n\s*([^\n]+)", text)
    if missing and re.search(
        r"No module named|has no attribute|not found|cannot import|does not exist", missing[2]
    ):
        return (
            f"--{flag} {missing[1]}: no such class ({missing[2].strip()}) — pass the class path of a class that "
            "exists, as module.Class (see --help for the accepted classes)"
        )
    restriction = re.search(r"restriction (.+)", detail)
    if restriction:
        # jsonargparse's 'v>=0 and v<=1' -> '>= 0 and <= 1'
        bound = re.sub(r"v\s*(>=|<=|>|<)\s*", r"\1 ", restriction.group(1))
        return f"{shown} is out of range — pass a value {bound}"
    # A union of Literals (--precision: ints, then strings) lists each: their values, each once.
    literals = re.findall(r"Expected a typing\.Literal\[([^\]]*)\]", detail)
    if literals:
        choices = dict.fromkeys(c.strip() for group in literals for c in group.split(","))
        unique = {choice.strip("'"): choice for choice in reversed(choices)}  # '64' after 64: keep 64
        listed = [choice for choice in choices if unique[choice.strip("'")] == choice]
        return f"{shown} is not one of the choices — choose one of {', '.join(listed)}"
    expected = re.search(r"Expected a <class '(?:[\w.]+\.)?(\w+)'>", detail)  # int, collections.abc.Sequence
    if expected:
        kind = {"Sequence": "list"}.get(expected[1], expected[1])
        return f"{shown} is not a valid {kind} — pass a value of that type (see --help)"
    return f"--{flag}: {detail} — see --help"
