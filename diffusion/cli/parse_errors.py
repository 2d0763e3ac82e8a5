"""A command line the parser refused, said from the parser's own structure: which flag or key, its value, what fits.

jsonargparse refuses a bad command line with a nested report written for its developers (union subtypes,
`Parser key "..."`, the adapters it tried). The commands do not read that report. `parse_command_line` runs the
parse; when it fails, `what_is_wrong` looks for the cause itself: each flag of the command line, and each key of
each config file it names (`diffusion.cli.command_line`), is checked alone against the type the parser declares
for it (`diffusion.cli.jsonargparse_internals`; for an argument of a class chosen by a group flag such as
`--data.batch_size`, the chosen class's signature), and the first that does not fit is said from that type: its
choices (Literal), its bounds (jsonargparse's restricted numbers), its kind (int, float, bool, list, timedelta), or
the class path that imports nothing. A value in a file is said as the same value given as a flag, with the file
and its key: `run.yaml: model.lr abc is not a valid float — ...`. Only when nothing written explains the refusal
is the library's own message shown, on one line.

What is printed is what runs: `--print_config` is honoured once the rest of the command line has parsed, wherever
it was written, and an option given under its old name and its new one with different values is refused
(`check_one_name_each`).
"""

import difflib
import inspect
import os
import sys
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from jsonargparse import ArgumentError, ArgumentParser, Namespace

from diffusion.cli import jsonargparse_internals, type_fits
from diffusion.cli.chosen_classes import chosen_class, class_argument_hint, default_of, imported
from diffusion.cli.command_line import (
    PRINT_CONFIG,
    Written,
    alternatives,
    as_the_parser_takes,
    everything_written,
    flags_written,
    has_keys_under,
    in_list_form,
    is_class_choice,
    is_config_file_flag,
    plain_key,
    print_config_problem,
    remember_written,
    takes_a_class,
    without_print_config,
)
from diffusion.cli.config_files import (
    as_text,
    beside,
    command_line_only,
    config_file_problem,
    read_config_file,
    yaml_or_none,
)
from diffusion.cli.jsonargparse_internals import action_of, actions, declared_type, is_required, option_names
from diffusion.cli.trainer_options import SHORTHANDS
from diffusion.cli.type_fits import (
    fits,
    group_file_said,
    names_nothing,
    one_value_said,
    required_said,
    said_of,
    text_kinds,
)
from diffusion.cli.written_twice import (
    check_each_flag_once,
    check_no_flag_replaced,
    check_one_name_each,
    options_turned_off,
    turned_off_before,
)
from diffusion.errors import UserError

__all__ = [
    "BadCommandLine",
    "CommandLine",
    "check_one_name_each",
    "flags_written",
    "parse_command_line",
    "parsed_command_line",
    "what_is_wrong",
]

_FLAG_HELP = "see --help for the options (--print_config for a full config)"


class BadCommandLine(UserError):
    """A command line the parser refused, said as `--flag value: what is wrong — fix`."""


def parse_command_line(parser: ArgumentParser, argv: Sequence[str] | None) -> Namespace:
    """`parser.parse_args(argv)`; a refusal raises `BadCommandLine` naming the flag (see the module's docstring).
    `--print_config` prints the config of the whole command line, once it parses, and exits."""
    command_line = parsed_command_line(parser, argv)
    command_line.print_config_if_asked()
    return command_line.config


@dataclass
class CommandLine:
    """A command line that parsed: its config, what it wrote (flags and config files' keys, in order) and its
    `--print_config` request, to be honoured once the command's own checks of the config have passed."""

    parser: ArgumentParser
    argv: list[str]  # less --print_config
    config: Namespace
    written: list[Written]
    print_request: str | None

    def class_hint(self, key: str) -> Any:
        return class_argument_hint(self.parser, self.written, key)

    def print_config_if_asked(self) -> None:
        """Print the config as jsonargparse prints it (parsing the command line again, the request last) and exit
        0, if `--print_config` was given."""
        if self.print_request:
            taken = as_the_parser_takes(self.parser, self.argv, self.class_hint)
            try:
                self.parser.parse_args([*taken, self.print_request])
            except OSError as error:  # stdout refused the config: a full disk, a closed pipe, /dev/full
                reason = error.strerror or type(error).__name__
                if (
                    sys.stdout is sys.__stdout__
                ):  # its unflushed rest would fail again at exit, with a traceback
                    sys.stdout = open(os.devnull, "w")  # noqa: SIM115  # the process's stdout until it ends
                raise UserError(
                    f"{PRINT_CONFIG}: the config could not be written to the standard output ({reason})",
                    "write it where there is room: redirect the output to a file on another disk",
                ) from error
            raise AssertionError(f"{self.print_request} printed nothing")  # jsonargparse exits after printing


# The options a parser links from another (train.py: the model's from the data), with what sets them: given by the user,
# they are refused naming it. Beside the parser, not in it: its attributes are jsonargparse's.
_SET_BY_LINKS: "weakref.WeakKeyDictionary[ArgumentParser, dict[str, str]]" = weakref.WeakKeyDictionary()


def link_arguments(parser: ArgumentParser, source: str, target: str, set_by: str, **link: Any) -> None:
    """`parser.link_arguments(source, target, **link)`, and `target` refused when written, said to be set by
    `set_by` (jsonargparse said `Linked "model.sample_shape" must be given via "data.sample_shape"`, an option
    no one can give)."""
    parser.link_arguments(source, target, **link)
    _SET_BY_LINKS.setdefault(parser, {})[target] = set_by


def parsed_command_line(
    parser: ArgumentParser, argv: Sequence[str] | None, renamed: Mapping[str, str] | None = None
) -> CommandLine:
    """`argv` (sys.argv's by default) parsed without its `--print_config`, its list flags in the form the parser
    takes; a refusal raises `BadCommandLine`, and so does an option given under its old name (a key of `renamed`)
    and its new one with different values."""
    argv = sys.argv[1:] if argv is None else argv
    if (problem := print_config_problem(parser, argv)) is not None:
        raise BadCommandLine(*problem)
    written, print_request = without_print_config(argv)
    check_each_flag_once(parser, written)  # `--steps 3 --steps 5`: the 3 lost without a word
    items = list(everything_written(parser, written))  # read once: the list forms' hints, then the checks
    # jsonargparse refused a linked option in its own words: `argument <lambda>(data) --> model.class_names`
    for item in items:
        if (set_by := _SET_BY_LINKS.get(parser, {}).get(plain_key(item.key))) is not None:
            raise BadCommandLine(f"{item.shown()}: {set_by}", f"leave --{plain_key(item.key)} out")
    try:
        taken = as_the_parser_takes(parser, written, lambda key: class_argument_hint(parser, items, key))
        config = parser.parse_args(taken)
    except (ArgumentError, UnicodeDecodeError) as error:  # the parser reads a config file that is not text so
        raise BadCommandLine(*what_is_wrong(parser, written, error)) from error
    except (RuntimeError, TypeError) as error:  # jsonargparse failing inside: `metrics: {fid: true}`
        if (said := what_is_wrong(parser, written, error))[1] is _FLAG_HELP:
            raise  # nothing written explains it: a bug, with its traceback
        raise BadCommandLine(*said) from error
    command_line = CommandLine(parser, written, config, items, print_request)
    check_one_name_each(command_line.written, config, renamed or {}, parser)
    for item in command_line.written:  # a file the parser read as meant may still say a key twice
        if item.file is None and item.values and is_config_file_flag(parser, item.key):
            found = config_file_problem(item.key, str(item.values[-1]), None, option_names(parser))
            if found is not None:
                raise BadCommandLine(*found)
        if item.file is not None and (found := _taken_but_unusable(parser, command_line.written, item)):
            raise BadCommandLine(*found)
    check_no_flag_replaced(parser, command_line.written)
    # `--trainer.logger.name x --trainer.logger false`: train.py's notes (no other command has such options)
    if notes := options_turned_off(parser, command_line.written):
        from diffusion.cli.train_warnings import say_notes

        say_notes(notes)
    remember_written(command_line.written)  # the command's later checks said as the user gave their options
    return command_line


def what_is_wrong(parser: ArgumentParser, argv: list[str], error: BaseException) -> tuple[str, str]:
    """(what is wrong, how to fix it) for a command line `parser` refused with `error`."""
    written, deferred = [], None
    for item in everything_written(parser, argv):
        written.append(item)
        found = _bad_item(parser, written, item)
        if found and _chooses_a_class_by_name_or_file(parser, item):
            # the line if none of the class's arguments, after it, is what is wrong
            deferred = deferred or found
        elif found:
            return found
    if deferred:
        return deferred
    return required_said(parser, written) or (" ".join(str(error).split()), _FLAG_HELP)


def _bad_item(parser: ArgumentParser, written: list[Written], item: Written) -> tuple[str, str] | None:
    """What is wrong with one flag or key, said from its declared type; None if it fits (or has no type)."""
    if found := turned_off_before(parser, written, item):  # an option of a class turned off before it
        return found
    if item.file is not None and item.key.endswith(".init_args") and not isinstance(item.values[0], dict):
        return (
            f"{item.shown()}: init_args holds the arguments of the class, by name",
            "write them under it as name: value lines (e.g. channels: 64)",
        )
    if item.file is not None and (found := command_line_only(item.file, item.key, item.values[0])):
        return found
    action = action_of(parser, item.key)
    if is_config_file_flag(parser, item.key) and item.values:
        value = item.values[-1]
        required = [
            a.dest for a in actions(parser) if a.dest.startswith(f"{item.key}.") and is_required(parser, a)
        ]
        if value is None and required:  # `model: null` drops the group, and its required options with it
            shown = item.shown() if item.file else f"--{item.key} null"
            return (
                f"{shown}: this group cannot be null (it needs {required[0]})",
                "remove the line, or write its options under it",
            )
        inline = isinstance(value, dict | None) and item.key != "config"
        if inline or isinstance(yaml_or_none(str(value)), dict):
            return None  # options written inline: --model '{lr: 1e-3}', or a mapping under the key in a file
        if item.file is None:
            return config_file_problem(item.key, str(value), None, option_names(parser))
        path = beside(item.file, str(value))  # a file named in a file: read from that file's folder
        shown = item.shown() + ("" if path == str(value) else f" (read from its folder: {path})")
        found = config_file_problem(item.key, path, shown, option_names(parser))
        if found and path != str(value) and not Path(path).exists():
            folder = Path(item.file).parent
            return found[0], f"write its path from {folder}/, the folder of {item.file}, or an absolute path"
        return found
    if action is None and (unknown := _not_an_option(parser, written, item)):
        return unknown
    hint = declared_type(action) if action is not None else class_argument_hint(parser, written, item.key)
    if hint is None or not item.values:
        return None
    if item.file is not None and item.values == (None,) and action is None:  # a class's argument, null
        return _taken_but_unusable(parser, written, item)
    nargs = getattr(action, "nargs", None)
    if item.file is None:
        values = in_list_form(hint, nargs, item.values)
        if not values:  # `--metrics []` (or `,`): its list form has no item, and the flag takes at least one
            return names_nothing(item, hint) if nargs == "+" else None
        if len(values) > 1 and nargs in (None, "?"):  # argparse leaves the words after the first unread
            return (
                f"{item.shown()}: --{item.key} takes one value",
                "quote a value that holds spaces (see --help)",
            )
        if action is None and len(values) == 1:  # a class's argument: YAML to the parser (`[a, b]` is a list)
            read = yaml_or_none(values[0])
            null = read is None and values[0].strip() in ("null", "Null", "NULL", "~")
            found = _taken_but_unusable(parser, written, item, null) if null else None
            if found := found or one_value_said(item.shown(), hint, read, nargs):
                return found
    elif nargs in ("+", "*"):  # several values: in a file, a list
        listed = item.values[0] if isinstance(item.values[0], list) else [item.values[0]]
        values = [as_text(value) for value in listed]
        if listed is not item.values[0] and fits(
            hint, values, nargs
        ):  # one item: the list's brackets missing
            return f"{item.shown()} is not a list", f"write a list in brackets, e.g. [{values[0]}]"
    else:
        value = item.values[0]
        values = [as_text(value)]
        if found := one_value_said(item.shown(), hint, value, nargs):
            return found
        # `precision: 8` (YAML's int) where only text goes, `default_root_dir: 5` where a path: the parser's words
        if isinstance(value, int | float) and (texts := text_kinds(hint)):
            return f"{item.shown()} is a number, {texts}", f"write it in quotes: '{as_text(value)}'"
    if fits(hint, values, nargs):
        return None
    if found := type_fits.unlisted_said(item.shown(), hint, item.values, nargs, item.file is not None):
        return found  # `sweep: 0.1`, `sweep: '0.05 0.1'`: a list's items, not a list
    sections = {action.dest.split(".")[0] for action in actions(parser)}
    file_said = group_file_said(item.shown(), hint, values[-1], beside(item.file, values[-1]), sections)
    return file_said or said_of(item.shown(), hint, values, several=nargs in ("+", "*"))


def _chooses_a_class_by_name_or_file(parser: ArgumentParser, item: Written) -> bool:
    """A class chosen by its path (of the kind the option takes) or by a file of its options (`--data
    data.yaml`): checked alone, it may not fit for want of its arguments (CSVLogger's save_dir), or for one of
    them, each of which is checked after it as its own key."""
    action = action_of(parser, item.key)
    value = item.values[-1] if item.values else None
    if action is None or not isinstance(value, str) or not takes_a_class(hint := declared_type(action)):
        return False
    if isinstance(options := read_config_file(beside(item.file, value)), dict):  # a whole config: said now
        return not type_fits.is_a_whole_config(options, {a.dest.split(".")[0] for a in actions(parser)})
    found, classes = imported(value), tuple(kind for kind in alternatives(hint) if is_class_choice(kind))
    return isinstance(found, type) and issubclass(found, classes)


def _taken_but_unusable(
    parser: ArgumentParser, written: list[Written], item: Written, null: bool = False
) -> tuple[str, str] | None:
    """A config file's value the parser let through that the command cannot use: a group written as one number
    (`trainer: 5`: an AttributeError in the command), or `key: null` (or a bare `key:`) for an option whose type
    takes no null (a TypeError deep in the command's work). `null`: a class's argument given as a flag, `null`."""
    value = item.values[0] if item.values else None
    group = is_config_file_flag(parser, item.key) or has_keys_under(parser, item.key)
    action = action_of(parser, item.key)
    # a class's option, checked by the parser (`logger: false`)
    typed = action is not None and takes_a_class(declared_type(action))
    if group and not typed and not isinstance(value, dict | str | None):
        return (
            f"{item.shown()}: {plain_key(item.key)} is a group of options, not one value",
            "write its options under it as name: value lines, or the path of a YAML file of them",
        )
    if (item.values != (None,) and not null) or group:
        return None  # a group's null: `_bad_item`
    hint = declared_type(action) if action is not None else class_argument_hint(parser, written, item.key)
    kinds = [] if hint is None else alternatives(hint)
    default = default_of(parser, item.key) if action is not None else None
    if (
        not kinds
        or any(kind in (type(None), Any) for kind in kinds)
        or (action is not None and default is None)
    ):
        return None  # null taken, or the default itself (`--metrics`' None: every metric)
    said = [
        f"one of {', '.join(map(str, get_args(kind)))}"
        if get_origin(kind) is Literal
        else f"a {jsonargparse_internals.kind_name(kind)}"
        for kind in kinds
    ]
    unset = ("remove the line" if item.file else "leave the flag out") + (
        "" if default is None else f" for the default ({as_text(default)})"
    )
    takes = " or ".join(dict.fromkeys(said)).replace("a int", "an int")
    return f"{item.shown()}: this option takes {takes}, not null", f"{unset}, or write a value"


def _no_group_takes(parser: ArgumentParser, key: str) -> bool:
    """No flag is `key` or under it, and no flag that chooses a class (whose arguments have no flags) holds it."""
    parts = key.split(".")
    groups = [action_of(parser, ".".join(parts[:cut])) for cut in range(len(parts) - 1, 0, -1)]
    under = any(action.dest.startswith(f"{key}.") for action in actions(parser))
    return not under and not any(group and takes_a_class(declared_type(group)) for group in groups)


def _not_an_option(parser: ArgumentParser, written: list[Written], item: Written) -> tuple[str, str] | None:
    """A flag or key that no flag is or holds, or that the class its group chose does not take."""
    where = f"{item.file}: {item.key}" if item.file else f"--{item.key}"
    chosen = chosen_class(parser, written, item.key)
    if chosen is None:
        if not _no_group_takes(parser, item.key):
            return None
        # A near miss named (flags are not taken by a prefix: `--step` for `--steps` is refused, not guessed)
        names = option_names(parser)  # and on a command line train.py's shorthands (`--max_stepz`)
        names += [] if item.file else [name for name in SHORTHANDS if f"trainer.{name}" in names]
        longer = [name for name in names if name.startswith(item.key)]  # `--guidance` of --guidance_scale
        close = difflib.get_close_matches(item.key, names, n=1, cutoff=0.8) or longer[:1] * (len(longer) == 1)
        if close:
            meant = close[0] if item.file else f"--{close[0]}"
            return (
                f"{where} is not an option of this command",
                f"write {meant} if that is what was meant, or {_FLAG_HELP}",
            )
        if own := _own_options_under_a_group(item, names):  # `sampling: {sampler: ddim}` of train.py's config
            meant = ", ".join(own) if item.file else " ".join(f"--{name}" for name in own)
            return (
                f"{where} is not an option of this command",
                f"write {meant} ({'its own options' if len(own) > 1 else 'its own option'}"
                f"{', at the top level of the file' if item.file else ''}), or {_FLAG_HELP}",
            )
        return f"{where} is not an option of this command", _FLAG_HELP
    cls, name = chosen
    try:
        # The class's own __init__ (mypy: "unsound on an instance"; `cls` is the class the group chose).
        parameters = inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
    except (TypeError, ValueError):  # no signature to read: no telling
        return None
    if any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return f"{where} is not an option of {cls.__name__}", _FLAG_HELP


def _own_options_under_a_group(item: Written, names: list[str]) -> list[str]:
    """This command's options that `item` wrote under a group it does not have: `--sampling.steps` (sample's
    --steps), a file's `sampling:` mapping of `sampler` and `steps` (as train.py's config nests them)."""
    parts = item.key.split(".")
    for cut in range(1, len(parts)):
        if ".".join(parts[cut:]) in names:
            return [".".join(parts[cut:])]
    value = item.values[-1] if item.file and item.values else None
    return [key for key in value if key in names] if isinstance(value, dict) else []
