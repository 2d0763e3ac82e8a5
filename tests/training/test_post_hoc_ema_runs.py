"""Post-hoc EMA in whole `train.py` runs: a run killed with SIGKILL and resumed ends with the post-hoc profiles
and snapshots of the run left alone (the snapshots the killed run wrote stay valid), and under DDP only rank 0
writes snapshots.

The runs are tests/training/test_resume.py's (gaussian vectors, a tiny MLP with dropout, 8 steps, killed at
step 4 right after its checkpoint) with --ema.post_hoc true and a snapshot every 2 steps.
"""

import json
import signal
from pathlib import Path

import pytest
import torch
from test_resume import (
    KILL_STEP,
    MAX_STEPS,
    ONE_PROCESS,
    TOLERANCE,
    TWO_PROCESSES,
    args,
    checkpoints,
    kill_at,
    launch,
)

from diffusion.cli.train import main
from diffusion.training.post_hoc_ema import find_snapshots, read_weights

# A wide profile too: in 8 steps the default ones (0.05, 0.10) put almost no weight on the steps before a kill.
SIGMA_RELS = [0.1, 0.25]
POST_HOC = ["--ema.post_hoc", "true", "--ema.snapshot_every", "2", "--ema.sigma_rels", json.dumps(SIGMA_RELS)]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def run_folder(save_dir: Path) -> Path:
    return save_dir / "run" / "version_0"


def profiles(checkpoint: dict) -> list[dict[str, torch.Tensor]]:
    state = checkpoint["callbacks"]["EMA"]["post_hoc"]
    assert state["sigma_rels"] == SIGMA_RELS
    return state["profiles"]


def max_abs_diff(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> float:
    assert x.keys() == y.keys() and x
    return max((x[k] - y[k]).abs().max().item() for k in x)


def snapshot_weights(save_dir: Path) -> dict[tuple[int, float], dict[str, torch.Tensor]]:
    return {
        (s.step, s.sigma_rel): read_weights(s) for s in find_snapshots(run_folder(save_dir) / "post_hoc_ema")
    }


def test_a_run_killed_mid_epoch_resumes_to_the_post_hoc_ema_of_the_run_left_alone(tmp_path):
    left_alone = tmp_path / "left_alone"
    main(args(left_alone, *ONE_PROCESS, *POST_HOC))
    killed = launch(tmp_path / "killed", *ONE_PROCESS, *POST_HOC, kill_at(KILL_STEP))
    assert killed.returncode == -signal.SIGKILL, killed.output[-4000:]
    last = checkpoints(tmp_path / "killed") / "last.ckpt"
    killed_at = load(last)
    assert killed_at["global_step"] == KILL_STEP
    before_resume = snapshot_weights(tmp_path / "killed")
    assert sorted(before_resume) == [(step, s) for step in (2, 4) for s in SIGMA_RELS]
    main(args(tmp_path / "killed", *ONE_PROCESS, *POST_HOC, "--ckpt_path", str(last)))

    expected, resumed = (load(checkpoints(tmp_path / run) / "last.ckpt") for run in ("left_alone", "killed"))
    assert resumed["global_step"] == expected["global_step"] == MAX_STEPS
    for mine, theirs, before in zip(profiles(resumed), profiles(expected), profiles(killed_at), strict=True):
        assert max_abs_diff(mine, theirs) <= TOLERANCE
        assert max_abs_diff(before, theirs) > 100 * TOLERANCE  # the steps after the kill moved them
    reference = snapshot_weights(left_alone)
    assert sorted(reference) == [(step, s) for step in (2, 4, 6, 8) for s in SIGMA_RELS]
    snapshots = snapshot_weights(tmp_path / "killed")
    assert snapshots.keys() == reference.keys()
    for key, weights in reference.items():
        assert max_abs_diff(snapshots[key], weights) <= TOLERANCE, key
        if key in before_resume:  # written before the kill, and still the run's
            assert max_abs_diff(before_resume[key], weights) <= TOLERANCE, key


@pytest.mark.multiprocess
def test_under_ddp_only_rank_0_writes_snapshots(tmp_path):
    record, watched = tmp_path / "record", run_folder(tmp_path) / "post_hoc_ema"
    audit = {
        "class_path": "helpers.guarantees.Audit",
        "init_args": {"out_dir": str(record), "watch_dir": str(watched)},
    }
    run = launch(tmp_path, *TWO_PROCESSES, *POST_HOC, "--trainer.callbacks=" + json.dumps([audit]), ranks=2)
    assert run.returncode == 0, run.output[-4000:]
    writes = [json.loads((record / f"audit_rank{rank}.json").read_text())["writes"] for rank in (0, 1)]
    # Each snapshot: opened as a hidden temporary file, renamed to its name.
    written = {Path(path).name for path in writes[0] if not Path(path).name.startswith(".")}
    assert len(writes[0]) == 2 * len(written)
    assert written == {s.path.name for s in find_snapshots(watched)} and len(written) == 8, writes[0]
    assert writes[1] == []
    checkpoint = load(checkpoints(tmp_path) / "last.ckpt")
    # Both ranks track the same profiles of the same synced weights; rank 0's are in the checkpoint.
    for profile, snapshot in zip(profiles(checkpoint), SIGMA_RELS, strict=True):
        assert max_abs_diff(profile, snapshot_weights(tmp_path)[MAX_STEPS, snapshot]) == 0
