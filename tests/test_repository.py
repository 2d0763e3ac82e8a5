"""The repository's own files: `.gitignore` hides outputs (runs/, data/, checkpoints), never a source file of the
package, its tests, fixtures or benchmarks (a bare `data/` pattern would hide the diffusion/data/ package); the
installed distribution holds the diffusion package alone."""

import ast
import fnmatch
import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gitignore_hides_no_source_file_and_every_output():
    sources = [str(path.relative_to(REPO)) for folder in ("diffusion", "tests", "configs") for path in
               (REPO / folder).rglob("*") if path.is_file() and "__pycache__" not in path.parts]  # fmt: skip
    # The benchmarks' scripts in their parts (benchmarks/speed/, quality/, gpu/), not their runs (benchmarks/runs/).
    sources += [str(path.relative_to(REPO)) for path in (REPO / "benchmarks").rglob("*")
                if path.suffix in {".py", ".sh", ".md"} and "runs" not in path.relative_to(REPO).parts]  # fmt: skip
    outputs = ["runs/digits/version_0/config.yaml", "data/cifar-10-python.tar.gz", "samples/samples.npz",
               "benchmarks/runs/x.log", "last.ckpt"]  # fmt: skip
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"], input="\n".join(sources + outputs), cwd=REPO,
        capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    assert sorted(ignored) == sorted(outputs)


def test_the_distribution_installs_the_diffusion_package_alone():
    # benchmarks/ is a package too (its parts import each other by package path): pyproject's package discovery
    # (setuptools matches each package's dotted name against the include patterns) must leave it out.
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "include"
    ]
    packages = sorted(folder.name for folder in REPO.iterdir() if (folder / "__init__.py").is_file())
    assert "benchmarks" in packages
    installed = [name for name in packages if any(fnmatch.fnmatchcase(name, pattern) for pattern in include)]
    assert installed == ["diffusion"]


def range_checks_worded_by_hand(source: str) -> list[str]:
    """The `raise ValueError(...)`s (or UserError) of a module whose message states a parameter's range in words,
    `name=value must be ...` or `name must be ..., got value`: the shape `OutOfRange` gives, written by hand, which
    no command can say of its flag."""
    found = []
    for node in ast.walk(ast.parse(source)):
        call = node.exc if isinstance(node, ast.Raise) else None
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") in {"ValueError", "UserError"}:
            text = ast.get_source_segment(source, call) or ""
            if re.search(r'f"\w+=\{[^}]+\} must be |f"\w+ must be [^"]*, got \{', text):
                found.append(text.splitlines()[0].strip())
    return found


def test_every_range_check_raises_out_of_range():
    by_hand = {str(path.relative_to(REPO)): range_checks_worded_by_hand(path.read_text())
               for path in (REPO / "diffusion").rglob("*.py")}  # fmt: skip
    assert {path: found for path, found in by_hand.items() if found} == {}
    # The check itself sees both wordings.
    assert len(range_checks_worded_by_hand(
        'raise ValueError(f"lr={lr} must be > 0")\nraise ValueError(f"dim must be >= 1, got {dim}")\n'
    )) == 2  # fmt: skip
