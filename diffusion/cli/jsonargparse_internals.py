"""The one module that reads jsonargparse's private structure; everything else uses this or its public API.

To say a refused command line from the parser's declared types (`diffusion.cli.parse_errors`), the commands need
what jsonargparse keeps to itself: a parser's actions, the type an action was declared with, the bounds of a
restricted number (`PositiveInt`), which actions load a group's options from a file (`--model FILE`) and which are
jsonargparse's own (a class's `--X.help`, the targets of links). A jsonargparse release may rename any of it: then
this module alone changes, and `tests/cli/test_jsonargparse_internals.py` says what moved. pyproject's range ends at
the newest version tested; `.ci/run` also runs the parser's tests on the oldest it admits.
"""

import operator
import re
import types
import typing
from argparse import Action
from collections.abc import Iterable, Sequence
from typing import Any, get_args, get_origin

# The private modules imported whole: a class that moved fails at import, by its name here.
import jsonargparse._actions as _jsonargparse_actions
import jsonargparse._link_arguments as _jsonargparse_links
from jsonargparse import ActionYesNo, ArgumentParser

_COMPARISONS = {operator.gt: ">", operator.ge: ">=", operator.lt: "<", operator.le: "<=", operator.ne: "!="}
_GROUP_FILE_ACTION = _jsonargparse_actions._ActionConfigLoad
_CLASS_HELP_ACTION = _jsonargparse_actions._ActionHelpClassPath
_LINK_ACTION = _jsonargparse_links.ActionLink
# A negative number as a flag's value: argparse's own matcher (`-3`, `-0.5`) with e-notation too (`-1e-3`, `-2.5E4`),
# which argparse took for an unknown option, so that `--model.lr -1e-3` was "not a valid float".
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def actions(parser: ArgumentParser) -> list[Action]:
    """Every argument `parser` declares (argparse's list, which jsonargparse extends)."""
    return list(parser._actions)


def action_of(parser: ArgumentParser, key: str) -> Action | None:
    """The action of the flag `--key`, or None where the parser has no such flag."""
    return parser._option_string_actions.get(f"--{key}")


def option_names(parser: ArgumentParser) -> list[str]:
    """The name of every `--flag` the parser declares, without its dashes (`trainer.max_steps`)."""
    return [option[2:] for option in parser._option_string_actions if option.startswith("--")]


def declared_type(action: Action) -> Any:
    """The type an argument was declared with: bool for a yes/no flag, the type hint jsonargparse keeps for a typed
    one (`ActionTypeHint`), else argparse's `type` (None for an untyped flag)."""
    if isinstance(action, ActionYesNo):
        return bool
    return getattr(action, "_typehint", action.type)


def loads_a_group_file(action: Action) -> bool:
    """Whether the flag reads a group's options from a YAML file (`--model FILE`, `--trainer FILE`, ...)."""
    return isinstance(action, _GROUP_FILE_ACTION)


def is_jsonargparse_own(action: Action) -> bool:
    """A flag jsonargparse adds by itself, not the user's to set: a class's `--X.help`, a link's target."""
    return isinstance(action, (_CLASS_HELP_ACTION, _LINK_ACTION))


def number_bounds(kind: Any) -> list[tuple[str, Any]] | None:
    """[(">", 0)] for jsonargparse's `PositiveInt` and any restricted number type; None for any other type."""
    restrictions = getattr(kind, "_restrictions", None) if isinstance(kind, type) else None
    if not restrictions:
        return None
    return [(_COMPARISONS.get(compare, "?"), limit) for compare, limit in restrictions]


def take_negative_numbers_as_values(parser: ArgumentParser) -> None:
    """Have `parser` read a word such as `-1e-3` as a value, as it reads `-0.001` (argparse's private matcher of
    negative numbers knows no e-notation). Its flags are `--` ones, so no option looks like a number."""
    parser._negative_number_matcher = _NEGATIVE_NUMBER


def drop_print_config_request(parser: ArgumentParser) -> None:
    """Forget a `--print_config` a parse met and did not honour (it failed after): a parser used again would
    print at its next parse. jsonargparse keeps the request as an attribute of the parser."""
    if hasattr(parser, "print_config"):
        del parser.print_config


def is_required(parser: ArgumentParser, action: Action) -> bool:
    """Whether the flag must be given: argparse's `required`, which jsonargparse before 4.40 kept False, holding
    the required keys in a set of the parser's own."""
    return bool(action.required) or action.dest in getattr(parser, "required_args", ())


def print_config_options(parser: ArgumentParser) -> list[str] | None:
    """The options `--print_config=...` takes in this jsonargparse (`skip_default`, `skip_unset`, `comments`
    where ruamel.yaml is installed; releases rename them), read from its help; None where it cannot be read."""
    action = action_of(parser, "print_config")
    help_text = getattr(action, "help", None) or ""
    _, found, listed = help_text.partition("supported flags are:")
    options = [word.strip(" .") for word in listed.split(",") if word.strip(" .")]
    return options if found and options and all(word.isidentifier() for word in options) else None


# How a declared type is read (its union's members, the built-in a restricted number extends, its name in a line)
_UnionType = type(int | None)


def is_union(hint: Any) -> bool:
    return get_origin(hint) in (typing.Union, _UnionType)


def kind_name(kind: Any) -> str:
    """int, float, bool, list (a list, tuple or Sequence), timedelta, ...: how a type is said."""
    base = builtin_base(kind) if number_bounds(kind) else (get_origin(kind) or kind)
    items = get_args(kind)
    if base is tuple and items and Ellipsis not in items:  # tuple[float, float]: so many items
        return f"list of {len(items)} {' and '.join(dict.fromkeys(kind_name(item) for item in items))}s"
    return "list" if base in (list, tuple, Sequence, Iterable) else getattr(base, "__name__", str(base))


def alternatives(hint: Any) -> list[Any]:
    """The members of a union (nested unions flattened); a type that is no union, alone."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        return [member for arg in get_args(hint) for member in alternatives(arg)]
    return [hint]


def builtin_base(kind: type) -> type:
    """int for jsonargparse's PositiveInt, ...: the built-in type a restricted number extends."""
    return next(base for base in kind.__mro__ if base.__module__ == "builtins")


def parses_as(base: type, text: str) -> bool:
    try:
        base(text)
    except (TypeError, ValueError):
        return False
    return True
