"""Shared fixtures: tiny runs made through the real CLI, so tests exercise what users run."""

import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import QUICK, TINY_MLP, counting_backend, tiny_run
from lightning.pytorch.utilities import rank_zero_only
from PIL import Image

from diffusion.cli.train import main
from diffusion.core.compiling import compiling_with
from diffusion.training.loading import load_checkpoint


def pytest_configure(config):
    """Under pytest-xdist (two workers, pyproject's addopts) each worker and the processes its tests start use one
    CPU thread: two workers on two cores, each with OpenMP threads spinning on both, would stall each other."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _run_in_a_temporary_folder(tmp_path, monkeypatch):
    """Runs that fall back to the working directory (no logger: ./checkpoints, ./samples) stay out of the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _environment_restored():
    """A test's changes to os.environ end with it. Lightning's DDP in this process sets MASTER_PORT & co., and a
    later test's DDP subprocesses that inherit them all try that one port (EADDRINUSE in CI)."""
    saved = dict(os.environ)
    yield
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _signal_handlers_of_a_fresh_interpreter():
    """Each test starts and ends with a fresh interpreter's SIGINT, SIGTERM and SIGUSR1 handlers. Lightning changes
    them for good at a run's end, as a process about to exit may (after a KeyboardInterrupt in fit it ignores SIGINT;
    tearing down a process group leaves SIGINT at SIG_DFL), and a fixture of a wider scope may run such a run: a
    later test's cold subprocess inherited SIGINT ignored and slept through Ctrl-C (CI failed so, in
    tests/test_warm_launches.py). Restoring what the test found would keep a fixture's change."""

    def fresh() -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)

    fresh()
    yield
    fresh()


@pytest.fixture(autouse=True)
def _lightning_logging_left_as_found():
    """A test that leaves Lightning's loggers quieter (or rank_zero_only off rank 0) fails itself, not a later test
    that reads Lightning's INFO lines in the same worker: which test runs after which changes with xdist's
    scheduling (CI once failed that way after benchmarks/speed/speed.py quieted the loggers for good)."""

    def state():
        loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
        return [(logger.level, logger.propagate) for logger in loggers], rank_zero_only.rank

    before = state()
    yield
    assert state() == before, (
        "this test changed Lightning's logger levels or rank_zero_only.rank: restore them"
    )


@pytest.fixture
def graphs_handed_to_the_backend():
    """The project's compiles (the training graph, a sampler's evaluation: `diffusion.core.compiling`) with a
    backend that counts the graphs Dynamo hands it (`counting_backend`)."""
    graphs: list[torch.fx.GraphModule] = []
    torch._dynamo.reset()
    with compiling_with(counting_backend(graphs)):
        yield graphs
    torch._dynamo.reset()


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


@pytest.fixture(scope="module")
def user(tmp_path_factory, digits_checkpoint, toy2d_checkpoint) -> Path:
    """A user's folder: two finished runs, broken checkpoint files, bare weights, a samples folder, FID
    statistics files, a folder holding only a grid.png, a file, an image folder with one corrupt image, and two
    broken configs."""
    home = tmp_path_factory.mktemp("user")
    shutil.copytree(digits_checkpoint.parents[1], home / "runs" / "digits" / "version_0")
    shutil.copytree(toy2d_checkpoint.parents[1], home / "runs" / "toy2d" / "version_0")
    good = home / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    (home / "truncated.ckpt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (home / "empty.ckpt").write_bytes(b"")
    (home / "random.ckpt").write_bytes(np.random.default_rng(0).bytes(5000))
    torch.save(load_checkpoint(good).network.state_dict(), home / "weights.pt")
    (home / "a_file").write_text("not a folder")
    (home / "samples").mkdir()
    np.savez(home / "samples" / "samples.npz", np.zeros((4, 16, 16, 1), np.uint8))
    (
        home / "stats"
    ).mkdir()  # FID statistics (pytorch-fid's mu, sigma): of 1-channel pixel features, 3-d, ...
    np.savez(home / "stats" / "pixels.npz", mu=np.zeros(64), sigma=np.eye(64), features="pixels")
    np.savez(home / "stats" / "three_d.npz", mu=np.zeros(3), sigma=np.eye(3))
    np.savez(home / "stats" / "of_inception.npz", mu=np.zeros(3), sigma=np.eye(3), features="inception")
    np.savez(home / "stats" / "only_mu.npz", mu=np.zeros(64))
    (home / "grid_only").mkdir()
    (home / "npz_a_folder" / "samples.npz").mkdir(parents=True)  # an unzipped samples.npz, say
    (home / "grid_only" / "grid.png").write_bytes(b"a picture of the user's, not made by the sample CLI")
    (home / "images").mkdir()
    for i in range(6):
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(home / "images" / f"{i}.png")
    (home / "images" / "broken.png").write_bytes(b"definitely not a png")
    (home / "bad.yaml").write_text("trainer: [\n")
    (home / "typo.yaml").write_text("trainer:\n  max_step: 3\n")
    return home
