"""Data held on the device in real runs, random flips on: a run killed with SIGKILL mid-epoch and resumed ends with
the weights of the run left alone, and a two-process run (killed and resumed too) trains each rank on the per-item
loader's samples, labels and unflipped images, flipped by (seed, epoch, index) alone.

Killed runs are `train.py` subprocesses in a session of their own (`helpers.ddp.KillAt`); the one-process
reference and resume run in-process through the same CLI. Data: the digits, conditional, 180 of them training (a
validation fraction of 0.9, not validated on), batch 64: an epoch is 2 steps of whole global batches and 52 samples
sit out each; 5 steps cover 3 epochs, and the kill at step 3 is in the middle of the second.
"""

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import TINY_UNET, tiny_run, warm
from helpers.weights import max_abs_diff, network_weights

from diffusion.cli.train import main
from diffusion.data import split
from diffusion.data.images import ImageDataModule
from diffusion.data.on_device import megabytes, random_flips

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
MAX_STEPS, KILL_STEP, SEED = 5, 3, 0
DATA = ["--data.init_args.val_fraction", "0.9", "--data.init_args.random_flip", "true"]
BASE = [
    *TINY_UNET, "--seed_everything", str(SEED), *DATA, "--data.init_args.conditional", "true",
    "--max_steps", str(MAX_STEPS), "--trainer.limit_val_batches", "0", "--model.warmup_steps", "1",
    "--model.lr_schedule", "constant", "--accelerator", "cpu",
    "--checkpoint.every_n_train_steps", "1", "--checkpoint.save_top_k", "-1",
    "--sample_grid.num_samples", "4", "--sample_grid.sampling.steps", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
ONE_PROCESS = ["--devices", "1", "--data.init_args.batch_size", "64"]
TWO_PROCESSES = ["--devices", "2", "--strategy", "ddp", "--data.init_args.batch_size", "32"]
TOLERANCE = 1e-6  # as tests/training/test_resume.py: float32 rounding at worst


class BatchRecorder(L.Callback):
    """Saves every training batch this rank trains on, as training_step got it, to
    <out_dir>/rank<r>_step<global step>.pt, at once (a killed run keeps what it recorded)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        record = {"epoch": trainer.current_epoch, "x": batch.x, "index": batch.index, "label": batch.label}
        torch.save(record, self.out_dir / f"rank{trainer.global_rank}_step{trainer.global_step}.pt")


def args(save_dir: Path, *extra: str) -> list[str]:
    logger = ["--trainer.logger.init_args.save_dir", str(save_dir), "--trainer.logger.init_args.name", "run"]
    return [*BASE, *logger, *extra]


def callbacks(*specs: tuple[str, dict]) -> str:
    return "--trainer.callbacks=" + json.dumps([{"class_path": c, "init_args": a} for c, a in specs])


def launch(
    save_dir: Path, *extra: str, threads: int | None = None, timeout: float = 240, ranks: int = 1
) -> tuple[int, str]:
    """`python train.py ...` in a session of its own (KillAt kills that session's processes); `threads`: OpenMP
    threads per process (None: torch's default, as the in-process runs it is compared with); `ranks`: its DDP ranks,
    each started warm (helpers/warm.py), in one process group."""
    save_dir.mkdir(parents=True, exist_ok=True)
    environment = {
        k: v for k, v in os.environ.items() if k not in ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE")
    }
    paths = [
        str(TESTS),
        str(TESTS / "training"),
        environment.get("PYTHONPATH"),
    ]  # helpers, this file's callback
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    if threads is not None:
        environment["OMP_NUM_THREADS"] = str(threads)
    process = warm.popen(
        [sys.executable, str(REPO / "train.py"), *args(save_dir, *extra)], cwd=save_dir, env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, ranks=ranks,
    )  # fmt: skip
    try:
        output = process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"train.py still running after {timeout} s:\n{process.communicate()[0][-4000:]}")
    return process.returncode, output


def kill_at(step: int) -> tuple[str, dict]:
    return "helpers.ddp.KillAt", {"step": step}


def checkpoint(save_dir: Path, name: str) -> dict:
    return torch.load(
        save_dir / "run" / "version_0" / "checkpoints" / name, map_location="cpu", weights_only=True
    )


def test_a_run_killed_mid_epoch_with_flips_resumes_to_the_weights_of_the_run_left_alone(tmp_path):
    returncode, output = launch(tmp_path / "killed", *ONE_PROCESS, callbacks(kill_at(KILL_STEP)))
    assert returncode == -signal.SIGKILL, output[-4000:]
    assert "training data: held on cpu (474.4 kB float32), batched there, flips per sample" in output
    killed_at = checkpoint(tmp_path / "killed", "last.ckpt")
    assert killed_at["global_step"] == KILL_STEP
    assert killed_at["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["position"] == 64  # mid-epoch
    main(args(tmp_path / "killed", *ONE_PROCESS, "--ckpt_path", "last"))
    main(args(tmp_path / "left_alone", *ONE_PROCESS))
    resumed = network_weights(checkpoint(tmp_path / "killed", "last.ckpt"))
    for kind, weights in network_weights(checkpoint(tmp_path / "left_alone", "last.ckpt")).items():
        assert max_abs_diff(resumed[kind], weights) <= TOLERANCE, kind
        assert max_abs_diff(network_weights(killed_at)[kind], weights) > 100 * TOLERANCE, kind


@pytest.mark.multiprocess
def test_two_processes_killed_and_resumed_train_on_the_loaders_samples_flipped_by_seed_epoch_and_index(
    tmp_path, monkeypatch
):
    record = tmp_path / "record"
    recorder = ("test_data_on_device_runs.BatchRecorder", {"out_dir": str(record)})
    returncode, output = launch(
        tmp_path, *TWO_PROCESSES, callbacks(recorder, kill_at(KILL_STEP)), threads=1, ranks=2
    )
    assert returncode == -signal.SIGKILL, output[-4000:]
    returncode, output = launch(
        tmp_path, *TWO_PROCESSES, callbacks(recorder), "--ckpt_path", "last", threads=1, ranks=2
    )
    assert returncode == 0, output[-4000:]
    # What each rank should see: the per-item loader's batches (no flips) for a DDP rank of 2, in each epoch...
    loader = ImageDataModule("digits", val_fraction=0.9, batch_size=32, conditional=True, on_device=False)
    monkeypatch.setenv("PL_GLOBAL_SEED", str(SEED))  # the sampler's seed, as seed_everything sets it
    for rank in (0, 1):
        loader.trainer = SimpleNamespace(world_size=2, global_rank=rank, accumulate_grad_batches=1)
        expected = []
        for epoch in range(3):
            epoch_loader = loader.train_dataloader()
            epoch_loader.sampler.set_epoch(epoch)
            expected += [(epoch, batch) for batch in epoch_loader]
        for step, (epoch, batch) in enumerate(expected[:MAX_STEPS]):
            seen = torch.load(record / f"rank{rank}_step{step}.pt", weights_only=True)
            assert seen["epoch"] == epoch and torch.equal(seen["index"], batch.index), (rank, step)
            assert torch.equal(seen["label"], batch.label)
            # ...flipped by (seed, epoch, index): the same whether the run was resumed before it or not.
            flipped = random_flips(batch.index, epoch, SEED)[:, None, None, None]
            assert torch.equal(seen["x"], torch.where(flipped, batch.x.flip(-1), batch.x)), (rank, step)


@pytest.mark.parametrize(
    ("extra", "fits", "path"),
    [
        ([], True, "held on cpu (460.0 kB float32), batched there"),
        (["--data.init_args.on_device", "false"], True, "per-item DataLoader, 0 worker processes (on_device=False)"),
        ([], False, "per-item DataLoader, 0 worker processes (its 460.0 kB would not fit)"),
    ],
    ids=["held", "turned off", "too big"],
)  # fmt: skip
def test_a_run_says_in_one_line_which_data_path_it_takes(tmp_path, monkeypatch, caplog, extra, fits, path):
    if not fits:
        monkeypatch.setattr(
            split, "room_for", lambda nbytes, device: f"its {megabytes(nbytes)} would not fit"
        )
    with caplog.at_level(logging.INFO):
        cli = tiny_run(tmp_path, "--max_steps", "1", "--trainer.limit_val_batches", "1", *extra)
    lines = [line for record in caplog.records for line in record.getMessage().splitlines()]
    assert [
        line for line in lines if any(word in line for word in ("training data", "not fit", "DataLoader"))
    ] == [f"training data: {path}"], lines
    assert cli.trainer.global_step == 1
