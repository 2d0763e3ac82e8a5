"""jsonargparse's private structure is read in one module, diffusion/cli/jsonargparse_internals.py, and it holds.

A minor jsonargparse release may rename anything private. The repository is read with `ast`: no other module,
tests and benchmarks included, imports a private jsonargparse module (`jsonargparse._actions`) or reads a private
attribute of jsonargparse's or argparse's (`parser._actions`, `action._typehint`, `getattr(kind, "_restrictions")`,
a class name such as `"_ActionConfigLoad"` compared as text). Then the adapter's answers are checked on the
jsonargparse installed: .ci/run runs this module with the oldest jsonargparse pyproject admits too.
"""

import argparse
import ast
import functools
from pathlib import Path
from typing import Literal

import jsonargparse
import pytest
from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser
from jsonargparse.typing import PositiveInt, restricted_number_type

from diffusion.cli import jsonargparse_internals
from diffusion.cli.jsonargparse_internals import (
    action_of,
    actions,
    declared_type,
    drop_print_config_request,
    is_jsonargparse_own,
    is_required,
    loads_a_group_file,
    number_bounds,
)

REPO = Path(__file__).parents[2]
ADAPTER = Path(jsonargparse_internals.__file__).resolve()
ACCESSORS = ("getattr", "hasattr", "setattr", "delattr")
# jsonargparse's internal attributes whose names are not private: kept on its objects all the same.
INTERNAL_PUBLIC_NAMES = {"print_config"}
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}  # public, underscored so as not to meet a field


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names_defined(files: list[Path], by_name: bool = False) -> set[str]:
    """Private names these files define: functions, classes, module names, `self._x` attributes (`by_name`: and
    any private name written as a string, an attribute set by name)."""
    names = set()
    for path in files:
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif (
                by_name
                and isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.isidentifier()
            ):
                names.add(node.value)  # an attribute set by name: type(name, bases, {"_restrictions": ...})
    return {name for name in names if is_private(name)}


def project_files() -> list[Path]:
    return sorted(
        path.resolve()
        for folder in ("diffusion", "tests", "benchmarks")
        for path in (REPO / folder).rglob("*.py")
        if path.resolve() != ADAPTER
    ) + [REPO / "train.py"]


@functools.cache
def library_private_names() -> frozenset[str]:
    """What jsonargparse and argparse keep private, less the names this project defines for itself."""
    library = [*Path(jsonargparse.__file__).parent.rglob("*.py"), Path(argparse.__file__)]
    defined_here = private_names_defined(project_files()) | NAMEDTUPLE_API
    return frozenset(private_names_defined(library, by_name=True) - defined_here)


def internals_used(path: Path, private: frozenset[str]) -> list[str]:
    """Where `path` reaches into jsonargparse's or argparse's internals: `line: what`."""
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jsonargparse._"):
            found.append(f"{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}" for a in node.names if a.name.startswith("jsonargparse._")
            ]
        elif isinstance(node, ast.Attribute) and node.attr in private:
            found.append(f"{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Call) and getattr(node.func, "id", None) in ACCESSORS and len(node.args) > 1
        ):
            name = node.args[1]
            if isinstance(name, ast.Constant) and name.value in private | INTERNAL_PUBLIC_NAMES:
                found.append(f"{node.lineno}: {node.func.id}(..., {name.value!r})")
        elif isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Constant) and side.value in private
            for side in [node.left, *node.comparators]
        ):
            found.append(f"{node.lineno}: a private name compared as text")
    return found


def test_only_the_adapter_reaches_into_jsonargparse():
    private = library_private_names()
    assert {"_actions", "_typehint", "_restrictions", "_ActionConfigLoad"} <= private
    used = {
        str(path.relative_to(REPO)): found
        for path in project_files()
        if (found := internals_used(path, private))
    }
    assert not used, f"use diffusion/cli/jsonargparse_internals.py instead: {used}"


SNEAKY = {
    "private module": "from jsonargparse._actions import _ActionConfigLoad\n",
    "private module imported whole": "import jsonargparse._typehints\n",
    "private attribute": "def f(parser):\n    return parser._option_string_actions\n",
    "private attribute by name": "def f(action):\n    return getattr(action, '_typehint', None)\n",
    "a class name as text": "def f(action):\n    return type(action).__name__ == '_ActionConfigLoad'\n",
    "an internal attribute": "def f(parser):\n    return hasattr(parser, 'print_config')\n",
}


@pytest.mark.parametrize("source", SNEAKY.values(), ids=SNEAKY.keys())
def test_the_check_sees_each_way_of_reaching_in(source, tmp_path):
    path = tmp_path / "module.py"
    path.write_text(source)
    assert internals_used(path, library_private_names())


# ---- the adapter's answers on the jsonargparse installed --------------------------------------------------------
class Options:
    def __init__(self, lr: float = 0.1) -> None:
        pass


def test_the_adapter_reads_what_the_commands_need():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--count", type=PositiveInt, default=1)
    parser.add_argument("--mode", type=Literal["a", "b"] | None, default=None)
    parser.add_argument("--flag", action=ActionYesNo, default=False)
    parser.add_argument("--names", type=Literal["x", "y"], nargs="+", default=None)
    parser.add_class_arguments(Options, "options")
    parser.link_arguments("count", "options.lr")
    assert {"count", "mode", "flag", "names", "options.lr"} <= {action.dest for action in actions(parser)}
    assert declared_type(action_of(parser, "count")) is PositiveInt
    assert declared_type(action_of(parser, "mode")) == Literal["a", "b"] | None
    assert declared_type(action_of(parser, "flag")) is bool
    assert (
        declared_type(action_of(parser, "names")) == Literal["x", "y"]
        and action_of(parser, "names").nargs == "+"
    )
    assert action_of(parser, "nope") is None
    assert loads_a_group_file(action_of(parser, "options")) and not loads_a_group_file(
        action_of(parser, "count")
    )
    assert is_jsonargparse_own(action_of(parser, "options.lr"))  # a link's target
    assert not is_jsonargparse_own(action_of(parser, "mode"))
    assert number_bounds(PositiveInt) == [(">", 0)]
    assert number_bounds(restricted_number_type("Between", float, [(">=", 0.5), ("<", 2)])) == [
        (">=", 0.5),
        ("<", 2),
    ]
    assert number_bounds(int) is None and number_bounds(Literal["a"]) is None
    parser.add_argument("--out", type=str, required=True)
    assert is_required(parser, action_of(parser, "out")) and not is_required(
        parser, action_of(parser, "mode")
    )


def test_a_print_config_request_left_behind_is_dropped(capsys):
    """A parse that met --print_config and failed after leaves the request on the parser: dropped, the parser's
    next parse prints nothing."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)  # which brings --print_config
    parser.add_argument("--count", type=PositiveInt, default=1)
    parser.add_argument("--out", type=str, required=True)
    with pytest.raises(SystemExit):  # jsonargparse prints before it checks the required flag
        parser.parse_args(["--print_config"])
    with pytest.raises(jsonargparse.ArgumentError):
        parser.parse_args(["--print_config", "--count", "0"])
    capsys.readouterr()
    drop_print_config_request(parser)
    assert parser.parse_args(["--out", "o"]).out == "o" and capsys.readouterr().out == ""
