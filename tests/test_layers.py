"""The package's folders are its layers: a module imports only from its own layer or the layers below it, never
up, also inside functions; and no modules import each other in a circle, within a layer either.

Layers, bottom to top (`diffusion/__init__.py` draws the same picture): errors -> core -> models -> data ->
generation and metrics -> training -> cli -> the entry points (`python -m diffusion.sample`, `... evaluate`, `... export`).
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "diffusion"

LAYERS = [
    ["diffusion.errors"],
    ["diffusion.core"],
    ["diffusion.models"],
    ["diffusion.data"],
    ["diffusion.generation", "diffusion.metrics"],
    ["diffusion.training"],
    ["diffusion.cli"],
    ["diffusion.sample", "diffusion.evaluate", "diffusion.export", "diffusion"],
]


def layer_of(module: str) -> int:
    """The index of the layer a module belongs to: the longest layer prefix that names it or its package."""
    matches = [
        (len(prefix), index)
        for index, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if not matches:
        raise AssertionError(f"{module} is in no layer: add its folder to LAYERS (and diffusion/__init__.py)")
    return max(matches)[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every diffusion module `path` imports, at the top or inside functions (`from a import b` counts as `a.b`
    when `a.b` is a module, else as `a`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in ALL_MODULES else node.module)
    return {name for name in found if name == "diffusion" or name.startswith("diffusion.")}


ALL_MODULES = {module_name(path) for path in PACKAGE.rglob("*.py")}
IMPORTS = {module_name(path): imported_modules(path) for path in PACKAGE.rglob("*.py")}


def upward_imports(imports: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in sorted(imports.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]


def import_cycle(imports: dict[str, set[str]]) -> list[str] | None:
    """One circle of modules importing each other, or None (a package's `__init__` importing its own modules
    is not a circle: Python runs it first)."""
    edges = {
        module: {t for t in targets if t in imports and t != module and not module.startswith(t + ".")}
        for module, targets in imports.items()
    }
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(edges):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_every_module_imports_only_from_its_layer_or_below():
    assert upward_imports(IMPORTS) == []


def test_no_modules_import_each_other_in_a_circle():
    assert import_cycle(IMPORTS) is None


def test_the_checks_see_an_upward_import_inside_a_function_and_a_circle(tmp_path):
    # What the two tests above would report, had core/schedule.py this function.
    source = tmp_path / "schedule.py"
    source.write_text("def f():\n    from diffusion.training.module import DiffusionModule\n")
    assert imported_modules(source) == {"diffusion.training.module"}
    broken = {
        **IMPORTS,
        "diffusion.core.schedule": IMPORTS["diffusion.core.schedule"] | imported_modules(source),
    }
    assert upward_imports(broken) == [
        "diffusion.core.schedule (layer 1) imports diffusion.training.module (layer 5)"
    ]
    cycle = import_cycle(broken)
    assert cycle is not None and cycle[0] == cycle[-1] and "diffusion.core.schedule" in cycle


@pytest.mark.parametrize("layer", [prefix for prefixes in LAYERS for prefix in prefixes])
def test_every_layer_exists(layer):
    assert layer in ALL_MODULES, f"{layer} is listed in LAYERS but is not a module of the package"


BENCHMARKS = PACKAGE.parent / "benchmarks"


def benchmark_imports() -> dict[str, set[str]]:
    """Which of benchmarks/'s scripts each script imports (they import each other by file name), at the top or
    inside functions."""
    names = {path.stem for path in BENCHMARKS.glob("*.py")}
    imports = {}
    for path in BENCHMARKS.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
        imports[path.stem] = found & names
    return imports


def test_the_benchmarks_import_each_other_in_no_circle():
    imports = benchmark_imports()
    assert imports["quality"] >= {"quality_conditional", "train_run"}  # the scripts' imports are seen
    assert import_cycle(imports) is None
