"""Distributed guarantees that survive breaking the code on purpose: the loss is a mean over the batch, only
rank 0 writes files, every rank samples its share of the grid, a rank outside any collective is ended when
rank 0 fails, a stopped rank ends the job within --ddp_timeout naming it, and SIGUSR1 under DDP saves the
current step on both ranks and exits non-zero.

Two-process runs are `train.py` subprocesses (DDP on CPU with gloo) in a session of their own, with the
test-only callbacks of tests/helpers.guarantees.py; three launches, two at a time. Data: `gaussian` vectors
(D = 4), N = 48, batch 8 per rank: an epoch is 3 optimizer steps.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import two_cpu_ranks_on_vectors, warm

from diffusion.data.batch import Batch
from diffusion.models import MLP
from diffusion.training.module import DiffusionModule

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]

BASE = two_cpu_ranks_on_vectors(max_steps=6, val_check_interval=2)


# ---- (a) the loss is the mean over the batch -------------------------------------------------------------
def test_the_training_loss_is_the_mean_over_the_batch_not_the_sum():
    """Adam and clipping hide a summed loss's scale from the weight comparisons, so look at the loss itself:
    with per-sample noise a batch of the same samples twice has the same loss (and gradient) as the batch."""
    torch.manual_seed(0)
    module = DiffusionModule(
        MLP(in_channels=4, hidden_dim=16, num_blocks=1), sample_shape=(4,), noise_mode="per_sample"
    )
    x, index = torch.randn(6, 4), torch.arange(6)

    def loss_and_gradient(repeat: int) -> tuple[torch.Tensor, torch.Tensor]:
        module.zero_grad()
        loss = module.training_step(Batch(torch.cat([x] * repeat), torch.cat([index] * repeat)), 0)
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in module.parameters()])

    loss, gradient = loss_and_gradient(1)
    noise, t = module.draw_noise_and_timesteps(x, index, step=0, per_sample=True)
    assert torch.allclose(loss, module.per_sample_loss(x, noise, t).mean())
    loss_twice, gradient_twice = loss_and_gradient(2)
    assert torch.allclose(loss_twice, loss) and torch.allclose(gradient_twice, gradient, atol=1e-7)


# ---- two-process runs ------------------------------------------------------------------------------------
@dataclass
class Launch:
    save_dir: Path
    returncode: int
    output: str
    ended_at: float  # time.time() when rank 0 had exited

    def record(self, what: str, rank: int) -> dict:
        return json.loads((self.save_dir / "record" / f"{what}_rank{rank}.json").read_text())


def callbacks(save_dir: Path, *specs: tuple[str, dict]) -> str:
    return "--trainer.callbacks=" + json.dumps(
        [{"class_path": f"helpers.guarantees.{name}", "init_args": {"out_dir": str(save_dir / "record"), **args}}
         for name, args in specs]
    )  # fmt: skip


def start(save_dir: Path, *extra: str) -> subprocess.Popen:
    """`python train.py ... --devices 2` in a session of its own, its output to save_dir/output.txt (not a pipe:
    a test waits for rank 0 alone where it must)."""
    save_dir.mkdir(parents=True, exist_ok=True)
    environment = {
        k: v for k, v in os.environ.items() if k not in ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE")
    }
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), environment.get("PYTHONPATH")]))
    environment["OMP_NUM_THREADS"] = "1"
    logger = ["--trainer.logger.init_args.save_dir", str(save_dir), "--trainer.logger.init_args.name", "run"]
    with open(save_dir / "output.txt", "w") as output:
        return warm.popen(
            [sys.executable, str(REPO / "train.py"), *BASE, *logger, *extra], cwd=save_dir, env=environment,
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def finish(process: subprocess.Popen, save_dir: Path, timeout: float = 120) -> Launch:
    """Wait for rank 0 (the process started), then end whatever is left of its session."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    ended_at = time.time()
    output = (save_dir / "output.txt").read_text()
    if process.returncode is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"train.py still running after {timeout} s:\n{output[-4000:]}")
    return Launch(save_dir, process.returncode, output, ended_at)


def gone(pid: int, within: float = 5.0) -> bool:
    """The process has exited (or is a zombie waiting to be reaped) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.2)
    return False


def cleanup(process: subprocess.Popen, pid: int | None = None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


SIGNALLED_IN = 3  # SIGUSR1 reaches rank 0 in the middle of step 3, after the validation (and grid) of step 2
# Under DDP the ranks agree to stop at logging steps (every 2 here): the save comes at step 4, the first logging
# step after the signal, less than one logging interval later.
LOG_EVERY, SAVED_AT = 2, 4


def preempted(save_dir: Path) -> Launch:
    """SIGUSR1 to rank 0 only (Lightning's launcher passes it on), with the Audit on both ranks."""
    signal_at = {"class_path": "helpers.guarantees.SignalAt",
                 "init_args": {"step": SIGNALLED_IN - 1, "signal": "SIGUSR1"}}  # fmt: skip
    audit = callbacks(save_dir, ("Audit", {"watch_dir": str(save_dir / "run")}))
    audit = audit[:-1] + ", " + json.dumps(signal_at) + "]"
    return finish(start(save_dir, audit, "--trainer.log_every_n_steps", str(LOG_EVERY)), save_dir)


def stopped(save_dir: Path) -> Launch:
    process = start(save_dir, "--ddp_timeout", "3", callbacks(save_dir, ("StopAt", {"step": 2, "rank": 1})))
    launch = finish(process, save_dir)
    pid = launch.record("pid", 1)["pid"]
    launch.output += f"\nrank 1 gone: {gone(pid)}"
    cleanup(process, pid)
    return launch


def rank_0_fails(save_dir: Path) -> Launch:
    process = start(save_dir, callbacks(save_dir, ("FailOrSleepAt", {"step": 2, "sleep_s": 120})))
    launch = finish(process, save_dir)
    pid = launch.record("pid", 1)["pid"]
    launch.output += f"\nrank 1 gone: {gone(pid)}"
    cleanup(process, pid)
    return launch


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three launches, two at a time (a launch mostly waits for imports), each made once."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(make, tmp_path_factory.mktemp(name))
            for name, make in [("preempted", preempted), ("stopped", stopped), ("rank_0_fails", rank_0_fails)]
        }
        yield {name: future.result() for name, future in futures.items()}


# ---- (b) only rank 0 writes ------------------------------------------------------------------------------
@pytest.mark.multiprocess
def test_only_rank_0_writes_checkpoints_logs_and_grids(runs):
    """Every file under the run folder is written by rank 0: with atomic renames, a rank 1 writing the same
    checkpoints would leave the same listing, so the audit hook watches what each process opens for writing."""
    run = runs["preempted"]
    written_by_rank_0 = {Path(p).name for p in run.record("audit", 0)["writes"]}
    assert any(name.startswith(".last.ckpt.") for name in written_by_rank_0), (
        written_by_rank_0
    )  # it sees writes
    assert any(name.startswith(".step=2.ckpt.") for name in written_by_rank_0), written_by_rank_0
    assert run.record("audit", 1)["writes"] == []


# ---- (d) every rank samples its share --------------------------------------------------------------------
@pytest.mark.multiprocess
def test_every_rank_samples_its_share_of_the_grid(runs):
    run = runs["preempted"]
    shares = [[i for call in run.record("audit", rank)["sampled"] for i in call] for rank in (0, 1)]
    assert shares == [[0, 2], [1, 3]], shares  # the grid of step 2: 4 samples, rank r draws r, r + 2


# ---- preemption under DDP --------------------------------------------------------------------------------
@pytest.mark.multiprocess
def test_sigusr1_under_ddp_saves_within_a_logging_interval_on_both_ranks_and_exits_non_zero(runs):
    run = runs["preempted"]
    assert run.returncode != 0, run.output[-4000:]
    assert SIGNALLED_IN < SAVED_AT < SIGNALLED_IN + LOG_EVERY
    assert f"SIGUSR1 received: saved the checkpoint of step {SAVED_AT}" in run.output
    last = torch.load(run.save_dir / "run" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == SAVED_AT  # the logging step after the signal, not the validation's (2)
    assert len(last["random_states"]) == 2  # both ranks took part in the save


# ---- (c) rank 0 fails while the other rank is outside any collective ------------------------------------
@pytest.mark.multiprocess
def test_when_rank_0_fails_the_other_rank_is_ended_even_outside_a_collective(runs):
    """Rank 1 sleeps (loading data, say) when rank 0 raises: no collective tells it, so only the kill in
    `diffusion.cli.train.fit` ends it, instead of a job that lingers for minutes."""
    run = runs["rank_0_fails"]
    assert run.returncode != 0 and "deliberate failure on rank 0 at step 2" in run.output, run.output[-4000:]
    assert run.output.endswith("rank 1 gone: True"), run.output[-4000:]


# ---- no silent hang --------------------------------------------------------------------------------------
@pytest.mark.multiprocess
def test_a_stopped_rank_ends_the_job_within_the_timeout_naming_it(runs):
    run = runs["stopped"]
    assert run.returncode != 0, run.output[-4000:]
    assert "rank 1 stopped answering: no reply within --ddp_timeout 3 s" in run.output, run.output[-4000:]
    assert run.output.endswith("rank 1 gone: True"), run.output[-4000:]
    # Ended by the 3 s timeout, not by Lightning's 30 minutes (nor this test's 120 s limit).
    assert run.ended_at - run.record("pid", 1)["stopped_at"] < 60
