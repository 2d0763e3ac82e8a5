"""Shared fixtures: tiny runs made through the real CLI, so tests exercise what users run."""

import sys
from pathlib import Path

import pytest

from diffusion.cli import main

# A UNet of ~40k parameters and a few steps: seconds on a CPU, but the whole pipeline (config, data,
# Trainer, EMA, checkpointing, sample grid) runs as it does for users.
TINY_UNET = [
    "--model.network.init_args.channels", "8",
    "--model.network.init_args.channel_mult", "[1, 2]",
    "--model.network.init_args.num_res_blocks", "1",
    "--model.network.init_args.attention_levels", "[1]",
]  # fmt: skip
TINY_MLP = ["--model.network.init_args.hidden_dim", "32", "--model.network.init_args.num_blocks", "2"]
QUICK = [
    "--max_steps", "4",
    "--trainer.val_check_interval", "2",
    "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
    "--sample_grid.num_samples", "4",
    "--sample_grid.steps", "3",
    "--model.warmup_steps", "1",
]  # fmt: skip


@pytest.fixture(autouse=True, scope="session")
def _no_pytest_argv():
    """LightningCLI warns when given args while sys.argv holds pytest's own; tests pass args explicitly."""
    saved, sys.argv[1:] = sys.argv[1:], []
    yield
    sys.argv[1:] = saved


def tiny_run(save_dir: Path, *extra: str):
    """Train a tiny digits model into save_dir/<name>/version_N and return the CLI object."""
    return main([*TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", str(save_dir), *extra])


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
