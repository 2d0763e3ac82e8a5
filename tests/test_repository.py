"""The repository's own files: `.gitignore` hides outputs (runs/, data/, checkpoints), never a source file of the
package, its tests or fixtures (a bare `data/` pattern would hide the diffusion/data/ package)."""

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
