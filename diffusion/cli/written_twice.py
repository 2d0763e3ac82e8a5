"""An option written twice on one command line where one of the two values would be lost without a word.

jsonargparse reads a command line in order and the last value wins: `--config base.yaml --model.lr 0.5` is how a
run changes one option of its file. Written the other way round (`--model.lr 0.5 --config base.yaml`, with
`model: {lr: 0.001}` in the file), the file's value replaces the flag's and the flag does nothing: the run trained
at 0.001, and `export --out new --config f.yaml` wrote into the file's `out`. An option given under its old name
and its new one is the same loss. Both are refused naming the two places, unless they give the same value (a file
that repeats a flag's value loses nothing). A config file after another (`--config a.yaml --config b.yaml`) is the
documented way to layer files, and is left alone.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jsonargparse import ArgumentParser, Namespace

from diffusion.cli.command_line import (
    Written,
    flags_written,
    in_list_form,
    is_config_file_flag,
    plain_key,
    takes_a_class,
)
from diffusion.cli.config_files import as_text, yaml_or_none
from diffusion.cli.jsonargparse_internals import action_of, declared_type
from diffusion.errors import UserError


def check_one_name_each(written: Iterable[Written], config: Namespace, renamed: Mapping[str, str]) -> None:
    """Refuse an option given under its old name (a key of `renamed`) and its new one with different values."""
    last = {plain_key(item.key): item for item in written}
    for old, new in renamed.items():
        # A config saved since the rename holds the old name as null: not given.
        if old in last and new in last and config.get(old) is not None and config.get(old) != config.get(new):
            raise UserError(
                f"{last[old].shown()} and {last[new].shown()} set one option ({old} is the old name of {new}) "
                "to different values",
                f"give it once, by its new name (--{new})",
            )


def check_short_and_long_form_agree(args: Sequence[str], shorthands: Sequence[str], group: str) -> None:
    """Refuse a shorthand (`--max_steps 4`) and its long form (`--trainer.max_steps 3`) given different values:
    both set one option, and the last would win without a word."""
    given: dict[str, list[tuple[str, str]]] = {}
    for key, values in flags_written(args):
        name = key.removeprefix(f"{group}.")
        if name in shorthands:
            given.setdefault(name, []).append((key, " ".join(values)))
    for name, forms in given.items():
        if len({key for key, _ in forms}) > 1 and len({value for _, value in forms}) > 1:
            (first, first_value), (last, last_value) = forms[0], forms[-1]
            raise UserError(
                f"--{first} {first_value} and --{last} {last_value} set one option (--{name} is short for "
                f"--{group}.{name}) to different values",
                f"give it once (--{name} or --{group}.{name})",
            )


def check_no_flag_replaced(parser: ArgumentParser, written: Sequence[Written]) -> None:
    """Refuse a flag that a config file named after it sets to another value (the file's value would win)."""
    for index, flag in enumerate(written):
        if flag.file is not None or not flag.values or is_config_file_flag(parser, flag.key):
            continue
        later_flag = None  # the flag that named the file of the items after it (`--config t.yaml`)
        for item in written[index + 1 :]:
            if item.file is None:
                later_flag = item
                continue
            if later_flag is None:
                continue  # the flag's own group file (`--data data.yaml`): its keys are the flag's value
            replaced = _replaced_value(parser, flag, item)
            if replaced is not None:
                given_by = f"--{later_flag.key} {later_flag.values[-1]}"
                raise UserError(
                    f"{flag.shown()} is replaced by {item.file}: {replaced}, which comes after it "
                    "(the last value wins)",
                    f"put --{flag.key} after {given_by}, or give it once",
                )


def _replaced_value(parser: ArgumentParser, flag: Written, item: Written) -> str | None:
    """The file's key and value as said (`model.lr 0.001`) if `item` sets `flag`'s option to another value."""
    key, value = plain_key(item.key), item.values[0]
    if key != plain_key(flag.key):
        return None
    action = action_of(parser, flag.key)
    if action is not None and takes_a_class(declared_type(action)) and isinstance(value, str):
        # A class by its name or its path (`--data DigitsDataModule`, `data: {class_path: diffusion.data....}`)
        same = _class_name(flag.values[-1]) == _class_name(value)
    else:
        same = _same_value(action, flag, value)
    return None if same else f"{key} {as_text(value)}"


def _same_value(action: Any, flag: Written, value: Any) -> bool:
    """Whether a flag's words give `value`: `1e-3` and 0.001, `fid kid` and [fid, kid] are the same."""
    words = list(flag.values)
    if action is not None:
        words = in_list_form(declared_type(action), action.nargs, words)
    text = " ".join(words)
    given = yaml_or_none(text) if len(words) == 1 else [yaml_or_none(word) for word in words]
    return text == as_text(value) or _equal(given, value)


def _equal(given: Any, value: Any) -> bool:
    if isinstance(given, list | tuple) and isinstance(value, list | tuple):
        return len(given) == len(value) and all(map(_equal, given, value))
    if given == value or str(given) == str(value):
        return True
    try:
        return float(given) == float(value)
    except (TypeError, ValueError):
        return False


def _class_name(path: str) -> str:
    return path.rsplit(".", 1)[-1]
