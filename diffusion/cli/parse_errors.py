"""A command line the parser refused, said from the parser's own structure: which flag, its value, what fits.

jsonargparse refuses a bad command line with a nested report written for its developers (union subtypes,
`Parser key "..."`, the adapters it tried). The commands do not read that report. `parse_command_line` runs the
parse; when it fails, `what_is_wrong` looks for the cause itself: each flag of the command line (and each
`--config FILE`) is checked alone against the type the parser declares for it (its action's type hint, or, for an
argument of a class chosen by a group flag such as `--data.batch_size`, the chosen class's signature), and the
first that does not fit is said from that type: its choices (Literal), its bounds (jsonargparse's restricted
numbers), its kind (int, float, bool, timedelta), or the class path that imports nothing. Only when no single flag
explains the refusal (an unknown flag, a key of a config file no class takes) is the library's own message shown,
on one line.
"""

import datetime
import functools
import operator
import sys
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml
from jsonargparse import ActionYesNo, ArgumentError, ArgumentParser, Namespace

from diffusion.cli.legacy import class_at
from diffusion.errors import UserError

_FLAG_HELP = "see --help for the options (--print_config for a full config)"
_COMPARISONS = {operator.gt: ">", operator.ge: ">=", operator.lt: "<", operator.le: "<=", operator.ne: "!="}
# Kinds whose written form a user cannot guess.
_FORMAT_OF = {"timedelta": "h:m:s, e.g. 0:30:00", "list": "a list in brackets, e.g. [1, 2]"}


class BadCommandLine(UserError):
    """A command line the parser refused, said as `--flag value: what is wrong — fix`."""


def parse_command_line(parser: ArgumentParser, argv: Sequence[str] | None) -> Namespace:
    """`parser.parse_args(argv)`; a refusal raises `BadCommandLine` naming the flag (see the module's docstring)."""
    try:
        return parser.parse_args(argv)
    except ArgumentError as error:
        written = sys.argv[1:] if argv is None else list(argv)
        raise BadCommandLine(*what_is_wrong(parser, written, error)) from error


def what_is_wrong(parser: ArgumentParser, argv: list[str], error: BaseException) -> tuple[str, str]:
    """(what is wrong, how to fix it) for a command line `parser` refused with `error`."""
    config_files = ("config", *_config_groups(parser))
    for key, values in flags_written(argv):
        if key in config_files:
            found = _bad_config_file(key, values[-1] if values else "", is_group=key != "config")
        else:
            found = _bad_value(parser, argv, key, values)
        if found:
            return found
    written = {f"--{key}" for key, _ in flags_written(argv)}
    for action in parser._actions:
        if (
            action.required
            and written.isdisjoint(action.option_strings)
            and _default(parser, action.dest) is None
        ):
            flag = action.option_strings[-1]
            return f"{flag} is required", f"pass {flag} VALUE (see --help)"
    return " ".join(str(error).split()), _FLAG_HELP


def flags_written(argv: list[str]) -> Iterator[tuple[str, list[str]]]:
    """(key, its values) for each `--key value ...` or `--key=value` of a command line, in order."""
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        if not arg.startswith("--"):
            continue
        key, equals, value = arg[2:].partition("=")
        if equals:
            yield key.removesuffix("+"), [value]
            continue
        values = []
        while index < len(argv) and not argv[index].startswith("--"):
            values.append(argv[index])
            index += 1
        yield key.removesuffix("+"), values


def _config_groups(parser: ArgumentParser) -> list[str]:
    """The group flags that take a YAML file of their options (`--model FILE`, `--ema FILE`, ...)."""
    return [
        action.dest for action in parser._actions
        if type(action).__name__ == "_ActionConfigLoad" and action.dest != "config"
    ]  # fmt: skip


def _bad_config_file(key: str, value: str, is_group: bool) -> tuple[str, str] | None:
    path = Path(value)
    if not path.is_file():
        if is_group and isinstance(_yaml_or_none(value), dict):
            return None  # options written inline: --model '{lr: 1e-3}'
        shown = f"--{key} {value}" if is_group else f"--{key}: {value}"
        return f"{shown}: no such config file", "pass a YAML file of these options (see --print_config)"
    try:
        yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        return f"Problems parsing config {value}: {problem}{at}", f"fix the YAML syntax of the --{key} file"
    return None


def _yaml_or_none(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def _bad_value(
    parser: ArgumentParser, argv: list[str], key: str, values: list[str]
) -> tuple[str, str] | None:
    action = parser._option_string_actions.get(f"--{key}")
    if isinstance(action, ActionYesNo):
        hint: Any = bool
    elif action is not None:
        hint = getattr(action, "_typehint", None)  # jsonargparse's ActionTypeHint: the declared type
    else:
        hint = _class_argument_hint(parser, argv, key)
    if hint is None or not values or _fits(hint, values, getattr(action, "nargs", None)):
        return None
    return _said_of(f"--{key} {' '.join(values)}", hint, values)


def _class_argument_hint(parser: ArgumentParser, argv: list[str], key: str) -> Any:
    """The type of an argument of the class a group flag chose: `--data.batch_size` (or
    `--data.init_args.batch_size`) from the signature of the class `--data` names (`_chosen_class_path`)."""
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        group, rest = ".".join(parts[:cut]), [part for part in parts[cut:] if part != "init_args"]
        if f"--{group}" not in parser._option_string_actions:
            continue
        class_path = _chosen_class_path(parser, argv, group)
        cls = _imported(class_path) if class_path and len(rest) == 1 else None
        if cls is None or isinstance(cls, str):
            return None
        try:
            return get_type_hints(cls.__init__).get(rest[0])
        except Exception:  # a forward reference the hints cannot resolve: no type to say it from
            return None
    return None


def _chosen_class_path(parser: ArgumentParser, argv: list[str], group: str) -> str | None:
    """The class path `group` was given last: by `--group X`, `--group.class_path X` or a `--config` file, else
    the parser's default."""
    chosen = None
    for key, values in flags_written(argv):
        if key == "config" and values and Path(values[-1]).is_file():
            config = _config_file(Path(values[-1]))
            for part in group.split("."):
                config = config.get(part) if isinstance(config, dict) else None
            chosen = config.get("class_path", chosen) if isinstance(config, dict) else chosen
        elif key in (group, f"{group}.class_path") and values:
            written = _yaml_or_none(values[-1])
            chosen = written.get("class_path", chosen) if isinstance(written, dict) else values[-1]
    if chosen is None:
        default = _default(parser, group)
        chosen = default.get("class_path") if isinstance(default, Namespace) else None
    return chosen


def _config_file(path: Path) -> Any:
    """A --config file's YAML, read once per version of the file: each argument of a chosen class looks its class
    up in it (10 ms of PyYAML a read, a dozen reads a report)."""
    stat = path.stat()
    return _config_file_version(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _config_file_version(path: str, mtime_ns: int, size: int) -> Any:
    return _yaml_or_none(Path(path).read_text())


def _default(parser: ArgumentParser, dest: str) -> Any:
    """The parser's default of one key (`get_defaults` builds every class's defaults to answer it)."""
    try:
        return parser.get_default(dest)
    except KeyError:  # no default (argparse's SUPPRESS)
        return None


def _imported(class_path: str) -> Any:
    """The class `class_path` names (a bare name: the package's public one), or why it imports none (a str)."""
    try:
        return class_at(class_path if "." in class_path else f"diffusion.{class_path}")
    except (ImportError, AttributeError, ValueError) as error:
        return str(error)


def _fits(hint: Any, values: list[str], nargs: Any) -> bool:
    """Whether `values` parse as `hint` alone: a parser with this one argument, as the command's declares it."""
    fits = _fits_text if _reads_only_the_text(hint) else _fits_text.__wrapped__
    return fits(hint, tuple(values), nargs)


def _reads_only_the_text(hint: Any) -> bool:
    """Whether checking a value of `hint` depends on nothing but the value (numbers, bools, strings, choices,
    durations and lists of them), not on files or importable classes: the answer may be kept."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return True
    if args:
        container = origin in (typing.Union, types.UnionType, list, tuple, dict, Sequence)
        return container and all(_reads_only_the_text(arg) for arg in args if arg is not Ellipsis)
    restricted = getattr(hint, "_restrictions", None) is not None  # jsonargparse's PositiveInt & co.
    return restricted or hint in (int, float, bool, str, type(None), datetime.timedelta)


@functools.lru_cache(maxsize=1024)
def _fits_text(hint: Any, values: tuple[str, ...], nargs: Any) -> bool:
    """`_fits`, kept for types `_reads_only_the_text`: a report checks each flag before the bad one with a
    parser of its own (5 ms each)."""
    probe = ArgumentParser(exit_on_error=False)
    probe.add_argument("--value", type=hint, nargs=nargs)
    try:
        probe.parse_args(["--value", *values])
    except ArgumentError:
        return False
    return True


def _said_of(shown: str, hint: Any, values: list[str]) -> tuple[str, str]:
    """What does not fit in `values` of type `hint`, said from the type: choices, bounds, class path or kind."""
    kinds = [kind for kind in _alternatives(hint) if kind is not type(None)]
    if kinds and all(get_origin(kind) is list for kind in kinds):  # --metrics fid kid: say it of the items
        return _said_of(shown, functools.reduce(operator.or_, (get_args(kind)[0] for kind in kinds)), values)
    if kinds and all(get_origin(kind) is Literal for kind in kinds):
        by_text: dict[str, Any] = {}  # 64 and '64' (--precision): once, as first declared
        for choice in (choice for kind in kinds for choice in get_args(kind)):
            by_text.setdefault(str(choice), choice)
        return f"{shown} is not one of the choices", f"choose one of {', '.join(map(repr, by_text.values()))}"
    classes = [kind for kind in kinds if _is_class_choice(kind)]
    if classes and "." in values[-1]:
        reason = _imported(values[-1])
        if isinstance(reason, str):
            return (
                f"{shown}: no such class ({reason})",
                "pass the class path of a class that exists, as module.Class (see --help for the accepted classes)",
            )
    for kind in kinds:
        restrictions = getattr(kind, "_restrictions", None)  # jsonargparse.typing's restricted numbers
        if restrictions and _parses_as(_builtin_base(kind), values[-1]):
            bounds = " and ".join(
                f"{_COMPARISONS.get(compare, '?')} {limit}" for compare, limit in restrictions
            )
            return f"{shown} is out of range", f"pass a value {bounds}"
    names = list(dict.fromkeys(_kind_name(kind) for kind in kinds or [hint]))
    if names == ["bool"]:
        return f"{shown} is not a valid bool", "pass true or false"
    what = f"{shown} is not a valid {' or '.join(names)}"
    fix = "pass a value of that type" if len(names) == 1 else "pass a value of one of these types"
    formats = [_FORMAT_OF[name.split()[0]] for name in names if name.split()[0] in _FORMAT_OF]
    return what, f"{fix}: {'; '.join(formats)}" if formats else f"{fix} (see --help)"


def _kind_name(kind: Any) -> str:
    """int, float, bool, list (a list, tuple or Sequence), timedelta, ...: how a type is said."""
    base = _builtin_base(kind) if getattr(kind, "_restrictions", None) else (get_origin(kind) or kind)
    items = get_args(kind)
    if base is tuple and items and Ellipsis not in items:  # tuple[float, float]: so many items
        return f"list of {len(items)} {' and '.join(dict.fromkeys(_kind_name(item) for item in items))}s"
    return "list" if base in (list, tuple, Sequence) else getattr(base, "__name__", str(base))


def _alternatives(hint: Any) -> list[Any]:
    """The members of a union (nested unions flattened); a type that is no union, alone."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        return [member for arg in get_args(hint) for member in _alternatives(arg)]
    return [hint]


def _is_class_choice(kind: Any) -> bool:
    """A base class whose subclasses the flag chooses by class path (a Logger, a LightningDataModule, ...)."""
    return isinstance(kind, type) and kind.__module__ not in (
        "builtins",
        "datetime",
        "pathlib",
        "jsonargparse.typing",
    )


def _builtin_base(kind: type) -> type:
    """int for jsonargparse's PositiveInt, ...: the built-in type a restricted number extends."""
    return next(base for base in kind.__mro__ if base.__module__ == "builtins")


def _parses_as(base: type, text: str) -> bool:
    try:
        base(text)
    except (TypeError, ValueError):
        return False
    return True
