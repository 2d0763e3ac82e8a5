"""Shared fixtures: tiny runs made through the real CLI, so tests exercise what users run."""

import sys
from pathlib import Path

import pytest
from helpers import QUICK, TINY_MLP, tiny_run

from diffusion.cli import main


@pytest.fixture(autouse=True)
def _run_in_a_temporary_folder(tmp_path, monkeypatch):
    """Runs that fall back to the working directory (no logger: ./checkpoints, ./samples) stay out of the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True, scope="session")
def _no_pytest_argv():
    """LightningCLI warns when given args while sys.argv holds pytest's own; tests pass args explicitly."""
    saved, sys.argv[1:] = sys.argv[1:], []
    yield
    sys.argv[1:] = saved


@pytest.fixture(scope="session")
def digits_checkpoint(tmp_path_factory) -> Path:
    """last.ckpt of a tiny digits run made with the default recipe (configs/digits.yaml)."""
    save_dir = tmp_path_factory.mktemp("runs")
    tiny_run(save_dir)
    return save_dir / "digits" / "version_0" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="session")
def toy2d_checkpoint(tmp_path_factory) -> Path:
    """last.ckpt of a tiny toy 2-D run (configs/toy2d.yaml)."""
    save_dir = tmp_path_factory.mktemp("runs")
    config = str(Path(__file__).parents[1] / "configs" / "toy2d.yaml")
    main(["--config", config, *TINY_MLP, *QUICK, "--trainer.logger.init_args.save_dir", str(save_dir),
          "--data.init_args.num_samples", "256"])  # fmt: skip
    return save_dir / "toy2d" / "version_0" / "checkpoints" / "last.ckpt"
