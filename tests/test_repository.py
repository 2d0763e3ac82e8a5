"""The repository's own files: `.gitignore` hides outputs (runs/, data/, checkpoints), never a source file of the
package, its tests or fixtures (a bare `data/` pattern would hide the diffusion/data/ package)."""

import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gitignore_hides_no_source_file_and_every_output():
    sources = [str(path.relative_to(REPO)) for folder in ("diffusion", "tests", "configs") for path in
               (REPO / folder).rglob("*") if path.is_file() and "__pycache__" not in path.parts]  # fmt: skip
    outputs = ["runs/digits/version_0/config.yaml", "data/cifar-10-python.tar.gz", "samples/samples.npz",
               "benchmarks/runs/x.log", "last.ckpt"]  # fmt: skip
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"], input="\n".join(sources + outputs), cwd=REPO,
        capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    assert sorted(ignored) == sorted(outputs)


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
