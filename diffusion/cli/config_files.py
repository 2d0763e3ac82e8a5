"""A config file as the commands read it (`--config FILE`, a group's `--model FILE`, a file named in another): its
YAML read once per version of the file, a key given twice refused (YAML would keep the last without a word), its
own shape said (missing, a folder, not YAML, empty, a list or a single value where options go), and a path written
in it found beside it.
"""

import functools
import re
from collections.abc import Collection, Hashable
from pathlib import Path
from typing import Any

import yaml


def as_text(value: Any) -> str:
    """A YAML value as a flag would give it: `abc`, `[1, 2]`, `{lr: 0.1}`, `true`."""
    if isinstance(value, str):
        return value
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
    return text.removesuffix("...").strip()


def beside(config_file: str | None, path: str) -> str:
    """A relative path written in a config file, as the parser reads it: from that file's folder (not from the
    working directory); a path given as a flag (`config_file` None), or an absolute one, as written."""
    if config_file is None or Path(path).is_absolute():
        return path
    return str(Path(config_file).parent / path)


# Flags a command line takes that no config file may hold: jsonargparse acts on them while it reads the command line.
COMMAND_LINE_ONLY = ("print_config", "help")


def command_line_only(file: str, key: str, value: Any) -> tuple[str, str] | None:
    """(what is wrong, fix) for `print_config: true` or `help: true` in a config file (jsonargparse's words named
    neither the file nor the flag); None for any other key."""
    if key not in COMMAND_LINE_ONLY:
        return None
    flag = f"--{key}={value}" if key == "print_config" and isinstance(value, str) else f"--{key}"  # skip_null
    return (
        f"{file}: {key} is a flag of the command line, not an option of a config file",
        f"remove the line, and pass {flag} on the command line",
    )


# The file Lightning writes into a run folder, beside the run's config.yaml: the module's arguments, with Python tags.
LIGHTNING_HPARAMS = "hparams.yaml"


def config_file_problem(
    key: str, value: str, shown: str | None = None, command_options: Collection[str] | None = None
) -> tuple[str, str] | None:
    """(what is wrong, fix) with the file a config flag names, as a whole: missing, not YAML, a run's
    hparams.yaml, a Python object, empty, or a list or a single value where a mapping of options goes; None when
    it is a mapping. `shown`: how the line says the option (default `--key value`); `command_options`: the command's
    (how it takes a run instead of its hparams.yaml: `_run_instead`)."""
    path = Path(value)
    shown = shown or f"--{key} {value}"
    if path.is_dir():
        return (
            f"{shown} is a folder, not a config file",
            "pass a YAML file of these options (see --print_config)",
        )
    if not path.is_file():
        missing = f"--config: {value}" if shown == f"--config {value}" else shown
        return f"{missing}: no such config file", "pass a YAML file of these options (see --print_config)"
    options = read_config_file(value)
    if isinstance(options, OctalNumber):
        return f"{shown}: {options.msg}", "write it without the leading zero (in quotes, for text)"
    if isinstance(options, KeyGivenTwice):
        return f"{shown}: {options.msg}", "keep one of them (YAML would take the last without a word)"
    if isinstance(options, NotText):
        return (
            f"{shown}: the config file is not text (a checkpoint, an image, ...?)",
            "pass a YAML file of these options (see --print_config)",
        )
    if isinstance(options, PythonObject):
        if path.name == LIGHTNING_HPARAMS:
            return (
                f"{shown} is Lightning's record of a run's module arguments ({LIGHTNING_HPARAMS}), not a config file",
                _run_instead(path.parent, command_options),
            )
        return (
            f"{shown}: {options.msg}, which a config file cannot hold",
            "write the value as plain YAML (a list in brackets for a tuple)",
        )
    if isinstance(options, SyntaxError):
        return f"Problems parsing config {value}: {options.msg}", f"fix the YAML syntax of the --{key} file"
    if options is None:
        return (
            f"{shown}: the config file is empty",
            "write its options as key: value lines (see --print_config)",
        )
    if not isinstance(options, dict):
        kind = "a list" if isinstance(options, list) else f"a single value ({as_text(options)})"
        return (
            f"{shown}: the config file holds {kind}, not options",
            "write its options as key: value lines (see --print_config)",
        )
    return None


def _run_instead(run: Path, options: Collection[str] | None) -> str:
    """How a command whose `options` are these takes the run whose hparams.yaml was given as a config file: phema
    its folder, sample and export its checkpoint, train.py and prepare its config.yaml (and so by default)."""
    if options is not None and "run" in options:
        return f"pass the run folder as --run {run}"
    if options is not None and "ckpt" in options:
        return f"pass a checkpoint of the run as --ckpt {run / 'checkpoints' / 'last.ckpt'}"
    if options is None or "ckpt_path" in options:
        return f"pass the run's config.yaml beside it: --config {run / 'config.yaml'}"
    return "pass a YAML file of this command's options (see --print_config)"  # evaluate: no run to read


def read_config_file(value: str) -> Any:
    """A config file's YAML (a SyntaxError saying where it is not YAML), read once per version of the file: a
    report looks each chosen class up in it (10 ms of PyYAML a read, a dozen reads a report). None: no such file."""
    path = Path(value)
    if not path.is_file():
        return None
    stat = path.stat()
    return _read_version(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


class KeyGivenTwice(SyntaxError):
    """A config file giving one key twice in a mapping, which YAML reads as the last, silently."""


class NotText(SyntaxError):
    """A config file that is no text at all (a checkpoint given as --config)."""


class PythonObject(SyntaxError):
    """A value tagged as a Python object (`!!python/tuple`, as Lightning writes hparams.yaml), which safe YAML and
    the parser do not read."""


class OctalNumber(SyntaxError):
    """An int written with a leading zero (`max_steps: 0100`), which YAML 1.1 reads as octal (64), silently."""


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping, and an int with a leading zero."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        value = super().construct_yaml_int(node)
        written = str(node.value).replace("_", "")
        if re.fullmatch(r"[-+]?0[0-9]+", written) and value != int(written, 10):  # 007 is 7 either way
            raise OctalNumber(
                f"{node.value} at line {node.start_mark.line + 1} is an octal number to YAML ({value}), not "
                f"{int(written, 10)}"
            )
        return value

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            if isinstance(key, Hashable) and key in lines:
                raise KeyGivenTwice(f"{key} is given twice (lines {lines[key]} and {line})")
            if isinstance(key, Hashable):
                lines[key] = line
        return super().construct_mapping(node, deep)


_UniqueKeys.add_constructor("tag:yaml.org,2002:int", _UniqueKeys.construct_yaml_int)


@functools.lru_cache(maxsize=16)
def _read_version(path: str, mtime_ns: int, size: int) -> Any:
    try:
        return yaml.load(Path(path).read_text(), Loader=_UniqueKeys)
    except UnicodeDecodeError:  # a checkpoint, an image, random bytes
        return NotText("the file is not text")
    except (KeyGivenTwice, OctalNumber) as error:
        return error
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        tag = re.search(r"tag:yaml\.org,2002:(python/\S+?)'", str(getattr(error, "problem", None)))
        if tag:  # `!!python/tuple`: not wrong YAML, a Python object
            return PythonObject(f"line {where.line + 1 if where else '?'} holds a Python object (!!{tag[1]})")
        return SyntaxError(f"{getattr(error, 'problem', None) or type(error).__name__}{at}")


def yaml_or_none(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None
