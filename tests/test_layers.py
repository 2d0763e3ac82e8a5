"""The package's folders are its layers: a module imports only from its own layer or the layers below it, never
up, also inside functions; and no modules import each other in a circle, within a layer either.

Layers, bottom to top (`diffusion/__init__.py` draws the same picture): errors -> core -> models -> data ->
generation and metrics -> training -> cli -> the entry points (`python -m diffusion.sample`, `... evaluate`, `... export`).

benchmarks/ is a package in parts (benchmarks/__init__.py): its shared modules (provenance, arguments) import no part,
speed/ and quality/ do not import each other, gpu/ may import both and nothing imports gpu/; no circle; every import
by package path.
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


# ---- benchmarks/: a package in parts --------------------------------------------------------------------------
BENCHMARKS = PACKAGE.parent / "benchmarks"
# The shared modules at benchmarks/'s top level (provenance's results line, the scripts' flags) and the parts. A part
# imports the shared modules and itself; gpu/ also runs speed's and quality's work on the GPU; nothing imports gpu/.
PARTS = ("speed", "quality", "gpu")
MAY_IMPORT = {
    "shared": {"shared"},
    "speed": {"shared", "speed"},
    "quality": {"shared", "quality"},
    "gpu": {"shared", "speed", "quality", "gpu"},
}


def benchmark_module(path: Path) -> str:
    """benchmarks/quality/metrics_lib.py -> benchmarks.quality.metrics_lib (a package's __init__: the package)."""
    parts = path.relative_to(BENCHMARKS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


BENCHMARK_FILES = {benchmark_module(path): path for path in sorted(BENCHMARKS.rglob("*.py"))}
BENCHMARK_STEMS = {path.stem for path in BENCHMARK_FILES.values()} - {"__init__"}


def part_of(module: str) -> str:
    """benchmarks.speed.speed_data -> speed; benchmarks.provenance (and benchmarks itself) -> shared."""
    names = module.split(".")
    return names[1] if len(names) > 1 and names[1] in PARTS else "shared"


def benchmark_imports(files: dict[str, Path] = BENCHMARK_FILES) -> dict[str, set[str]]:
    """Which benchmark modules each benchmark module imports, by package path (`from benchmarks.speed import
    speed_data` counts as benchmarks.speed.speed_data), at the top or inside functions."""
    imports = {}
    for module, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    candidate = f"{node.module}.{alias.name}"
                    found.add(candidate if candidate in BENCHMARK_FILES else node.module)
        imports[module] = {name for name in found if name in BENCHMARK_FILES and name != module}
    return imports


def imports_by_file_name(files: dict[str, Path] = BENCHMARK_FILES) -> list[str]:
    """`import provenance`, `from metrics_lib import ...`: a benchmark imported by its bare file name resolves only
    with its own folder on sys.path (the flat layout before the parts), and the part checks, which read package
    paths, would not see it."""
    found = []
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            found += [f"{module} imports {name}" for name in names if name.split(".")[0] in BENCHMARK_STEMS]
    return found


def crossed_parts(imports: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} ({part_of(module)}) imports {target} ({part_of(target)})"
        for module, targets in sorted(imports.items())
        for target in sorted(targets)
        if part_of(target) not in MAY_IMPORT[part_of(module)]
    ]


BENCHMARK_IMPORTS = benchmark_imports()


def test_the_benchmarks_import_each_other_in_no_circle():
    imports = BENCHMARK_IMPORTS
    # The scripts' imports are seen, inside functions too: the check reads what it should.
    assert imports["benchmarks.quality.quality"] >= {
        "benchmarks.quality.quality_conditional",
        "benchmarks.quality.train_run",
        "benchmarks.provenance",
    }
    assert "benchmarks.speed.speed_data" in imports["benchmarks.speed.speed"]
    assert "benchmarks.quality.quality" not in imports["benchmarks.quality.quality_conditional"]
    assert import_cycle(imports) is None


def test_the_benchmark_parts_import_only_what_they_may():
    """The shared modules import no part, speed and quality not each other, and nothing imports gpu."""
    assert crossed_parts(BENCHMARK_IMPORTS) == []


def test_the_benchmarks_import_each_other_by_package_path():
    assert imports_by_file_name() == []


def test_every_benchmark_part_is_a_package():
    assert {f"benchmarks.{part}" for part in PARTS} | {"benchmarks"} <= BENCHMARK_FILES.keys()
    assert {part_of(module) for module in BENCHMARK_FILES} == {"shared", *PARTS}


def test_the_benchmark_checks_see_a_crossing_a_circle_and_a_bare_name(tmp_path):
    # What the tests above would report, had provenance.py (shared) and speed_paths.py these lines.
    shared = tmp_path / "provenance.py"
    shared.write_text("def f():\n    from benchmarks.speed import speed_report\n")
    speed = tmp_path / "speed_paths.py"
    speed.write_text(
        "from benchmarks.quality.metrics_lib import frechet_distance\nimport benchmarks.gpu.gpu_report\n"
    )
    bare = tmp_path / "vectors.py"
    bare.write_text("from metrics_lib import sliced_wasserstein\n")
    seen = benchmark_imports({"benchmarks.provenance": shared, "benchmarks.speed.speed_paths": speed})
    assert seen == {
        "benchmarks.provenance": {"benchmarks.speed.speed_report"},
        "benchmarks.speed.speed_paths": {"benchmarks.quality.metrics_lib", "benchmarks.gpu.gpu_report"},
    }
    assert crossed_parts(seen) == [
        "benchmarks.provenance (shared) imports benchmarks.speed.speed_report (speed)",
        "benchmarks.speed.speed_paths (speed) imports benchmarks.gpu.gpu_report (gpu)",
        "benchmarks.speed.speed_paths (speed) imports benchmarks.quality.metrics_lib (quality)",
    ]
    # speed_report imports provenance: with provenance importing speed_report, a circle.
    cycle = import_cycle({**BENCHMARK_IMPORTS, **seen})
    assert cycle is not None and cycle[0] == cycle[-1] and "benchmarks.provenance" in cycle
    assert imports_by_file_name({"benchmarks.quality.vectors": bare}) == [
        "benchmarks.quality.vectors imports metrics_lib"
    ]
