"""The notebook runs top to bottom on an image and a vector checkpoint and draws its figures."""

import sys
from pathlib import Path

import nbformat
import pytest
from helpers import warm
from nbclient import NotebookClient

REPO_ROOT = Path(__file__).parents[2]
NOTEBOOK = REPO_ROOT / "notebooks" / "sample_from_checkpoint.ipynb"


def test_notebook_is_stored_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["digits_checkpoint", "toy2d_checkpoint"])
def test_notebook_runs_on_a_checkpoint(checkpoint, request, monkeypatch):
    # The kernel inherits this process's environment, which is how the notebook reads its settings.
    monkeypatch.setenv("CKPT", str(request.getfixturevalue(checkpoint)))
    monkeypatch.setenv("NUM_SAMPLES", "4")
    monkeypatch.setenv("STEPS", "3")
    # jupyter_client starts the kernel with sys.executable: forked warm (helpers/warm.py), the notebook is tested, not
    # a kernel's start.
    monkeypatch.setattr(sys, "executable", warm.python())
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}}
    )
    client.execute()  # raises CellExecutionError, with the failing cell's traceback, if any cell fails
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(images) >= 2, "expected the sample figure and the trajectory figure as inline PNGs"
