"""Flags are named in one place: below diffusion/cli/ no string spells a command's flag (`--data.batch_size`,
`--steps`); a check there names its option by class and parameter (`{--batch_size}` in a UserError of that class,
`{DiffusionModule:--variance}` where the layer cannot import the class, an OutOfRange's `name`), and the commands
alone turn them into flag text (diffusion/cli/flag_names.py). Docstrings and comments may mention flags: people
read them, no command prints them."""

import ast
import re
from pathlib import Path

from diffusion.cli.flag_names import flag_text
from diffusion.cli.reporting import one_line
from diffusion.data import ImageDataModule
from diffusion.errors import COMMAND, UserError

PACKAGE = Path(__file__).resolve().parents[1] / "diffusion"
# A flag as a command line spells it; `{--name}` and `{Owner:--name}` are placeholders, said by the commands.
FLAG = re.compile(r"(?<![\w{:-])--[A-Za-z][\w.-]*")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def flag_literals(source: str) -> list[tuple[int, str]]:
    """(line, flag) of every flag spelled in a string constant of `source` (parts of f-strings too)."""
    tree = ast.parse(source)
    skipped = docstrings(tree)
    return [
        (node.lineno, flag)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped
        for flag in FLAG.findall(node.value)
    ]


def test_no_flag_is_spelled_below_the_commands():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE.parent))
        if PACKAGE / "cli" in path.parents:
            continue
        found += [f"{name}:{line}: {flag}" for line, flag in flag_literals(path.read_text())]
    assert not found, (
        "flags spelled below diffusion/cli/ (name the option by owner and parameter):\n" + "\n".join(found)
    )


def test_the_scan_finds_a_flag_but_no_placeholder_or_docstring():
    source = (
        '"""Docs may say --data.batch_size."""\n'
        'FIX = "pass {--batch_size} 1, or {DiffusionModule:--lr} 1e-4"\n'
        'X = f"{n} --steps {n}"\n'
    )
    assert flag_literals(source) == [(3, "--steps")]


def test_an_option_is_its_parameter_in_python_and_its_flag_in_a_command():
    error = UserError(
        "{--image_size} 4 is too small", "pass {DiffusionModule:--lr} or {command:--out}", ImageDataModule
    )
    assert str(error) == "image_size 4 is too small — pass lr or --out"
    assert one_line(error) == "--data.image_size 4 is too small — pass --model.lr or --out"
    assert flag_text(COMMAND, "out") == "--out" and flag_text("Trainer", "precision") == "--precision"
    assert flag_text("Trainer", "gradient_clip_val") == "--trainer.gradient_clip_val"
