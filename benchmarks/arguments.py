"""The benchmark scripts' own flags, read as the commands read theirs: a bad value ends in one line (argparse's
`parser.error`: its usage, then `error: <flag> <value>: <what is wrong> — <fix>`) and exit status 2, before any
time is spent, never in argparse's internals (`invalid <lambda> value`) or a traceback.

- `list_of`: a list flag takes `10,20`, `10, 20` and `10 20` alike (a shell splits `10, 20` into two words), each
  item checked.
- `existing`: a path flag names something that exists.
- `resolved`: a path a script resolves to what it reads (the newest checkpoint of a run, its snapshots, ...),
  the resolver's error said of the flag.
"""

import argparse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from diffusion.errors import UserError

T = TypeVar("T")


def list_of(
    kind: Callable[[str], Any],
    example: str,
    choices: Iterable[str] | None = None,
    what: str | None = None,
    empty: bool = False,
) -> type[argparse.Action]:
    """An argparse action (use with nargs="+", or "*" with `empty`) that gathers comma- or space-separated items
    of `kind` (a ValueError: not one; `what` names it in the refusal, default the kind's name). `example` shows a
    valid value in the refusal; `choices` (by the part before a ':', as in `ddim:50`) limits the items; `empty`
    lets the list be empty (`--flag ''`)."""
    allowed = None if choices is None else sorted(choices)
    what = what or getattr(kind, "__name__", "item")

    class ListOf(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            words = [values] if isinstance(values, str) else list(values)
            written = " ".join(words)
            items = [item.strip() for word in words for item in word.split(",") if item.strip()]
            if not items and not empty:
                parser.error(
                    f"{option_string} {written!r}: an empty list — pass e.g. {option_string} {example}"
                )
            parsed = []
            for item in items:
                if allowed is not None and item.split(":")[0] not in allowed:
                    parser.error(
                        f"{option_string} {written}: {item.split(':')[0]} is not one of the choices — choose "
                        f"among {', '.join(allowed)} (e.g. {option_string} {example})"
                    )
                try:
                    parsed.append(kind(item))
                except ValueError:
                    parser.error(
                        f"{option_string} {written}: {item} is not a valid {what} "
                        f"— pass a comma-separated list, e.g. {option_string} {example}"
                    )
            setattr(namespace, self.dest, parsed)

    return ListOf


def existing(parser: argparse.ArgumentParser, flag: str, path: Path | None, what: str) -> None:
    """Refuse `path` (given as `flag`) unless it exists; `what` says what the flag takes."""
    if path is not None and not path.exists():
        parser.error(f"{flag} {path}: no such file or folder — pass {what}")


def resolved(parser: argparse.ArgumentParser, flag: str, path: Path, resolve: Callable[[Path], T]) -> T:
    """`resolve(path)`, or its error (a missing or unreadable file, a folder without what is wanted) as the
    flag's one line."""
    try:
        return resolve(path)
    except (OSError, ValueError, IndexError, UserError) as error:
        parser.error(f"{flag} {path}: {' '.join(str(error).split()) or type(error).__name__}")
