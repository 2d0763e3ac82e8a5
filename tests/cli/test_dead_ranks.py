"""A rank that died is named dead, with its exit, at once, by the ranks that survive it: one line, status 1, no
traceback, within seconds (not the --ddp_timeout of 600 s the job runs with), whether the survivor was in a
collective when it happened or far from one, and whichever rank died.

`python train.py --devices 2` runs under Lightning's own launcher (rank 0 starts rank 1), as users start it, warm
(helpers/warm.py), each in a session of its own; `helpers.dying.DieAt` SIGKILLs one rank at step 2. Data:
`gaussian` vectors (D = 4), batch 8 per rank.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import two_cpu_ranks_on_vectors, warm

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"

BASE = two_cpu_ranks_on_vectors(max_steps=40, val_check_interval=20)
# The watch beats every second; the rest is a loaded machine's slack, far from the 600-s timeout.
WITHIN_S = 15


@dataclass
class Death:
    returncode: int  # rank 0's, the process started
    output: str  # both ranks'
    survivor_gone_after_s: float  # from the death to the survivor's end
    checkpoints: list[str]  # the run's checkpoint files left


def gone_after(pid: int, since: float, limit: float = 60) -> float:
    """Seconds from `since` (a time.time()) until the process `pid` has exited (or is a zombie)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return time.time() - since
        if state in ("Z", "X"):
            return time.time() - since
        time.sleep(0.05)
    return float("inf")


def die(save_dir: Path, rank: int, others_sleep: bool, saving: bool) -> Death:
    record = save_dir / "record"
    environment = {
        k: v for k, v in os.environ.items() if k not in ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE")
    }
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), environment.get("PYTHONPATH")]))
    environment["OMP_NUM_THREADS"] = "1"
    dying = {"class_path": "helpers.dying.DieAt",
             "init_args": {"out_dir": str(record), "step": 2, "rank": rank, "others_sleep": others_sleep}}  # fmt: skip
    command = [sys.executable, str(REPO / "train.py"), *BASE, "--trainer.logger.init_args.save_dir", str(save_dir),
               "--trainer.callbacks=" + json.dumps([dying]),
               # a checkpoint at every step (steps 1 and 2 saved before the death), or none before the death
               *(["--checkpoint.every_n_train_steps", "1"] if saving else [])]  # fmt: skip
    with open(save_dir / "output.txt", "w") as output:
        process = warm.popen(
            command,
            cwd=save_dir,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while not (record / f"died_rank{rank}.json").exists() and time.monotonic() < deadline:
            if process.poll() is not None:
                break
            time.sleep(0.05)
        died_at = json.loads((record / f"died_rank{rank}.json").read_text())["at"]
        survivor = json.loads((record / f"pid_rank{1 - rank}.json").read_text())["pid"]
        after = gone_after(survivor, died_at)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    saved = sorted(path.name for path in save_dir.glob("*/version_*/checkpoints/*.ckpt"))
    return Death(process.returncode, (save_dir / "output.txt").read_text(), after, saved)


@pytest.fixture(scope="module")
def deaths(tmp_path_factory):
    made = {}

    def death(rank: int, others_sleep: bool, saving: bool) -> Death:
        key = (rank, others_sleep, saving)
        if key not in made:
            made[key] = die(
                tmp_path_factory.mktemp(f"rank{rank}_{'asleep' if others_sleep else 'training'}"), *key
            )
        return made[key]

    return death


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "rank, others_sleep, saving",
    [(0, False, False), (0, True, False), (1, False, True)],
    ids=["rank 0, the other in a collective", "rank 0, the other asleep", "rank 1, rank 0 in a collective"],
)
def test_the_survivor_names_the_dead_rank_and_its_exit_in_one_line_at_once(
    deaths, rank, others_sleep, saving
):
    """...and how to go on: resume where a checkpoint was saved, run again where none was (a resume would be
    refused: tester round 6b, L9)."""
    death = deaths(rank, others_sleep, saving)
    errors = [line for line in death.output.splitlines() if "error:" in line]
    go_on = (
        "resume with --ckpt_path last"
        if saving
        else "no checkpoint was saved yet: run the command again (it trains from the start)"
    )
    assert errors == [f"error: rank {rank} died (killed by SIGKILL) — its log above says why; {go_on}"], (
        death.output[-4000:]
    )
    assert bool(death.checkpoints) == saving, death.checkpoints
    assert "Traceback" not in death.output and "stopped answering" not in death.output, death.output[-4000:]
    assert death.survivor_gone_after_s < WITHIN_S, death.output[-4000:]
    if rank == 1:  # the survivor is the process started: its own status, not a kill from Lightning's launcher
        assert death.returncode == 1, death.output[-4000:]
    else:
        assert death.returncode == -signal.SIGKILL
