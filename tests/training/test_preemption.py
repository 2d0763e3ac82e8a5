"""Preemption and timed checkpoints: a run stopped by SIGTERM/SIGUSR1/SIGINT saves the step it is in, exits non-zero
and resumes exactly; timed checkpoints keep work between validations; SIGUSR1 under SLURM requeues the job.

The runs and their reference are training/test_resume.py's (same data, network and 8 steps), in-process.
"""

import json
import signal
import subprocess
from types import SimpleNamespace

import pytest
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException
from test_resume import (  # noqa: F401 (reference is a fixture)
    KILL_STEP,
    MAX_STEPS,
    ONE_PROCESS,
    args,
    assert_same_final_weights,
    checkpoints,
    final_checkpoint,
    load,
    reference,
)

from diffusion.cli.train import main
from diffusion.errors import Interrupted
from diffusion.training.callbacks.preemption import Preempted, Preemption, requeue_slurm_job


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGUSR1", "SIGINT"])
def test_a_preempted_run_saves_its_current_step_exits_non_zero_and_resumes_exactly(
    tmp_path,
    reference,  # noqa: F811 (the fixture imported above)
    signal_name,
    caplog,
):
    """The signal arrives in the middle of step 5 (`helpers.guarantees.SignalAt`, in this process as a scheduler
    would send it); no step checkpoint is due (every 100 steps), so the only checkpoint of step 5 is the
    preemption's."""
    signal_at = {
        "class_path": "helpers.guarantees.SignalAt",
        "init_args": {"step": KILL_STEP, "signal": signal_name},
    }
    preempt = ["--checkpoint.every_n_train_steps", "100", "--trainer.callbacks=" + json.dumps([signal_at])]
    handler = signal.getsignal(getattr(signal, signal_name))
    with pytest.raises(SystemExit) as exit_info:
        main(args(tmp_path, *ONE_PROCESS, *preempt))
    assert exit_info.value.code == 128 + getattr(
        signal, signal_name
    )  # not 0: a scheduler sees it was stopped
    assert signal.getsignal(getattr(signal, signal_name)) == handler  # handlers restored after fit
    last = checkpoints(tmp_path) / "last.ckpt"
    preempted_at = load(last)
    assert preempted_at["global_step"] == KILL_STEP + 1 and KILL_STEP + 1 < MAX_STEPS
    said = f"{signal_name} received: saved the checkpoint of step {KILL_STEP + 1} ({last}); resume with --ckpt_path last"
    assert said in caplog.messages, caplog.messages
    main(args(tmp_path, *ONE_PROCESS, "--ckpt_path", "last"))
    assert_same_final_weights(final_checkpoint(tmp_path), reference("fast"), preempted_at)


@pytest.mark.parametrize("every_n_minutes", [None, 1e-9], ids=["off", "due at every step"])
def test_timed_checkpoints_save_between_validations(tmp_path, every_n_minutes):
    """No validation (so no checkpoint) before the crash at step 3: only a timed checkpoint can keep the work."""
    crash = {"class_path": "helpers.ddp.FailOnRank", "init_args": {"rank": 0, "step": 3}}
    timed = [
        "--checkpoint.every_n_minutes",
        json.dumps(every_n_minutes),
        "--trainer.val_check_interval",
        "100",
    ]
    no_step_saves = ["--checkpoint.every_n_train_steps", "null", "--trainer.callbacks=" + json.dumps([crash])]
    with pytest.raises(RuntimeError, match="deliberate failure"):
        main(args(tmp_path, *ONE_PROCESS, *timed, *no_step_saves))
    saved = sorted(p.name for p in (tmp_path / "run").glob("version_*/checkpoints/*.ckpt"))
    if every_n_minutes is None:
        assert saved == []
    else:
        assert saved == ["last.ckpt"] and load(checkpoints(tmp_path) / "last.ckpt")["global_step"] == 3


def test_sigusr1_under_slurm_requeues_the_job_from_rank_0_only(monkeypatch):
    """As Lightning's auto-requeue does (there is no SLURM here: `scontrol` is recorded, not run)."""
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda command: calls.append(command) or 0)
    monkeypatch.setenv("SLURM_JOB_ID", "1234")

    def trainer(rank_zero: bool, environment) -> SimpleNamespace:
        connector = SimpleNamespace(cluster_environment=environment)
        return SimpleNamespace(is_global_zero=rank_zero, _accelerator_connector=connector)

    requeue_slurm_job(trainer(True, SLURMEnvironment()), signal.SIGUSR1)
    requeue_slurm_job(trainer(False, SLURMEnvironment()), signal.SIGUSR1)  # not rank 0
    requeue_slurm_job(
        trainer(True, SLURMEnvironment()), signal.SIGTERM
    )  # a preemption: the scheduler decides
    requeue_slurm_job(trainer(True, SLURMEnvironment(auto_requeue=False)), signal.SIGUSR1)
    requeue_slurm_job(trainer(True, None), signal.SIGUSR1)  # not under SLURM
    assert calls == [["scontrol", "requeue", "1234"]]


def test_the_preemption_exit_does_not_depend_on_lightnings_exception_arguments(monkeypatch):
    # Lightning's unreleased master takes no argument in SIGTERMException.__init__: the project's exit status
    # must not go through it.
    def takes_no_argument(self):
        SystemExit.__init__(self, 0)

    monkeypatch.setattr(SIGTERMException, "__init__", takes_no_argument)
    stopped = Preempted(128 + signal.SIGTERM)
    assert isinstance(stopped, SIGTERMException) and stopped.code == 143


def test_a_second_ctrl_c_stops_at_once_without_waiting_for_the_step():
    preemption = Preemption(every_n_minutes=None)
    preemption._note(signal.SIGINT, None)  # the first: noted, saved at the end of the step
    assert preemption.signal == signal.SIGINT
    with pytest.raises(Interrupted) as stopped:
        preemption._note(signal.SIGINT, None)
    assert stopped.value.code == 130
