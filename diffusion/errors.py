"""User errors as one line: `error: <what is wrong> — <how to fix it>` on stderr, exit status 2.

Library code raises (`ValueError`, `FileNotFoundError`, ...); the three commands (`train.py`,
`python -m diffusion.sample`, `python -m diffusion.evaluate`) run inside `reporting_user_errors`, which turns a
user error into that one line. Bugs keep their traceback (exit status 1). `DIFFUSION_DEBUG=1` or `--debug`
lets user errors through with their traceback too.

Also here, what every command shares: its parser (`command_parser`: `--config`, `--print_config` and
`--debug`, as for `train.py`), and the early check that a folder can be written (a checkpoint's is
`diffusion.checkpoints.read_checkpoint`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, get_args

import torch
from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentError, ArgumentParser, DefaultHelpFormatter
from lightning.fabric.utilities.exceptions import MisconfigurationException

DEBUG_VARIABLE = "DIFFUSION_DEBUG"
USER_ERROR_EXIT_STATUS = 2  # argparse's status for a bad command line; here for every user error


class UserError(Exception):
    """A mistake in what the user gave, and its fix: reported as `<problem> — <fix>`."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem} — {fix}")


class CallerError(ValueError):
    """A mistake of Python code calling a command (not of a user typing one): always keeps its traceback."""


# What a user can cause and fix: bad values, missing or unreadable files, a Trainer setting Lightning rejects,
# a batch that does not fit the GPU. Anything else is a bug in this project or below it.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, OSError, EOFError, ArgumentError, UserError, MisconfigurationException,
    torch.cuda.OutOfMemoryError,
)  # fmt: skip


def check_choice(name: str, value: Any, allowed: object) -> None:
    """Raise ValueError unless `value` is one of the choices of the Literal type `allowed`."""
    choices = get_args(allowed)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {list(choices)}")


class _HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help (types, defaults) with the description's line breaks kept."""


def command_parser(prog: str, description: str) -> ArgumentParser:
    """A parser for `python -m <prog>` with train.py's conventions: `--config FILE`, `--print_config`, `--debug`.

    Parse errors raise (exit_on_error=False) so that `reporting_user_errors` prints them as one line.
    """
    parser = ArgumentParser(
        prog=prog, description=description, exit_on_error=False, formatter_class=_HelpFormatter
    )
    parser.add_argument(
        "--config", action=ActionConfigFile, help="options from a YAML file (see --print_config)"
    )
    add_debug_flag(parser)
    return parser


def add_debug_flag(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--debug", action=ActionYesNo, nargs="?", default=False,
        help=f"show the traceback of a user error rather than one line (also: {DEBUG_VARIABLE}=1)",
    )  # fmt: skip


def debug_requested(argv: Sequence[str] | None = None) -> bool:
    """DIFFUSION_DEBUG set (not 0/false/no), or --debug on the command line (argv, or sys.argv)."""
    if os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no"):
        return True
    args = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(args):
        if arg in ("--debug", "--debug=true", "--debug=yes"):
            following = args[i + 1] if i + 1 < len(args) else ""
            return following.lower() not in ("false", "no")
    return False


def is_user_error(error: BaseException, also: tuple[type[BaseException], ...] = ()) -> bool:
    if isinstance(error, CallerError):
        return False
    # A state_dict that does not fit the network: weights of another run, not a bug.
    return isinstance(error, USER_ERRORS + also) or "Error(s) in loading state_dict" in str(error)


@contextmanager
def reporting_user_errors(
    argv: Sequence[str] | None = None, also: tuple[type[BaseException], ...] = ()
) -> Iterator[None]:
    """Around a command's main: a user error (see USER_ERRORS, plus `also`) becomes one line and exit 2."""
    try:
        yield
    except BaseException as error:
        if not is_user_error(error, also) or debug_requested(argv):
            raise
        report(error)


def report(error: BaseException) -> NoReturn:
    """Print `error: <one line>` on stderr and exit with status 2."""
    print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
    raise SystemExit(USER_ERROR_EXIT_STATUS)


def one_line(error: BaseException) -> str:
    """The error's message on one line: parser reports, DataLoader worker tracebacks and state_dict key dumps
    reduced to what is wrong."""
    text = str(error).strip() or type(error).__name__
    if isinstance(error, ArgumentError) or "Parser key" in text or "Union subtypes" in text:
        text = _parser_message(text)
        if isinstance(error, ArgumentError) and " — " not in text:
            text += " — see --help for the options (--print_config for a full config)"
    if "Original Traceback" in text:  # re-raised from a DataLoader worker: the worker's own message
        text = re.sub(r"^[\w.]+: ", "", text.strip().splitlines()[-1])
    if "Error(s) in loading state_dict" in text:
        text = _state_dict_summary(text)
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
    flag = ".".join(re.findall(r'Parser key "([^"]+)"', text))
    given = re.search(r"(?:Given|Got) value: (.*)|Not of type \w+: (\S+) does not conform", text)
    shown = f"--{flag}" + (f" {(given.group(1) or given.group(2)).strip()}" if given else "")
    noise = re.compile(
        r"^(Does not validate against|Subtypes:|Errors:|Given value|Problem with given class_path|"
        r"- Expected a <class 'NoneType'>)"
    )
    lines = [re.sub(r'Parser key "[^"]+":\s*', "", line).strip() for line in text.splitlines()]
    detail = "; ".join(line.lstrip("- ") for line in lines if line and not noise.match(line))
    if not flag:
        return detail or text
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
    expected = re.search(r"Expected a <class '(\w+)'>", detail)
    if expected:
        return f"{shown} is not a valid {expected.group(1)} — pass a value of that type (see --help)"
    return f"--{flag}: {detail} — see --help"


def _state_dict_summary(text: str) -> str:
    """torch's 'Error(s) in loading state_dict' dump -> counts and a few example keys."""
    head, _, dump = text.partition("Error(s) in loading state_dict for ")
    network = dump.split(":", 1)[0]
    parts = []
    for label, pattern in [("missing", "Missing key"), ("unexpected", "Unexpected key")]:
        line = next((ln for ln in dump.splitlines() if pattern in ln), "")
        keys = re.findall(r'"([^"]+)"', line)
        if keys:
            parts.append(f"{len(keys)} {label} keys (e.g. {', '.join(keys[:2])})")
    mismatches = re.findall(r"size mismatch for ([^:]+):", dump)
    if mismatches:
        parts.append(f"{len(mismatches)} of another shape (e.g. {', '.join(mismatches[:2])})")
    summary = ", ".join(parts)
    head = head.strip()
    return f"{head} ({summary})" if head else f"the weights do not fit {network} ({summary})"


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


def numpy_file_kind(path: Path) -> str:
    """ "npy", "npz" or "other", from the file's first bytes: np.load would try to unpickle an unknown file and
    report that, rather than what the file is."""
    with path.open("rb") as file:
        magic = file.read(6)
    if magic == b"\x93NUMPY":
        return "npy"
    return "npz" if magic[:2] == b"PK" else "other"  # np.savez writes a zip archive
