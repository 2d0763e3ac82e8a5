"""Exact resume of a streamed prepared set: a `train.py` run streaming with litdata (`--data.dataset streaming
--data.on_device false`), killed with SIGKILL mid-epoch and resumed with `--ckpt_path last`, ends on the raw and EMA
weights of the same run left alone, bit for bit: with 0 and 2 loading processes, on one process and on two (gloo).

The runs are test_resume's (its helpers: the `gaussian` vectors, 48 training samples, an epoch of 3 optimizer steps,
killed at step 4, one batch into the second epoch), on those very samples prepared once into a set.
"""

import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers.weights import max_abs_diff, network_weights
from test_resume import (
    BASE,
    KILL_STEP,
    MAX_STEPS,
    ONE_PROCESS,
    STEPS_PER_EPOCH,
    TWO_PROCESSES,
    checkpoints,
    final_checkpoint,
    kill_at,
    launch,
    load,
)

from diffusion.cli.prepare import main as prepare


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> str:
    """The runs' own data (test_resume's BASE data flags) as a prepared set."""
    data = [
        flag for i, flag in enumerate(BASE) if flag.startswith("--data.") or BASE[i - 1].startswith("--data.")
    ]
    out = tmp_path_factory.mktemp("prepared") / "gaussian"
    prepare(["--config", BASE[1], *data, "--out", str(out), "--num_workers", "1"])
    return str(out)


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers", [0, 2], ids=["in process", "2 loading processes"])
@pytest.mark.parametrize("processes", [ONE_PROCESS, TWO_PROCESSES], ids=["1 process", "2 processes"])
def test_a_streamed_run_killed_mid_epoch_resumes_to_the_weights_of_the_run_left_alone(
    tmp_path, prepared, workers, processes
):
    ranks = 2 if processes is TWO_PROCESSES else 1
    streamed = [
        *processes, "--data.init_args.dataset", "streaming", "--data.init_args.path", prepared,
        "--data.init_args.on_device", "false", "--data.init_args.num_workers", str(workers),
    ]  # fmt: skip
    with ThreadPoolExecutor(max_workers=2) as pool:
        left_alone = pool.submit(launch, tmp_path / "left_alone", *streamed, ranks=ranks)
        killed = pool.submit(launch, tmp_path / "killed", *streamed, kill_at(KILL_STEP), ranks=ranks)
        left_alone, killed = left_alone.result(), killed.result()
    assert left_alone.returncode == 0, left_alone.output[-4000:]
    assert "streamed by litdata" in left_alone.output, left_alone.output[-4000:]
    assert killed.returncode == -signal.SIGKILL, killed.output[-4000:]
    last = checkpoints(tmp_path / "killed") / "last.ckpt"
    killed_at = load(last)
    assert killed_at["global_step"] == KILL_STEP and KILL_STEP % STEPS_PER_EPOCH != 0  # mid-epoch
    resumed = launch(tmp_path / "killed", *streamed, "--ckpt_path", "last", ranks=ranks)
    assert resumed.returncode == 0, resumed.output[-4000:]
    reference = network_weights(final_checkpoint(tmp_path / "left_alone"))
    for kind, weights in network_weights(final_checkpoint(tmp_path / "killed")).items():
        assert all(torch.equal(weights[key], reference[kind][key]) for key in weights), kind
        # The steps after the kill moved the weights: equality is not for free.
        before = network_weights(killed_at)[kind]
        assert any(not torch.equal(before[key], reference[kind][key]) for key in before), kind


@pytest.mark.multiprocess
def test_a_prepared_set_held_on_the_device_trains_two_processes_to_the_weights_of_one(tmp_path, prepared):
    """Every rank holds the whole set (data/streaming.py read_part): litdata gave each rank only its share to read,
    and the other rows of the held set were unwritten memory, trained on (found by a NaN validation in CI)."""
    held = [
        "--data.init_args.dataset", "streaming", "--data.init_args.path", prepared,
        "--data.init_args.on_device", "true", "--model.noise_mode", "per_sample",
        "--model.network.init_args.dropout", "0",  # dropout masks are drawn per rank
    ]  # fmt: skip
    with ThreadPoolExecutor(max_workers=2) as pool:
        one = pool.submit(launch, tmp_path / "one", *ONE_PROCESS, *held)
        two = pool.submit(launch, tmp_path / "two", *TWO_PROCESSES, *held, ranks=2)
        one, two = one.result(), two.result()
    for run in (one, two):
        assert run.returncode == 0 and "training data: held on cpu" in run.output, run.output[-4000:]
    weights = [network_weights(final_checkpoint(tmp_path / name))["raw"] for name in ("one", "two")]
    assert final_checkpoint(tmp_path / "two")["global_step"] == MAX_STEPS
    # float32 sums in another order (a mean of 16, the mean of two means of 8) differ in the last bits only
    assert max_abs_diff(weights[0], weights[1]) <= 1e-5
