"""The class a flag chose, and what is said of a class written where one goes: a class path that imports nothing,
a class of another kind, a bare name that is a choice of a class's argument (`--data digits`), a class whose
required arguments were not given. `type_fits` and `parse_errors` read a class from the words as the parser would.
"""

import inspect
from typing import Any, Literal, get_args, get_origin, get_type_hints

from jsonargparse import ArgumentParser, Namespace

from diffusion.cli.command_line import Written, alternatives
from diffusion.cli.config_files import beside, read_config_file, yaml_or_none
from diffusion.cli.jsonargparse_internals import action_of
from diffusion.cli.legacy import class_at


def imported(class_path: str) -> Any:
    """The class `class_path` names (a bare name: the package's public one), or why it imports none (a str)."""
    try:
        return class_at(class_path if "." in class_path else f"diffusion.{class_path}")
    except (ImportError, AttributeError, ValueError) as error:
        if "." not in class_path and isinstance(
            error, AttributeError
        ):  # not Python's "module 'diffusion' has..."
            return f"diffusion has no class {class_path}"
        return str(error)


_NULLS = ("null", "None", "~")
CLASS_PATH_FIX = (
    "pass the class path of a class that exists, as module.Class (see --help for the accepted classes)"
)


def class_said(shown: str, classes: list[type], value: str, only_classes: bool) -> tuple[str, str] | None:
    """A class path that imports nothing, or a class of another kind than the flag takes (of each item of a list
    of classes: `--trainer.callbacks '[{class_path: ...}]'`); None otherwise."""
    written = yaml_or_none(value) if value.lstrip().startswith(("{", "[")) else value
    for item in written if isinstance(written, list) else [written]:
        path = item.get("class_path") if isinstance(item, dict) else item
        if not isinstance(path, str) or not path:
            continue
        # a bare word where a class or a value goes is a class when one of the kinds has a class of that name
        by_name = None if "." in path or only_classes else _subclass_named(classes, path)
        if "." not in path and not only_classes and by_name is None:
            continue
        if path in _NULLS:  # no class where one is needed (an optional one takes null at parse)
            return f"{shown}: this option needs a class", CLASS_PATH_FIX
        found = by_name or imported(path)
        if isinstance(found, str) and "." not in path and (taking := _argument_choosing(classes, path)):
            # `--data digits`: a choice of the default class's argument, written where the class goes
            flag = shown.split()[0] if shown.startswith("--") else "--" + shown.split(": ", 1)[-1].split()[0]
            return (
                f"{shown}: no class is named {path}; {path} is a choice of {taking[0]}'s {taking[1]}",
                f"pass {flag}.{taking[1]} {path}, or a class path as module.Class (see --help)",
            )
        if isinstance(found, str):
            return f"{shown}: no such class ({found})", CLASS_PATH_FIX
        if isinstance(found, type) and not issubclass(found, tuple(classes)):
            kinds = " or ".join(cls.__name__ for cls in classes)
            return (
                f"{shown}: {found.__name__} is not a {kinds}",
                f"pass the class path of a {kinds} (see --help)",
            )
        if isinstance(found, type) and (required := _required_arguments(found)):
            # a class of the right kind the parser refused alone: `--model.network torch.nn.Linear` was
            # "not a valid Module"
            flag = shown.split()[0] if shown.startswith("--") else "--" + shown.split(": ", 1)[-1].split()[0]
            return (
                f"{shown}: {found.__name__} needs {', '.join(required)}, which "
                f"{'has' if len(required) == 1 else 'have'} no default",
                f"give {'it' if len(required) == 1 else 'them'} as {flag}.init_args.{required[0]} VALUE, or under "
                "init_args: in a config file",
            )
    return None


# Where the classes a flag chooses live (data modules, networks, callbacks): a schedule is a Module too, no network.
_CHOSEN_CLASSES = ("diffusion.data.", "diffusion.models.", "diffusion.training.callbacks.")


def _argument_choosing(classes: list[type], value: str) -> tuple[str, str] | None:
    """(class, argument) of a loaded class of the kinds `classes` one of whose arguments takes `value` as one of
    its choices (`ImageDataModule`'s `dataset` for `digits`); None if none does."""
    seen, kinds = set(), list(classes)
    while kinds:
        cls = kinds.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        kinds += cls.__subclasses__()
        if not cls.__module__.startswith(_CHOSEN_CLASSES):
            continue
        try:
            parameters = inspect.signature(cls, eval_str=True).parameters.values()
        except Exception:  # noqa: BLE001  # a signature Python cannot read names nothing
            continue
        for parameter in parameters:
            kinds_of = [kind for kind in alternatives(parameter.annotation) if get_origin(kind) is Literal]
            if any(value in get_args(kind) for kind in kinds_of):
                return cls.__name__, parameter.name
    return None


def _subclass_named(classes: list[type], name: str) -> type | None:
    """The loaded class of the kinds `classes` named `name` (`CSVLogger` for a Logger), as the parser finds a class
    by its bare name; None if there is none."""
    kinds, seen = list(classes), set()
    while kinds:
        cls = kinds.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        if cls.__name__ == name:
            return cls
        kinds += cls.__subclasses__()
    return None


def _required_arguments(cls: type) -> list[str]:
    """The arguments of `cls.__init__` that have no default (none for a signature Python cannot read)."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return []
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in keyword and p.default is inspect.Parameter.empty]


def default_of(parser: ArgumentParser, dest: str) -> Any:
    """The parser's default of one key (`get_defaults` builds every class's defaults to answer it)."""
    try:
        return parser.get_default(dest)
    except KeyError:  # no default (argparse's SUPPRESS)
        return None


def class_argument_hint(parser: ArgumentParser, written: list[Written], key: str) -> Any:
    """The type of an argument of the class a group flag chose: `--data.batch_size` (or
    `--data.init_args.batch_size`) from the signature of the class `--data` names (`chosen_class_path`)."""
    chosen = chosen_class(parser, written, key)
    if chosen is None:
        return None
    try:
        return get_type_hints(chosen[0].__init__).get(chosen[1])  # type: ignore[misc]  # the class's own
    except Exception:  # a forward reference the hints cannot resolve: no type to say it from
        return None


def chosen_class(parser: ArgumentParser, written: list[Written], key: str) -> tuple[type, str] | None:
    """(the class, the argument's name) of an argument of the class a group flag chose, if it imports."""
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        group, rest = ".".join(parts[:cut]), [part for part in parts[cut:] if part != "init_args"]
        if action_of(parser, group) is None:
            continue
        class_path = chosen_class_path(parser, written, group)
        cls = imported(class_path) if class_path and len(rest) == 1 else None
        return (cls, rest[0]) if isinstance(cls, type) else None
    return None


def chosen_class_path(parser: ArgumentParser, written: list[Written], group: str) -> str | None:
    """The class path `group` was given last, by a flag (`--group X`, `--group.class_path X`) or a config file's
    key, else the parser's default."""
    chosen = None
    for item in written:
        if item.key in (group, f"{group}.class_path") and item.values:
            value = item.values[-1]
            value = (
                yaml_or_none(value) if isinstance(value, str) and value.lstrip().startswith("{") else value
            )
            if isinstance(value, str) and isinstance(read_config_file(beside(item.file, value)), dict):
                continue  # a file of the class's options: its class_path, if any, is a key of its own after it
            chosen = value.get("class_path", chosen) if isinstance(value, dict) else str(value)
    if chosen is None:
        default = default_of(parser, group)
        chosen = default.get("class_path") if isinstance(default, Namespace) else None
    return chosen
