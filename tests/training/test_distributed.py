"""What DDP promises and this project relies on, proved with real multi-process runs on CPU (gloo).

Two-process runs are `train.py --devices 2 --strategy ddp` processes, both ranks forked with the imports done by
helpers/warm.py and given the environment a launcher gives a rank (as torchrun or a cluster starts them; the failing
rank's run is started by Lightning's own launcher, whose watch over the ranks it tests); one-process references run
in-process through the same CLI (`diffusion.cli.train.main`). Test-only callbacks from tests/helpers.ddp.py record,
per rank, what each process saw (dataset indices, noise, losses, all-reduce calls). Runs are built once per module and shared
between the tests that read them, so the whole file costs seven DDP launches, run two at a time.

Data: `gaussian` vectors, N = 50, no validation split; every run has a global batch of 16 samples, so one
epoch is 3 optimizer steps of whole global batches (a random 2 samples sit out each epoch) whatever the split
into devices and accumulation, and 6 steps are 2 epochs: the runs go past an epoch's end where a ragged last
batch would otherwise be.
"""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import TINY_MLP, warm
from helpers.ddp import CountingVectorData

from diffusion.cli.train import DiffusionCLI, main

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
N = 50

BASE = [
    "--config", str(REPO / "configs" / "toy2d.yaml"), *TINY_MLP,
    "--model.network.init_args.dropout", "0", "--precision", "32", "--seed_everything", "0",
    "--data.class_path", "helpers.ddp.CountingVectorData",
    "--data.init_args.dataset", "gaussian", "--data.init_args.dim", "4",
    "--data.init_args.num_samples", str(N), "--data.init_args.val_fraction", "0",
    "--max_steps", "6", "--model.warmup_steps", "1", "--trainer.log_every_n_steps", "1",
    # No clipping: clipping each step's gradient to norm 1 would hide a step whose gradient is scaled (an
    # incomplete accumulation group at an epoch's end, which Lightning scales by 1/k).
    "--trainer.gradient_clip_val", "0",
    "--checkpoint.every_n_train_steps", "1", "--checkpoint.save_top_k", "-1",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
PER_SAMPLE = ["--model.noise_mode", "per_sample"]
ONE_PROCESS = ["--devices", "1", "--accelerator", "cpu"]
TWO_PROCESSES = ["--devices", "2", "--strategy", "ddp", "--accelerator", "cpu"]


def batch(per_device: int, accumulate: int = 1) -> list[str]:
    return ["--data.init_args.batch_size", str(per_device), "--accumulate_grad_batches", str(accumulate)]


def callbacks(*specs: dict) -> str:
    return "--trainer.callbacks=" + json.dumps(list(specs))


def recorder(out_dir: Path) -> dict:
    return {"class_path": "helpers.ddp.Recorder", "init_args": {"out_dir": str(out_dir)}}


@dataclass
class Run:
    save_dir: Path
    name: str
    output: str = ""
    returncode: int = 0
    seconds: float = 0.0

    @property
    def run_dir(self) -> Path:
        return self.save_dir / self.name / "version_0"

    @property
    def checkpoints(self) -> list[str]:
        return sorted(p.name for p in (self.run_dir / "checkpoints").iterdir())

    @property
    def records(self) -> list[dict]:
        """Per-rank records written by helpers.ddp.Recorder, indexed by global rank."""
        files = sorted((self.save_dir / "record").glob("rank*.json"))
        return [json.loads(f.read_text()) for f in files]

    @property
    def prepare_log(self) -> Path:
        return self.save_dir / "prepare.log"

    def raw_weights(self) -> dict[str, torch.Tensor]:
        """The network's raw weights: with EMA on (toy2d.yaml) state_dict holds the average and
        current_model_state the raw weights; without EMA, state_dict holds the raw ones."""
        checkpoint = torch.load(self.run_dir / "checkpoints" / "last.ckpt", weights_only=False)
        state = checkpoint.get("current_model_state", checkpoint["state_dict"])
        return {k: v for k, v in state.items() if k.startswith("network.")}

    def args(self, *extra: str) -> list[str]:
        return [
            *BASE, "--trainer.logger.init_args.save_dir", str(self.save_dir),
            "--trainer.logger.init_args.name", self.name,
            "--data.init_args.prepare_log", str(self.prepare_log), *extra,
        ]  # fmt: skip


def in_process(save_dir: Path, name: str, *extra: str) -> Run:
    run = Run(save_dir, name)
    main(run.args(*ONE_PROCESS, *extra))
    return run


def two_processes(save_dir: Path, name: str, *extra: str, timeout: float = 150, ranks: int = 2) -> Run:
    """`train.py ... --devices 2 --strategy ddp`: both ranks forked with the imports done (helpers/warm.py), with
    the environment a launcher gives a rank; `ranks=1`: rank 0 alone, which starts rank 1 with Lightning's own
    launcher (a fresh interpreter: the failing rank's test, which needs the launcher's watch over its ranks)."""
    run = Run(save_dir, name)
    env = {k: v for k, v in os.environ.items() if k not in ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(REPO / "train.py"), *run.args(*TWO_PROCESSES, *extra)]
    start = time.monotonic()
    # A process group of its own, so that on a timeout both ranks are killed, not only rank 0.
    process = warm.popen(
        cmd, cwd=save_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, ranks=ranks,
    )  # fmt: skip
    try:
        # Returns when every process holding the pipe (rank 0 and the rank it launched) has exited.
        run.output = process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output = process.communicate()[0]
        pytest.fail(f"{name}: still running after {timeout} s; output:\n{output[-4000:]}")
    run.seconds, run.returncode = time.monotonic() - start, process.returncode
    return run


def trained(run: Run) -> Run:
    assert run.returncode == 0, run.output[-4000:]
    return run


def ddp(name: str, *extra: str):
    """A two-process run that must succeed, with a Recorder on every rank."""
    return lambda d: trained(two_processes(d, name, *extra, callbacks(recorder(d / "record"))))


def failing_on(rank: int):
    fail = {"class_path": "helpers.ddp.FailOnRank", "init_args": {"rank": rank, "step": 2}}
    return lambda d: two_processes(d, "fail", *batch(8), callbacks(fail), timeout=120, ranks=1)


# name -> how to make it (in a fresh directory). "fast" is the default noise mode.
RUNS = {
    # Item 1: four ways to make the same 6 optimizer steps of 16 samples each, per-sample noise.
    "a": lambda d: in_process(d, "a", *PER_SAMPLE, *batch(16)),
    "b": ddp("b", *PER_SAMPLE, *batch(8)),
    "c": lambda d: in_process(d, "c", *PER_SAMPLE, *batch(8, accumulate=2)),
    "d": ddp("d", *PER_SAMPLE, *batch(4, accumulate=2)),
    # Items 2 and 4: the default fast noise, as (a) and (b); the DDP one twice, and once with another seed.
    "fast_1": lambda d: in_process(d, "fast_1", *batch(16)),
    "fast_2": ddp("fast_2", *batch(8)),
    "fast_2_again": ddp("fast_2", *batch(8)),
    "fast_2_seed_1": ddp("fast_2", *batch(8), "--seed_everything", "1"),
    # Item 3: N = 50 is not a multiple of 8 x 2; epochs end by max_epochs.
    "shards": ddp("shards", *batch(8), "--max_steps", "-1", "--max_epochs", "2"),
    # Item 6: rank 1 raises at step 2.
    "fail_on_rank_1": failing_on(1),
}


IN_PROCESS = {"a", "c", "fast_1"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs(name) -> Run, made on first use and shared by the tests of this module.

    The first request starts all the DDP runs, two at a time in the background: a launch spends most of its
    time importing in one process while the other waits, so they overlap well even on two cores.
    In-process runs stay in this thread (seed_everything and PL_GLOBAL_SEED are process-global).
    """
    made: dict[str, Run | Future] = {}
    pool = ThreadPoolExecutor(max_workers=2)

    def get(name: str) -> Run:
        for other in [name, *RUNS]:
            if other not in made and other not in IN_PROCESS:
                made[other] = pool.submit(RUNS[other], tmp_path_factory.mktemp(other))
        if name not in made:
            made[name] = RUNS[name](tmp_path_factory.mktemp(name))
        return made[name] if isinstance(made[name], Run) else made[name].result()

    yield get
    pool.shutdown(wait=True, cancel_futures=True)


def max_abs_diff(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> float:
    assert x.keys() == y.keys() and x
    return max((x[k] - y[k]).abs().max().item() for k in x)


# ---- 1. DDP == one process ----------------------------------------------------------------------------
# Float32 sums in a different order (a mean of 16 vs the mean of two means of 8, gloo's all-reduce, a sum of
# two accumulated micro-batches) make the gradients differ in the last bits, and Adam's normalisation carries
# that into the update. Measured: max|diff| ~1e-7 after 6 steps; each weight moves by ~6e-3 and the fast
# noise mode (which draws noise per rank) lands ~8e-3 away. 1e-5 sits far from both. The 6 steps cross an
# epoch's end with N = 50: without whole global batches, its ragged last step leaves them ~4e-3 apart.
TOLERANCE = 1e-5


def test_ddp_and_accumulation_give_the_weights_of_one_process_with_the_whole_batch(runs):
    weights = {name: runs(name).raw_weights() for name in "abcd"}
    for name in "abcd":
        assert runs(name).checkpoints[-1] == "step=6.ckpt"
    initial = DiffusionCLI(runs("a").args(*ONE_PROCESS, *PER_SAMPLE, "--trainer.logger", "false")).model
    start = {f"network.{k}": v for k, v in initial.network.state_dict().items()}
    assert max_abs_diff(weights["a"], start) > 1e-3  # the weights did move, far beyond the tolerance
    for name in "bcd":
        assert max_abs_diff(weights["a"], weights[name]) <= TOLERANCE, name


def test_fast_noise_mode_does_not_reproduce_one_process(runs):
    """The check above has teeth: with noise drawn per rank, one and two processes end up elsewhere."""
    diff = max_abs_diff(runs("fast_1").raw_weights(), runs("fast_2").raw_weights())
    assert diff > 100 * TOLERANCE


# ---- 2. different noise on every rank; the same seed reproduces -----------------------------------------
def test_every_rank_draws_different_noise_and_timesteps(runs):
    rank0, rank1 = runs("fast_2").records
    assert len(rank0["first_t"]) == len(rank1["first_t"]) == 8
    assert rank0["first_t"] != rank1["first_t"]
    noise0, noise1 = torch.tensor(rank0["first_noise"]), torch.tensor(rank1["first_noise"])
    assert (noise0 - noise1).abs().max() > 0.1


def test_same_seed_reproduces_a_ddp_run_and_another_seed_does_not(runs):
    first, again, other = runs("fast_2"), runs("fast_2_again"), runs("fast_2_seed_1")
    assert max_abs_diff(first.raw_weights(), again.raw_weights()) == 0.0
    assert first.records == again.records  # same shards, same noise, same losses on every rank
    assert max_abs_diff(first.raw_weights(), other.raw_weights()) > 100 * TOLERANCE
    assert first.records[0]["first_t"] != other.records[0]["first_t"]


# ---- 3. sharding ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "per_device", "accumulate"), [("shards", 8, 1), ("d", 4, 2)])
def test_each_epoch_is_split_into_disjoint_shards_of_whole_global_batches(runs, name, per_device, accumulate):
    rank0, rank1 = runs(name).records
    whole = N // 16 * 16  # whole global batches of 16: 48 of the 50 samples each epoch
    expected_batches = whole // (per_device * 2)  # micro-batches per rank, none of them ragged
    for record in (rank0, rank1):
        assert record["num_training_batches"] == expected_batches
        assert len(record["indices"]) == 2  # epochs
        assert all(len(epoch) == expected_batches for epoch in record["indices"])
        assert all(len(b) == per_device for epoch in record["indices"] for b in epoch)
    epochs = []
    for epoch0, epoch1 in zip(rank0["indices"], rank1["indices"], strict=True):
        shard0 = [i for b in epoch0 for i in b]
        shard1 = [i for b in epoch1 for i in b]
        assert len(shard0) == len(set(shard0)) == len(shard1) == whole // 2
        assert not set(shard0) & set(shard1)
        assert set(shard0) | set(shard1) <= set(range(N))
        epochs.append(set(shard0) | set(shard1))
    assert epochs[0] != epochs[1]  # reshuffled each epoch: other samples sit out


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("shards", "50 samples, 8 per device x 2 processes x 1 accumulation = global batch 16, "
                   "3 optimizer steps per epoch (a random 2 sit out each epoch: steps of whole global batches)"),
        ("d", "50 samples, 4 per device x 2 processes x 2 accumulation = global batch 16, "
              "3 optimizer steps per epoch (a random 2 sit out each epoch: steps of whole global batches)"),
    ],
)  # fmt: skip
def test_the_batch_arithmetic_is_logged_once(runs, name, line):
    assert runs(name).output.count(line) == 1, runs(name).output[-3000:]


# ---- 4. rank-zero duties --------------------------------------------------------------------------------
def test_one_checkpoint_per_save_and_one_tensorboard_file(runs):
    run = runs("fast_2")
    assert run.checkpoints == ["last.ckpt", *(f"step={s}.ckpt" for s in range(1, 7))]
    assert [p.name for p in (run.save_dir / "fast_2").iterdir()] == ["version_0"]  # no run dir from rank 1
    events = list(run.save_dir.rglob("events.out.tfevents.*"))
    assert len(events) == 1
    # The file name ends in <pid>.<n>: the writer is rank 0, the process that wrote the prepare_data line.
    rank0_pid = run.prepare_log.read_text().split()[2]
    assert events[0].name.split(".")[-2] == rank0_pid


def test_logged_train_loss_is_the_mean_over_ranks(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = runs("fast_2")
    rank0, rank1 = run.records
    means = [(x + y) / 2 for x, y in zip(rank0["losses"], rank1["losses"], strict=True)]
    assert len(means) == 6
    assert all(abs(x - y) > 1e-3 for x, y in zip(rank0["losses"], rank1["losses"], strict=True))
    assert rank0["synced_losses"] == pytest.approx(means, abs=1e-6)
    assert rank1["synced_losses"] == pytest.approx(means, abs=1e-6)
    events = EventAccumulator(str(run.run_dir))
    events.Reload()
    logged = [e.value for e in sorted(events.Scalars("train/loss"), key=lambda e: e.step)]
    assert logged == pytest.approx(means, abs=1e-6)


def test_prepare_data_runs_once_per_node(runs):
    assert CountingVectorData("unused.log").prepare_data_per_node  # Lightning's default: once per node
    lines = runs("fast_2").prepare_log.read_text().splitlines()
    assert len(lines) == 1 and lines[0].split()[:2] == ["0", "0"]  # global rank 0, local rank 0


# ---- 5. accumulation skips the all-reduce ---------------------------------------------------------------
@pytest.mark.parametrize(("name", "accumulate"), [("b", 1), ("d", 2)])
def test_gradients_are_all_reduced_once_per_optimizer_step(runs, name, accumulate):
    run = runs(name)
    for record in run.records:
        assert record["ddp"] and record["accumulate_grad_batches"] == accumulate
        micro_batches = len(record["allreduce_calls"])
        assert micro_batches == 6 * accumulate and record["global_step"] == 6
        # The tiny network fits one gradient bucket: one all-reduce per optimizer step, after the k-th
        # micro-batch; the micro-batches in between run under DDP's no_sync.
        assert record["allreduce_calls"] == [(i + 1) // accumulate for i in range(micro_batches)]
    assert run.checkpoints == ["last.ckpt", *(f"step={s}.ckpt" for s in range(1, 7))]


# ---- 6. a failing rank does not hang the others --------------------------------------------------------
def test_a_failing_rank_ends_the_whole_run(runs):
    # Rank 1 failing; rank 0 failing, with the other rank outside any collective (the harder case), is
    # test_distributed_guarantees.py's test_when_rank_0_fails_the_other_rank_is_ended_even_outside_a_collective.
    run = runs("fail_on_rank_1")
    assert run.returncode != 0
    assert "deliberate failure on rank 1 at step 2" in run.output
    assert run.seconds < 60, f"took {run.seconds:.0f} s to exit"
