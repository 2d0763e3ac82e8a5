"""The training step never waits on the device: between logging steps a step launches no collective and reads
nothing back to the host, on one device and under DDP (two gloo processes), in 32-bit, bf16-mixed and 16-mixed
with a GradScaler, with gradient clipping on; collectives and reads happen at the logging steps, where the logged
train/loss is the mean over the logging interval and the ranks.

`helpers.step_costs.StepCosts` counts, per batch, the Python-level collectives (torch.distributed) and host reads
(Tensor.item/tolist/cpu/bool/float/...) from the batch's start to the next batch's start, Lightning's own work
included. On a CPU every tensor is a host tensor, so this counts every read that would make a GPU's host wait.
On CUDA (skipped here) `torch.cuda.set_sync_debug_mode("error")` checks the same steps for any sync at all.

Data: 48 `gaussian` vectors (D = 4), no validation, a global batch of 8: one epoch of 6 optimizer steps, logging
every 3, so steps 3 and 6 are logging steps, 6 also the last, and 1, 2, 4, 5 are steady-state steps.
"""

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers import TINY_MLP
from helpers.ddp import run_in_session

from diffusion.cli.train import main

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
MAX_STEPS, LOG_EVERY = 6, 3
STEADY_STEPS = [1, 2, 4, 5]

BASE = [
    "--config", str(REPO / "configs" / "toy2d.yaml"), *TINY_MLP, "--model.network.init_args.dropout", "0",
    "--seed_everything", "0", "--data.init_args.dataset", "gaussian", "--data.init_args.dim", "4",
    "--data.init_args.num_samples", "48", "--data.init_args.val_fraction", "0",
    "--max_steps", str(MAX_STEPS), "--model.warmup_steps", "1", "--trainer.log_every_n_steps", str(LOG_EVERY),
    "--trainer.gradient_clip_val", "0.01",  # small: the gradients are clipped at every step
    "--trainer.enable_progress_bar", "true", "--trainer.enable_model_summary", "false",
]  # fmt: skip
# 16-mixed on a CPU: Lightning's own flag would run bf16-mixed there, without a scaler; its plugin given
# directly keeps fp16 autocast and a GradScaler, the path CUDA takes.
FP16_WITH_SCALER = [
    "--trainer.precision", "null", "--trainer.plugins",
    json.dumps({"class_path": "lightning.pytorch.plugins.MixedPrecision",
                "init_args": {"precision": "16-mixed", "device": "cpu"}}),
]  # fmt: skip
PRECISIONS = {
    "32": ["--precision", "32"],
    "bf16-mixed": ["--precision", "bf16-mixed"],
    "16-mixed": FP16_WITH_SCALER,
}
ONE_PROCESS = ["--devices", "1", "--accelerator", "cpu", "--data.init_args.batch_size", "8"]
TWO_PROCESSES = [
    "--devices",
    "2",
    "--strategy",
    "ddp",
    "--accelerator",
    "cpu",
    "--data.init_args.batch_size",
    "4",
]


def run_args(save_dir: Path, precision: str, *extra: str) -> list[str]:
    costs = {"class_path": "helpers.step_costs.StepCosts", "init_args": {"out_dir": str(save_dir / "record")}}
    logger = ["--trainer.logger.init_args.save_dir", str(save_dir), "--trainer.logger.init_args.name", "run"]
    return [*BASE, *PRECISIONS[precision], *logger, "--trainer.callbacks=" + json.dumps([costs]), *extra]


def two_processes(save_dir: Path, precision: str, timeout: float = 240) -> Path:
    """`train.py ... --devices 2 --strategy ddp`, both ranks warm in a process group of their own (helpers/warm.py),
    which must succeed; returns save_dir."""
    save_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, str(REPO / "train.py"), *run_args(save_dir, precision, *TWO_PROCESSES)]
    code, output = run_in_session(cmd, save_dir, env, timeout, warm=True, ranks=2)
    assert code == 0, output[-4000:]
    return save_dir


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    """The three two-process runs' folders, two runs at a time (a launch mostly waits for imports)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {p: pool.submit(two_processes, tmp_path_factory.mktemp(p), p) for p in PRECISIONS}
        yield {p: future.result() for p, future in futures.items()}


def records(save_dir: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted((save_dir / "record").glob("costs_rank*.json"))]


def logged_train_loss(save_dir: Path) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(save_dir / "run" / "version_0"))
    events.Reload()
    return [e.value for e in sorted(events.Scalars("train/loss"), key=lambda e: e.step)]


def check_costs_and_logged_loss(save_dir: Path, world_size: int) -> None:
    ranks = records(save_dir)
    assert len(ranks) == world_size
    for record in ranks:
        batches = {batch["step"]: batch for batch in record["batches"]}
        assert sorted(batches) == list(range(1, MAX_STEPS + 1))  # one batch per optimizer step
        for step in STEADY_STEPS:
            assert batches[step]["collectives"] == [] and batches[step]["reads"] == [], (step, batches[step])
        # At a logging step: under DDP the preemption poll and the loss, one all-reduce each; the instrument
        # does see collectives and reads.
        expected = ["all_reduce", "all_reduce"] if world_size > 1 else []
        assert batches[LOG_EVERY]["collectives"] == expected, batches[LOG_EVERY]
        assert batches[LOG_EVERY]["reads"], batches[LOG_EVERY]
    # The logged loss: the mean over the logging interval's steps and over the ranks.
    losses = torch.tensor(
        [[batch["loss"] for batch in record["batches"]] for record in ranks]
    )  # (ranks, steps)
    if world_size > 1:
        assert (losses[0] - losses[1]).abs().min() > 1e-4  # the ranks' losses differ: the mean is not trivial
    interval_means = losses.mean(dim=0).reshape(-1, LOG_EVERY).mean(dim=1).tolist()
    logged = logged_train_loss(save_dir)
    assert logged == pytest.approx(interval_means, abs=1e-6)
    assert ranks[0]["progress_bar_loss"] == pytest.approx(logged[-1], abs=1e-6)


@pytest.mark.multiprocess
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_under_ddp_steps_between_logging_steps_launch_no_collective_and_read_nothing(ddp_runs, precision):
    check_costs_and_logged_loss(ddp_runs[precision], world_size=2)


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_on_one_device_steps_between_logging_steps_read_nothing(tmp_path, precision):
    main(run_args(tmp_path, precision, *ONE_PROCESS))
    check_costs_and_logged_loss(tmp_path, world_size=1)


@pytest.mark.parametrize("precision", ["32", "16-mixed"])
def test_the_compiled_training_step_reads_nothing_either(tmp_path, precision, graphs_handed_to_the_backend):
    main(run_args(tmp_path, precision, *ONE_PROCESS, "--model.compile_training", "true"))
    assert len(graphs_handed_to_the_backend) == 1  # the steps ran the training graph
    check_costs_and_logged_loss(tmp_path, world_size=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compile", ["false", "true"])  # true: Inductor's graph replayed as CUDA graphs
@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "16-mixed"])
def test_on_cuda_steady_state_steps_do_not_synchronize(tmp_path, precision, compile):
    """Every steady-state batch runs under torch.cuda.set_sync_debug_mode("error"): a sync there ends the run."""
    on_cuda = ["--devices", "1", "--accelerator", "gpu", "--data.init_args.batch_size", "8"]
    precision_flags = ["--precision", precision]  # Lightning's own 16-mixed: fp16 with a GradScaler on CUDA
    check = "--trainer.callbacks=" + json.dumps([{"class_path": "helpers.step_costs.NoSyncOnCuda"}])
    main([*BASE, *precision_flags, "--trainer.logger.init_args.save_dir", str(tmp_path), *on_cuda, check,
          "--model.compile_training", compile])  # fmt: skip
