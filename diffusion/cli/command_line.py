"""What a command line wrote, as the parser reads it: each flag, and each key of each config file, in order.

A `--config FILE` (or a group's `--model FILE`) is read into the keys it sets (`model.lr`, `data.class_path`,
`data.init_args.batch_size`, ...), so that a bad value in a file is checked, and said, as the same value written as
a flag would be (`diffusion.cli.parse_errors`): the line names the file and the key (the file's own shape:
`diffusion.cli.config_files`). Also here: the list flags'
other forms (`--metrics [fid, kid]`, `--metrics fid,kid`, `--sweep 0.1 0.2`) and `--print_config`, taken out of
a command line to be honoured once the rest of it parses; how an option is said once parsed (`where_written`:
its flag, or the file and key that set it); and how a declared type is said (`kind_name`, `alternatives`).
"""

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from jsonargparse import ArgumentParser

from diffusion.cli.config_files import as_text, beside, read_config_file, yaml_or_none
from diffusion.cli.jsonargparse_internals import (
    action_of,
    actions,
    alternatives,
    declared_type,
    is_union,
    loads_a_group_file,
    print_config_options,
)

PRINT_CONFIG = "--print_config"
# Keys of a class's mapping in a config file that are not its arguments (jsonargparse's own).
_CLASS_KEYS = ("class_path", "init_args", "dict_kwargs", "__path__")


@dataclass(frozen=True)
class Written:
    """A flag (`--key value ...`: `values` its words) or a config file's key (`values`: its one YAML value)."""

    key: str
    values: tuple[Any, ...]
    file: str | None = None  # the config file it was read from; None for a flag

    def shown(self) -> str:
        """As the user wrote it: `--model.lr abc`, or `run.yaml: model.lr abc`."""
        if self.file is None:
            return f"--{as_typed(self.key)} {' '.join(self.values)}".rstrip()
        return f"{self.file}: {self.key} {as_text(self.values[0])}".rstrip()


# How a check after the parse says the option it refuses: (key, value) -> `--data.batch_size 0` or, where a config
# file set it, `run.yaml: data.batch_size 0` (`where_written`).
SayOption = Callable[[str, Any], str]


def as_flag(key: str, value: Any) -> str:
    """An option's value as a flag gives it: `--data.batch_size 0` (a class's argument without `init_args`)."""
    return f"--{as_typed(plain_key(key))} {value}"


def where_written(written: Sequence[Written]) -> SayOption:
    """Says an option as the command line gave it its value: with the config file and key where a file set it
    last, else as its flag (a flag after the file wins, as in the parse; an option nobody wrote, a default)."""

    def said(key: str, value: Any) -> str:
        return f"{written_as(written, key)} {value}"

    return said


def written_as(written: Sequence[Written], key: str) -> str:
    """An option as the command line gave it: `--ckpt`, or `run.yaml: ckpt` where a config file set it last."""
    last = _last_written(written, key)
    return (
        f"{last.file}: {plain_key(key)}"
        if last is not None and last.file
        else f"--{as_typed(plain_key(key))}"
    )


# What the running command's command line wrote, once it parsed (`remember_written`): the one place every command
# reports a user error from (`diffusion.cli.reporting`) says a flag that a config file set as that file's key
# (`said_as_written`), without each command's checks after the parse being handed the command line.
_WRITTEN: ContextVar[tuple[Written, ...]] = ContextVar("written", default=())
# `--sigma_rel`, `--sigma_rel=2.0`, `--data.image_size` in a line (not a word's inner dashes)
_FLAG_IN_TEXT = re.compile(r"(?<![\w-])--([A-Za-z_][\w.]*\w)(=?)")


# train.py's shorthands the running command line typed, by the options they stand for (`trainer.max_steps` for
# `--max_steps`, `expand_shorthands`): its lines say each as typed, not as the long form the parser read
_TYPED_SHORT: ContextVar[frozenset[str]] = ContextVar("typed_short", default=frozenset())


def remember_shorthands(options: Iterable[str]) -> None:
    """The options (`trainer.max_steps`) the command line being run gave by a shorthand (`--max_steps`)."""
    _TYPED_SHORT.set(frozenset(options))


def as_typed(key: str) -> str:
    """An option's flag as the command line typed it: `max_steps` where `--max_steps` stood for
    `--trainer.max_steps` (`remember_shorthands`), else `key` as it is."""
    return key.partition(".")[2] if key in _TYPED_SHORT.get() else key


def remember_written(written: Sequence[Written]) -> None:
    """What the command line being run wrote: its errors' flags are said as it gave them (`said_as_written`)."""
    _WRITTEN.set(tuple(written))


def remembered_written() -> tuple[Written, ...]:
    """What the running command's command line wrote (`remember_written`): its flags and files' keys, in order."""
    return _WRITTEN.get()


def said_as_written(text: str, written: Sequence[Written] | None = None) -> str:
    """`text` (a check's problem) with each `--flag` that says the value a config file gave it (`--run DIR ...`,
    `--sigma_rel=2.0`, `--class_label: ...`, `(--data.image_size)`) said as that file's key, `run.yaml: run DIR`;
    a flag the user typed, one nobody wrote, and a flag merely named (`pass one of --sigma_rel and --sweep`) as
    they are. `written`: the running command line's (`remember_written`) by default."""
    written = _WRITTEN.get() if written is None else written

    def as_given(match: re.Match) -> str:
        last = _last_written(written, match[1])
        if last is not None and last.file is None and plain_key(match[1]) in _TYPED_SHORT.get():
            return f"--{as_typed(plain_key(match[1]))}{match[2]}"  # `--max_steps`, as typed, for `--trainer.max_steps`
        if last is None or last.file is None or not _says_its_value(text[match.end(1) :], last.values[0]):
            return match[0]
        return f"{last.file}: {plain_key(last.key)}" + (" " if match[2] else "")  # `=2.0` said ` 2.0`

    return _FLAG_IN_TEXT.sub(
        as_given, _FLAG_AND_NUMBER.sub(lambda match: _number_as_typed(match, written), text)
    )


# `--model.lr -1.0`: a flag followed by the number it was given, as the parser read it
_FLAG_AND_NUMBER = re.compile(r"(?<![\w-])(--([A-Za-z_][\w.]*\w)[ =])(-?\.?\d[\w.+-]*)")


def _number_as_typed(match: re.Match, written: Sequence[Written]) -> str:
    """A typed flag's number as the user typed it (`--model.lr -1`, not the parse's `-1.0`)."""
    last = _last_written(written, match[2])
    typed = last.values[0] if last is not None and last.file is None and len(last.values) == 1 else None
    try:
        return match[1] + typed if typed is not None and float(typed) == float(match[3]) else match[0]
    except ValueError:
        return match[0]


def _last_written(written: Sequence[Written], key: str) -> Written | None:
    """The last flag or file's key that set `key`; train.py's shorthands (`--devices`) are the Trainer's options."""
    plain = plain_key(key)
    keys = (plain, f"trainer.{plain}")
    return next((item for item in reversed(written) if plain_key(item.key) in keys), None)


def _says_its_value(after: str, value: Any) -> bool:
    """Whether the text after a flag goes on with its value: `=2.0`, `: ...`, `)`, or ` <the value>`."""
    if after[:1] in ("=", ":", ")"):
        return True
    if not after.startswith(" "):
        return False
    given = as_text(value)
    if after[1:].startswith((given, f'"{given}"')):  # a path in quotes: `--out "" is an empty path`
        return True
    word = after[1:].split(" ", 1)[0].rstrip(",;:")
    try:
        said, number = float(word), float(value if isinstance(value, int | float) else given)
    except (TypeError, ValueError):
        return False
    return said == number or (math.isnan(said) and math.isnan(number))  # NaN equals nothing, itself included


def plain_key(key: str) -> str:
    """A class's argument as a flag spells it: `data.batch_size` for the parser's `data.init_args.batch_size`."""
    return key.replace(".init_args.", ".")


def flags_written(argv: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
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


def everything_written(parser: ArgumentParser, argv: Sequence[str]) -> Iterator[Written]:
    """Each flag of `argv`; after a config file's flag (`--config FILE`, `--model FILE`), the keys the file sets,
    if it is a mapping of options (`config_file_problem` says why not)."""
    for key, values in flags_written(argv):
        yield Written(key, tuple(values))
        if values and is_config_file_flag(parser, key):
            options = read_config_file(values[-1])
            if isinstance(options, dict):
                prefix = "" if key == "config" else f"{key}."
                yield from keys_of_file(parser, options, prefix, values[-1])
        elif (
            values and (action := action_of(parser, key)) is not None and takes_a_class(declared_type(action))
        ):
            # A class chosen by a file (`--data data.yaml`), or by its name
            options = read_config_file(values[-1])
            if isinstance(options, dict):
                yield from keys_of_file(parser, {key: options}, "", values[-1])


def is_config_file_flag(parser: ArgumentParser, key: str) -> bool:
    action = action_of(parser, key)
    return key == "config" or (action is not None and loads_a_group_file(action))


def keys_of_file(
    parser: ArgumentParser, options: dict, prefix: str, file: str, within: tuple[Path, ...] = ()
) -> Iterator[Written]:
    """The keys a config file's mapping sets, as the parser takes them: a group's options one by one, a class's
    mapping as its class path and its arguments (`data.init_args.batch_size`), any other value whole; a file
    named in it (`config: base.yaml`, `data: data.yaml`) as that file's keys. `within`: the config files that
    named this one."""
    for name, value in options.items():
        key = f"{prefix}{name}"
        action = action_of(parser, key)
        if (
            isinstance(value, dict)
            and (action is None or loads_a_group_file(action))
            and has_keys_under(parser, key)
        ):
            yield from keys_of_file(parser, value, f"{key}.", file, within)
        elif isinstance(value, dict) and action is not None and takes_a_class(declared_type(action)):
            if "class_path" in value:
                yield Written(key, (value["class_path"],), file)
            arguments = {k: v for k, v in value.items() if k not in _CLASS_KEYS}  # written without init_args
            init_args = value.get("init_args")
            arguments |= init_args if isinstance(init_args, dict) else {}
            # its arguments not as a mapping (null too)
            if "init_args" in value and not isinstance(init_args, dict):
                yield Written(f"{key}.init_args", (init_args,), file)
            for argument, argument_value in arguments.items():
                yield Written(f"{key}.init_args.{argument}", (argument_value,), file)
        else:
            yield Written(key, (value,), file)
            if isinstance(value, str) and action is not None:  # a group's or a class's file named in this one
                named = read_config_file(path := beside(file, value))
                if not isinstance(named, dict):
                    continue  # no such file, or not one of options: `_bad_item` says why
                if key == "config":  # a config file named in this one; a loop of them is the parser's to say
                    chain = (*within, Path(file).resolve())
                    if Path(path).resolve() not in chain:
                        yield from keys_of_file(parser, named, "", path, chain)
                elif loads_a_group_file(action):
                    yield from keys_of_file(parser, named, f"{key}.", path, within)
                elif takes_a_class(declared_type(action)):
                    yield from keys_of_file(parser, {key: named}, "", path, within)  # `network: net.yaml`


def has_keys_under(parser: ArgumentParser, key: str) -> bool:
    return any(action.dest.startswith(f"{key}.") for action in actions(parser))


def takes_a_class(hint: Any) -> bool:
    """Whether a value of `hint` may be a class chosen by its path (a data module, a network, a logger)."""
    if get_origin(hint) is not None:
        return any(takes_a_class(arg) for arg in get_args(hint))
    return is_class_choice(hint)


def is_class_choice(kind: Any) -> bool:
    """A base class whose subclasses a flag chooses by class path (a Logger, a LightningDataModule, ...), not a
    value type (int, str, Path, timedelta, jsonargparse's PositiveInt, typing's Any)."""
    value_types = ("builtins", "datetime", "pathlib", "jsonargparse.typing", "typing")
    return isinstance(kind, type) and kind.__module__ not in value_types


def without_print_config(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """`argv` without `--print_config[=flags]`, and that flag (None if absent): it is honoured after the rest of
    the command line parses (jsonargparse prints at the point it meets it: flags after a `--config` it precedes
    were left out, and a bad value was printed with exit status 0)."""
    kept = [arg for arg in argv if arg != PRINT_CONFIG and not arg.startswith(f"{PRINT_CONFIG}=")]
    requested = [arg for arg in argv if arg not in kept]
    return kept, (requested[-1] if requested else None)


def print_config_problem(parser: ArgumentParser, argv: Sequence[str]) -> tuple[str, str] | None:
    """(what is wrong, fix) for `--print_config skip_default` (its options go after an '=': else the word is
    read as a value of the flag before it) and for an option it does not take (`--print_config=comments` without
    ruamel.yaml)."""
    options = print_config_options(parser)
    taken = f"({', '.join(options)}; several comma-separated)" if options else "(see --help)"
    for arg, after in zip(argv, [*argv[1:], None], strict=True):
        if arg == PRINT_CONFIG and after is not None and not after.startswith("-"):
            return (
                f"{PRINT_CONFIG} {after}: {PRINT_CONFIG} takes its options after an '='",
                f"write {PRINT_CONFIG}={after} {taken}",
            )
        asked = arg.partition("=")[2].split(",") if arg.startswith(f"{PRINT_CONFIG}=") else []
        # skip_null: skip_unset's old name, which jsonargparse still takes (with a deprecation warning)
        unknown = [option for option in asked if options and option not in (*options, "", "skip_null")]
        if unknown:
            return f"{arg}: {unknown[0]} is not an option of {PRINT_CONFIG}", f"pass some of {taken[1:-1]}"
    return None


def as_the_parser_takes(
    parser: ArgumentParser, argv: list[str], class_hint: Callable[[str], Any] = lambda key: None
) -> list[str]:
    """`argv` with each list flag's values in the form its parser takes (`in_list_form`); all else as written.
    `class_hint(key)`: the type of an argument of a class a group flag chose (`--model.network.init_args.
    channel_mult 1 2`), which the parser knows only once it reads the class."""
    taken, index = [], 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        if not arg.startswith("--"):
            taken.append(arg)
            continue
        key, equals, value = arg[2:].partition("=")
        if equals:  # `--channel_mult=1,2` as `--channel_mult 1,2` (`--key+=value`, an append: as written)
            listed = [] if key.endswith("+") else _list_form(parser, key, [value], class_hint)
            taken += [f"--{key}", *listed] if listed not in ([], [value]) else [arg]
            continue
        values = []
        while index < len(argv) and not argv[index].startswith("--"):
            values.append(argv[index])
            index += 1
        taken += [arg, *_list_form(parser, key, values, class_hint)]
    return taken


def _list_form(
    parser: ArgumentParser, key: str, values: list[str], class_hint: Callable[[str], Any]
) -> list[str]:
    """A flag's values in the form its parser takes (`in_list_form`), from its action's type or its class's."""
    if values and (action := action_of(parser, key)) is not None:
        return in_list_form(declared_type(action), action.nargs, values)
    if values and (hint := class_hint(key)) is not None:
        return in_list_form(hint, None, values)
    return values


def in_list_form(hint: Any, nargs: Any, values: Sequence[str]) -> list[str]:
    """A list flag's values in the form its parser takes, from any of `a b`, `[a, b]` and `a,b`: separate words
    for a flag of several values (`nargs`), one YAML list for a flag whose type is a list. Values of other
    flags, and lists of text (whose items may hold commas), are left as written."""
    several = nargs in ("+", "*")
    item = _plain(hint) if several else _list_item(hint)
    if item is None or item is str:
        return list(values)
    words = []
    for value in values:
        listed = yaml_or_none(value) if value.lstrip().startswith("[") else None
        if isinstance(listed, list) and not any(isinstance(v, list | dict) for v in listed):
            words += [as_text(v) for v in listed]
        else:
            words += [word.strip() for word in value.split(",") if word.strip()]
    if several:
        return words
    if len(values) == 1 and yaml_or_none(values[0]) is None:  # null: no list
        return list(values)
    return [f"[{', '.join(words)}]"]


def _list_item(hint: Any) -> Any:
    """The item type of a list of plain values (numbers, choices, text), optional or not; None for other types."""
    kinds = [arg for arg in get_args(hint) if arg is not type(None)] if is_union(hint) else [hint]
    if len(kinds) != 1 or get_origin(kinds[0]) not in (list, tuple, Sequence):
        return None
    items = [_plain(arg) for arg in get_args(kinds[0]) if arg is not Ellipsis]
    if not items or None in items:
        return None
    return str if str in items else items[0]


def _plain(kind: Any) -> Any:
    """`kind` if it is a number or a choice; str for text; None for anything else."""
    if get_origin(kind) is Literal:
        return kind
    if isinstance(kind, type) and issubclass(kind, str):
        return str
    return kind if isinstance(kind, type) and issubclass(kind, int | float) else None


def takes_a_collection(hint: Any) -> bool:
    """Whether a list or a mapping can be a value of `hint` (a list type, a class given as a mapping, Any)."""
    return any(
        kind is Any
        or (get_origin(kind) or kind) in (list, tuple, dict, Sequence, Iterable, Mapping)
        or is_class_choice(kind)
        or takes_a_class(kind)
        for kind in alternatives(hint)
    )
