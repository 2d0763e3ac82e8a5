"""An option written twice on one command line where one of the two values would be lost without a word.

jsonargparse reads a command line in order and the last value wins: `--config base.yaml --model.lr 0.5` is how a
run changes one option of its file. Written the other way round (`--model.lr 0.5 --config base.yaml`, with
`model: {lr: 0.001}` in the file), the file's value replaces the flag's and the flag does nothing: the run trained
at 0.001, and `export --out new --config f.yaml` wrote into the file's `out`. An option given under its old name
and its new one is the same loss. Both are refused naming the two places, unless they give the same value (a file
that repeats a flag's value loses nothing). The very same flag written twice (`--steps 3 ... --steps 5`) is the
usual way to override a flag of a long command (a script's flags, then the user's): the last wins, as in every
argparse command, and a note says which value was dropped; a list flag written twice (`--metrics fid --metrics kid`,
`--trainer.callbacks A --trainer.callbacks B`) is refused, as its first items would be lost where they were most
likely meant to add up. A config file after another (`--config a.yaml --config b.yaml`) is the documented way to
layer files, and a list added to (`--trainer.callbacks+=CLASS`) takes every item: both are left alone.

An option of a class (`--trainer.logger.init_args.name foo`) with that class turned off (`--trainer.logger false`)
does nothing: after the option, the run goes on without it, and a note says so (`options_turned_off`); before
it, the parser cannot take it, and the line says the same (`turned_off_before`).

Written by no one: a note on an option that no flag or config file set says it as the default it is
(`said_with_defaults`), not as a flag the user never gave.
"""

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, get_origin

from jsonargparse import ArgumentParser, Namespace

from diffusion.cli.command_line import (
    SayOption,
    Written,
    alternatives,
    as_flag,
    flags_written,
    in_list_form,
    is_config_file_flag,
    plain_key,
    remembered_written,
    takes_a_class,
)
from diffusion.cli.config_files import as_text, yaml_or_none
from diffusion.cli.jsonargparse_internals import action_of, declared_type
from diffusion.errors import UserError

_NULL_WORDS = ("null", "Null", "NULL", "~")


# Options renamed, old name -> new (train.py's): the old keeps working, said as a note (`take_old_names`).
RENAMED_OPTIONS = {"model.compile": "model.compile_training"}


def check_one_name_each(
    written: Iterable[Written], config: Namespace, renamed: Mapping[str, str], parser: Any = None
) -> None:
    """Refuse an option given under its old name (a key of `renamed`) and its new one with different values; but
    not in one file where the new name holds its default (`parser`'s): the config.yaml of a run given the old name
    by a version before `take_old_names`, which saved both (tester round 24a: R1). The old one is taken."""
    last = {plain_key(item.key): item for item in written}
    for old, new in renamed.items():
        # A config saved since the rename holds the old name as null: not given.
        if old in last and new in last and config.get(old) is not None and config.get(old) != config.get(new):
            one_file = last[old].file is not None and last[old].file == last[new].file
            if one_file and parser is not None and config.get(new) == parser.get_default(new):
                continue
            raise UserError(
                f"{last[old].shown()} and {last[new].shown()} set one option ({old} is the old name of {new}) "
                "to different values",
                f"give it once, by its new name (--{new})",
            )


def take_old_names(config: Namespace, say: SayOption = as_flag, argv: list[str] | None = None) -> str | None:
    """Each option given by its old name (`RENAMED_OPTIONS`) set by its new one, the old one null, in `config` and
    as flags at the end of `argv` (what --print_config parses again), so the config a run saves and --print_config
    prints hold it once, by its new name (`--model.compile true` saved `compile_training: false` beside `compile:
    true`, a config.yaml its own check then refused: tester round 24a, R1); the note, a deprecation's, says the new
    name. None when no old name was given."""
    notes = []
    for old, new in RENAMED_OPTIONS.items():
        if (value := config.get(old)) is not None:
            config[new], config[old] = value, None
            text = as_text(value)
            (argv if argv is not None else []).extend([f"--{new}={text}", f"--{old}=null"])
            notes.append(
                f"{say(old, text)}: {old} is the old name of {new}, taken as {new} {text} — write that instead"
            )
    return "; ".join(notes) or None


def check_short_and_long_form_agree(args: Sequence[str], shorthands: Sequence[str], group: str) -> None:
    """Refuse a shorthand (`--max_steps 4`) and its long form (`--trainer.max_steps 3`) given different values: both
    set one option, and the last would win without a word (the same form twice is `check_each_flag_once`'s)."""
    given: dict[str, list[tuple[str, str]]] = {}
    for key, values in flags_written(args):
        name = key.removeprefix(f"{group}.")
        if name in shorthands:
            given.setdefault(name, []).append((key, " ".join(values)))
    for name, forms in given.items():
        # one form twice is no pair here: the last wins, said by the parse (`check_each_flag_once`)
        pairs = (
            (one, other) for i, one in enumerate(forms) for other in forms[i + 1 :] if one[0] != other[0]
        )
        differing = next(((one, other) for one, other in pairs if not _same_words(one[1], other[1])), None)
        if differing is None:
            continue
        (first, first_value), (last, last_value) = differing
        raise UserError(
            f"--{first} {first_value} and --{last} {last_value} set one option (--{name} is short for "
            f"--{group}.{name}) to different values",
            f"give it once (--{name} or --{group}.{name})",
        )


def check_each_flag_once(parser: ArgumentParser, argv: Sequence[str]) -> None:
    """A flag written twice with different values (`--steps 3 ... --steps=5`): the last wins, and a note says which
    value was dropped; a list flag written twice is refused (`_give_once`). The same value twice loses nothing.
    Left alone: config files (`--config a.yaml --config b.yaml` layer), a list added to (`--trainer.callbacks+=X`,
    `--sweep+=0.3`) and the options of each item added (a `--trainer.callbacks.logging_interval` after each), and a
    flag that is no option (the parse says it)."""
    keys = [arg[2:].partition("=")[0] for arg in argv if arg.startswith("--")]  # as written: `callbacks+`
    added_to = {key.removesuffix("+") for key in keys if key.endswith("+")}
    first: dict[str, Written] = {}
    for written_key, (key, values) in zip(keys, flags_written(argv), strict=True):
        if written_key.endswith("+"):  # the options after it are those of the item added
            first = {k: flag for k, flag in first.items() if not k.startswith(f"{plain_key(key)}.")}
        if key in added_to or is_config_file_flag(parser, key) or not _an_option(parser, key):
            continue
        flag = Written(key, tuple(values))
        earlier = first.setdefault(plain_key(key), flag)
        if earlier is not flag and _turns_off(earlier) and _class_option(parser, key):
            # `--trainer.logger false --trainer.logger CSVLogger`: off, then chosen anew (its arguments dropped)
            first[plain_key(key)] = flag
        elif earlier is not flag and not _same_flag_value(parser, earlier, flag):
            if not _a_list(parser, key):
                say_last_wins(earlier.shown(), flag.shown())
                first[plain_key(key)] = flag  # a third value is said against the one it replaces
                continue
            raise UserError(
                f"{earlier.shown()} and {flag.shown()} set one option to different values",
                _give_once(parser, key),
            )


def say_last_wins(earlier: str, last: str) -> None:
    """The note of a flag given twice: the last value is the one used (once, by rank 0 of a run)."""
    from lightning.pytorch.utilities import rank_zero_only

    if getattr(rank_zero_only, "rank", 0) == 0:  # set by Lightning at import, from the launcher's environment
        print(f"note: {earlier} and then {last}: the last given is used ({last})", file=sys.stderr)


def _a_list(parser: ArgumentParser, key: str) -> bool:
    """Whether `key` takes several values (`--metrics A B`), only a list (`--sweep [A, B]`), or a list of classes
    (`--trainer.callbacks`, whose second list jsonargparse failed to read); not an option of which a list is one
    form among single values (`--trainer.devices 4`, `[0, 1]` or `auto`): a later value of it replaces the first."""
    action = action_of(parser, key)
    if action is None:
        return False
    kinds = [kind for kind in alternatives(declared_type(action)) if kind is not type(None)]
    lists = [kind for kind in kinds if get_origin(kind) is list]
    return action.nargs in ("+", "*") or (
        bool(lists) and (len(lists) == len(kinds) or _class_option(parser, key))
    )


def _class_option(parser: ArgumentParser, key: str) -> bool:
    action = action_of(parser, key)
    return action is not None and takes_a_class(declared_type(action))


def _an_option(parser: ArgumentParser, key: str) -> bool:
    """Whether `key` is an option of `parser`, or an argument of a class one of its options chooses."""
    parts = key.split(".")
    return any(action_of(parser, ".".join(parts[:cut])) is not None for cut in range(len(parts), 0, -1))


def _same_flag_value(parser: ArgumentParser, one: Written, other: Written) -> bool:
    """Whether two flags of one option give it the same value: `1e-3` and `0.001`, `fid kid` and `[fid, kid]`,
    `--overwrite` and `--overwrite true`, a class by its name and by its path."""
    action = action_of(parser, one.key)
    if _class_option(parser, one.key) and len(one.values) == len(other.values) == 1:
        return _class_name(one.values[0]) == _class_name(other.values[0])
    words = [list(flag.values) or ["true"] for flag in (one, other)]  # a flag alone (`--overwrite`): true
    if action is not None:
        words = [in_list_form(declared_type(action), action.nargs, each) for each in words]
    return _same_words(" ".join(words[0]), " ".join(words[1])) or _equal(
        *([yaml_or_none(word) for word in each] for each in words)
    )


def _same_words(one: str, other: str) -> bool:
    """Whether two values as written are the same value read as YAML (`3` and `3`, `1e-3` and `0.001`)."""
    return one == other or _equal(yaml_or_none(one), yaml_or_none(other))


def _give_once(parser: ArgumentParser, key: str) -> str:
    """The fix: give it once; a list gives all its items at once, or adds one (`+=`)."""
    action = action_of(parser, key)
    if action is not None and action.nargs in ("+", "*"):
        return f"give it once, with all its values (--{key} A B)"
    if action is not None and any(get_origin(kind) is list for kind in alternatives(declared_type(action))):
        return f"give it once, with all its items ([A, B]), or add one with --{key}+=B"
    return "give it once"


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


def turned_off_before(
    parser: ArgumentParser, written: Sequence[Written], item: Written
) -> tuple[str, str] | None:
    """(what is wrong, fix) if `item` sets an option of a class (`--trainer.logger.init_args.name foo`) that an
    earlier flag or key turned off (`--trainer.logger false`, or null) and none chose again: the parser refuses it
    in its own words. `written`: the command line up to `item`."""
    group = _class_turned_off(parser, item.key)
    if group is None:
        return None
    chosen = [w for w in written if w is not item and plain_key(w.key) in (group, f"{group}.class_path")]
    if chosen and _turns_off(chosen[-1]):
        return _said_turned_off(item, chosen[-1], group)
    return None


def options_turned_off(parser: ArgumentParser, written: Sequence[Written]) -> list[str]:
    """A note for each flag that sets an option of a class (`--trainer.logger.init_args.name foo`) which a later
    flag or config file's key turns off (`--trainer.logger false`): the run goes on without it. A config file's
    keys before it are left alone (`configs/digits.yaml`'s logger name under `--trainer.logger false`)."""
    notes = []
    for index, item in enumerate(written):
        group = _class_turned_off(parser, item.key) if item.file is None and item.values else None
        if group is None:
            continue
        later = [w for w in written[index + 1 :] if plain_key(w.key) in (group, f"{group}.class_path")]
        if later and _turns_off(later[-1]):
            problem, fix = _said_turned_off(item, later[-1], group)
            notes.append(f"{problem} — {fix}")
    return notes


def _class_turned_off(parser: ArgumentParser, key: str) -> str | None:
    """The option choosing a class that may be turned off (false or null: `trainer.logger`) that `key` sets an
    option of (`trainer.logger.init_args.name`, `trainer.logger.name`); None for any other key."""
    parts = plain_key(key).split(".")
    for cut in range(len(parts) - 1, 0, -1):
        group, rest = ".".join(parts[:cut]), parts[cut:]
        action = action_of(parser, group)
        if action is None:
            continue
        kinds = alternatives(declared_type(action))
        can_be_off = bool in kinds or type(None) in kinds
        if rest in (["class_path"], ["help"]) or not can_be_off or not takes_a_class(declared_type(action)):
            return None
        return group
    return None


def _turns_off(item: Written) -> bool:
    """Whether a flag or key sets its option to false or null."""
    if item.file is not None:
        return item.values[0] is False or item.values[0] is None
    if len(item.values) != 1:
        return False
    word = str(item.values[0]).strip()
    return yaml_or_none(word) is False or word in _NULL_WORDS


def _said_turned_off(item: Written, off: Written, group: str) -> tuple[str, str]:
    return (
        f"{item.shown()} sets an option of the {group.rsplit('.', 1)[-1]}, and {off.shown()} turns it off",
        "drop one of them",
    )


def said_with_defaults(say: SayOption) -> SayOption:
    """`say` (`where_written`), with an option that no flag or config file of the running command line set said
    as the default it is: `the default --model.warmup_steps 5000 (no flag or config file sets it)`, not as a flag
    the user never gave (a --config replaces the default recipe). `as_flag` (a config given as an object): as is."""
    if say is as_flag:
        return say
    written = remembered_written()
    keys = {plain_key(item.key) for item in written}
    inline = {  # a group given as a mapping on the command line: `--model '{warmup_steps: 10}'`
        plain_key(item.key)
        for item in written
        if item.file is None and any(str(word).lstrip().startswith("{") for word in item.values)
    }

    def said(key: str, value: Any) -> str:
        plain = plain_key(key)
        if plain in keys or any(plain.startswith(f"{group}.") for group in inline):
            return say(key, value)
        return f"the default {say(key, value)} (no flag or config file sets it)"

    return said
