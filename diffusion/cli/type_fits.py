"""Whether the words a command line (or a config file) gave fit an option's declared type, and what is said of
those that do not, from the type alone (choices, bounds, a class path, the kind): `parse_errors`' words for a
value, never jsonargparse's report.
"""

import datetime
import functools
import operator
import os
import re
import shlex
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from jsonargparse import ArgumentError, ArgumentParser

from diffusion.cli.chosen_classes import class_said, default_of
from diffusion.cli.command_line import (
    Written,
    alternatives,
    is_class_choice,
    plain_key,
    takes_a_collection,
)
from diffusion.cli.config_files import as_text, config_file_problem, read_config_file, yaml_or_none
from diffusion.cli.jsonargparse_internals import (
    actions,
    builtin_base,
    is_required,
    kind_name,
    number_bounds,
    parses_as,
    take_negative_numbers_as_values,
)

NOT_FINITE_WORDS = ("nan", "inf", "infinity", ".nan", ".inf")
# Kinds whose written form a user cannot guess.
_FORMAT_OF = {"timedelta": "h:m:s, e.g. 0:30:00", "list": "a list in brackets, e.g. [1, 2]"}


def fits(hint: Any, values: list[str], nargs: Any) -> bool:
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
    restricted = number_bounds(hint) is not None  # jsonargparse's PositiveInt & co.
    return restricted or hint in (int, float, bool, str, type(None), datetime.timedelta)


@functools.lru_cache(maxsize=1024)
def _fits_text(hint: Any, values: tuple[str, ...], nargs: Any) -> bool:
    """`_fits`, kept for types `_reads_only_the_text`: a report checks each flag before the bad one with a
    parser of its own (5 ms each)."""
    probe = ArgumentParser(exit_on_error=False)
    take_negative_numbers_as_values(probe)  # as the commands' parsers: `--value -1e-3`
    probe.add_argument("--value", type=hint, nargs=nargs)
    try:
        probe.parse_args(["--value", *values])
    except ArgumentError:
        return False
    return True


def said_of(shown: str, hint: Any, values: list[str], several: bool = False) -> tuple[str, str]:
    """What does not fit in `values` of type `hint`, said from the type: choices, bounds, class path or kind.
    `several`: a flag of several values (`--metrics fid kid`)."""
    kinds = [kind for kind in alternatives(hint) if kind is not type(None)]
    written = shown.split(": ", 1)[-1].split(" ", 1)[-1]  # the value as the user wrote it: `[1, 2.5]`, `abc`
    mapping = written.lstrip().startswith("{") and isinstance(yaml_or_none(written), dict)
    if mapping and kinds and all(get_origin(kind) in (list, tuple, Sequence) for kind in kinds):
        return (
            f"{shown} is a mapping, not a list",
            "write a list in brackets, e.g. [1, 2]",
        )  # `sweep: {0.05: 1}`
    if kinds and all(get_origin(kind) is list for kind in kinds):  # --metrics fid kid: say it of the items
        items = functools.reduce(operator.or_, (get_args(kind)[0] for kind in kinds))
        return said_of(shown, items, values, several=True)
    if kinds and all(get_origin(kind) is Literal for kind in kinds):
        by_text: dict[str, Any] = {}  # 64 and '64' (--precision): once, as first declared
        for choice in (choice for kind in kinds for choice in get_args(kind)):
            by_text.setdefault(str(choice), choice)
        fix = f"choose one of {', '.join(map(repr, by_text.values()))}"
        if several and len(by_text) > 1:
            a, b = list(by_text)[:2]
            fix += f"; several as {a} {b}, [{a}, {b}] or {a},{b}"
        return f"{shown} is not one of the choices", fix
    classes = [kind for kind in kinds if is_class_choice(kind)]
    found = (
        class_said(shown, classes, values[-1], only_classes=len(classes) == len(kinds)) if classes else None
    )
    if found:
        return found
    for kind in kinds:
        bounds = number_bounds(kind)  # jsonargparse.typing's restricted numbers
        if bounds and parses_as(builtin_base(kind), values[-1]):
            return (
                f"{shown} is out of range",
                f"pass a value {' and '.join(f'{op} {limit}' for op, limit in bounds)}",
            )
    listed = yaml_or_none(values[-1]) if values[-1].lstrip().startswith("[") else None
    as_a_list = any(
        mark in written for mark in "[, "
    )  # one bare word is said as no list, in a file as a flag
    if as_a_list and isinstance(listed, list) and (item_hint := _item_type(kinds)) is not None:
        for item in listed:  # `channel_mult [1, 2.5]` was "not a valid list": say the item that is not
            if not isinstance(item, list | dict) and not fits(item_hint, [as_text(item)], None):
                return said_of(f"{shown}: its item {as_text(item)}", item_hint, [as_text(item)])
    names = list(dict.fromkeys(kind_name(kind) for kind in kinds or [hint]))
    words = [str(item) for item in listed] if isinstance(listed, list) else list(values)  # `[0.1, nan]` too
    not_finite = any(word.strip().lower().lstrip("+-") in NOT_FINITE_WORDS for word in words)
    if "float" in names and not_finite:  # a float, but one the parser (and every such option) refuses
        return f"{shown}: NaN and infinity are no values of this option", "pass a finite number (see --help)"
    if names == ["bool"]:
        return f"{shown} is not a valid bool", "pass true or false"
    what = f"{shown} is not a valid {' or '.join(names)}"
    fix = "pass a value of that type" if len(names) == 1 else "pass a value of one of these types"
    formats = [_FORMAT_OF[name.split()[0]] for name in names if name.split()[0] in _FORMAT_OF]
    return what, f"{fix}: {'; '.join(formats)}" if formats else f"{fix} (see --help)"


def _item_type(kinds: list[Any]) -> Any:
    """The item type of lists of one (`tuple[int, ...]`, `Sequence[int]`); None for other types."""
    items = []
    for kind in kinds:
        args = [arg for arg in get_args(kind) if arg is not Ellipsis]
        if get_origin(kind) not in (list, tuple, Sequence) or len(args) != 1:
            return None
        if get_origin(kind) is tuple and Ellipsis not in get_args(kind):
            return None  # tuple[int]: one item, said by its length
        items.append(args[0])
    return functools.reduce(operator.or_, items) if items else None


def unlisted_said(
    shown: str, hint: Any, values: Sequence[Any], nargs: Any, in_file: bool
) -> tuple[str, str] | None:
    """A list option's items the parser refused as written, not as a list: one text in a file (`sweep: '0.05 0.1'`,
    `metrics: 'fid, kid'`, a quoted `'[fid, kid]'`, a lone `0.1`), a quoted word on the command line (`--sweep
    "0.05 0.1"`) or a list in brackets the shell split at its spaces (`--sweep [0.05, 0.1]`). Said "not a list"
    (its item was said "not a valid float"), with the form that works made of its own items; None unless each
    item fits."""
    kinds = [kind for kind in alternatives(hint) if kind is not type(None)]
    lists = kinds and all(get_origin(kind) in (list, tuple, Sequence) for kind in kinds)
    if not (nargs in ("+", "*") or lists) or not values or any(isinstance(v, list | dict) for v in values):
        return None
    text = " ".join(as_text(value) for value in values)
    items = [word for word in re.split(r"[\s,\[\]]+", text) if word]
    listed = f"[{', '.join(items)}]"
    if not items or not fits(hint, items if nargs in ("+", "*") else [listed], nargs):
        return None
    if in_file:
        quoted = text.lstrip().startswith("[")  # `metrics: '[fid, kid]'`: YAML's text, not its list
        return f"{shown} is not a list", (
            f"write the list without quotes: {listed}"
            if quoted
            else f"write a list in brackets, e.g. {listed}"
        )
    flag = shown.split(" ", 1)[0]
    fix = (
        f'write its items with commas, {flag} {",".join(items)}, or in brackets and quotes: {flag} "{listed}"'
    )
    if len(values) > 1 and "[" in text:
        return f"{flag} {text}: the shell split the list at its spaces", fix
    if len(values) == 1 and re.search(r"[\s\[]", text):
        return f"{flag} {shlex.quote(text)} is one word, not a list", fix
    return None


def one_value_said(shown: str, hint: Any, value: Any, nargs: Any = None) -> tuple[str, str] | None:
    """A list or a mapping (YAML's: a config file's value, a class's argument given as a flag) where one value of
    `hint` goes, whose text passes as a str (`samples: [a.npz]`, which the parser refused in its own words); None
    for any other value."""
    if (
        not isinstance(value, list | dict)
        or takes_a_collection(hint)
        or not fits(hint, [as_text(value)], nargs)
    ):
        return None
    names = " or ".join(
        dict.fromkeys(kind_name(kind) for kind in alternatives(hint) if kind is not type(None))
    )
    kind = "a list" if isinstance(value, list) else "a mapping"
    article = "an" if names[:1] in tuple("aeiou") else "a"
    return f"{shown} is {kind}, not {article} {names}", "write one value (see --help)"


def group_file_said(
    shown: str, hint: Any, value: str, path: str, sections: set[str]
) -> tuple[str, str] | None:
    """A class option's value that names a YAML file (`--model.network net.yaml`; `path`: as the parser reads it)
    and that the parser refused: missing, or a whole config (its keys the command's `sections`, no class_path or
    init_args), or a file of the class's arguments alone (said only if none of them is wrong: no class is chosen
    for them). Said as a class path, it was `no such class (No module named 'net')`. None for any other value."""
    if not any(is_class_choice(kind) for kind in alternatives(hint)):
        return None
    if not value.endswith((".yaml", ".yml")) and "/" not in value and os.sep not in value:
        return None
    if not Path(path).expanduser().exists():
        return (
            f"{shown}: no such file",
            "pass the path of an existing YAML file of its class_path and init_args, or a class path",
        )
    options = read_config_file(path)
    if not isinstance(options, dict | SyntaxError | None):  # `[1, 2]`, `hello`: was "no such class"
        kind = "a list" if isinstance(options, list) else f"a single value ({as_text(options)})"
        return (
            f"{shown}: the file holds {kind}, not a mapping of a class's options",
            "write class_path: module.Class in it, and its arguments under init_args: (see --print_config)",
        )
    if not isinstance(options, dict):  # a folder, an empty file, not YAML, not text: as any config file's
        flag = shown.split()[0] if shown.startswith("--") else "--" + shown.split(": ", 1)[-1].split()[0]
        return config_file_problem(flag[2:], path, shown)
    if is_a_whole_config(options, sections):
        keys = ", ".join(map(str, list(options)[:3]))
        return (
            f"{shown}: the file is a whole config (its keys: {keys}), not this option's class_path and init_args",
            "pass it as --config FILE, or here a file of this option's class_path and init_args",
        )
    if isinstance(options, dict) and "class_path" not in options:
        # only its class's arguments, and none of them wrong: no class was chosen before it (`--trainer.logger
        # false --trainer.logger lg.yaml`), where one would take them
        return (
            f"{shown}: the file names no class_path",
            "write class_path: module.Class in it, its arguments under init_args:, or choose the class before it",
        )
    return None


def is_a_whole_config(options: Any, sections: set[str]) -> bool:
    """Whether a file given to a class option holds a whole config: its keys the command's `sections`, no
    class_path or init_args."""
    keys = set(options) if isinstance(options, dict) else set()
    return not {"class_path", "init_args"} & keys and bool(sections & keys)


def required_said(parser: ArgumentParser, written: Sequence[Written]) -> tuple[str, str] | None:
    """A required option not given, or left blank in a config file (`ckpt:` with nothing after it)."""
    for action in actions(parser):
        if not is_required(parser, action) or default_of(parser, action.dest) is not None:
            continue
        flag, key = action.option_strings[-1], plain_key(action.dest)
        given = [item for item in written if plain_key(item.key) == key]
        if not given:
            return f"{flag} is required", f"pass {flag} VALUE (see --help)"
        if given[-1].file is not None and given[-1].values == (None,):
            return f"{given[-1].file}: {key} is blank, and it is required", f"write its value after '{key}:'"
    return None


def names_nothing(item: Written, hint: Any) -> tuple[str, str]:
    """`--metrics []`: no item for a flag of one value or more, said with its choices if it has them."""
    flag = f"--{plain_key(item.key)}"
    choices = [str(c) for kind in alternatives(hint) if get_origin(kind) is Literal for c in get_args(kind)]
    some = (
        f"name some of {' '.join(choices)} (e.g. {flag} {choices[0]})"
        if choices
        else "pass one value or more"
    )
    return (
        f"{item.shown()} names nothing: {flag} takes one value or more",
        f"{some}, or leave {flag} out for its default",
    )


def text_kinds(hint: Any) -> str | None:
    """'not text' for an option that takes only text (or null), 'not a path' for one that takes a path (or text,
    or null); None for any other (a number would fit one of its types). jsonargparse refuses a YAML number for
    either."""
    kinds = [kind for kind in alternatives(hint) if kind is not type(None)]
    paths = [kind for kind in kinds if isinstance(kind, type) and issubclass(kind, os.PathLike)]
    if not kinds or not all(kind is str or kind in paths for kind in kinds):
        return None
    return "not a path" if paths else "not text"
