"""Ctrl+C twice while training: the first asks for a checkpoint of the step it came in; a second one during that
save waits for it (the run stops once it is written, exit 130), a third stops at once. A stop that loses steps says
which, in its one line (`StoppedUnsaved`), not the generic interrupt line.

train.py runs in a subprocess of its own (signal handlers are per process). The first SIGINT comes from
`helpers.guarantees.SignalAt` in step 3, the later ones from inside the checkpoint's save (a wrapper around
`save_atomically`), so the moment is the same on every run: no sleeping, no racing.
"""

import json
import os
import signal
import sys

from helpers import warm
from helpers.user_errors import error_line
from test_resume import TESTS, args, checkpoints, load

from diffusion.errors import said
from diffusion.training.callbacks.preemption import Preemption, StoppedUnsaved

# Sends `extra` more SIGINTs from inside the first checkpoint save, then saves; then runs train.py's main on argv.
WRAPPER = """
import os, signal, sys, time
from diffusion.training import atomic_writes
extra, argv = int(sys.argv[1]), sys.argv[2:]
save = atomic_writes.save_atomically
def signalled_save(contents, path, *args, **kwargs):
    global extra
    for _ in range(extra if str(path).endswith(".ckpt") else 0):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs before the next one is sent (two pending ones would be one)
    if str(path).endswith(".ckpt"):
        extra = 0
    return save(contents, path, *args, **kwargs)
atomic_writes.save_atomically = signalled_save
from diffusion.cli.train import main
main(argv)
"""
STEP = 2  # SignalAt's: the signal arrives in step 3, whose checkpoint is the one asked for


def train_with_ctrl_c(tmp_path, extra: int):
    signal_at = {"class_path": "helpers.guarantees.SignalAt", "init_args": {"step": STEP, "signal": "SIGINT"}}
    no_other_saves = [
        "--checkpoint.every_n_train_steps", "100", "--trainer.val_check_interval", "100",
        "--trainer.callbacks=" + json.dumps([signal_at]), "--devices", "1", "--accelerator", "cpu",
    ]  # fmt: skip
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), environment.get("PYTHONPATH")]))
    return warm.run(
        [sys.executable, "-c", WRAPPER, str(extra), *args(tmp_path, *no_other_saves)],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=150,
    )  # fmt: skip


def test_a_second_ctrl_c_during_the_save_waits_for_it(tmp_path):
    process = train_with_ctrl_c(tmp_path, extra=1)
    assert process.returncode == 130, process.stderr[-3000:]
    assert load(checkpoints(tmp_path) / "last.ckpt")["global_step"] == STEP + 1
    assert "SIGINT again: the checkpoint of step 3 is being saved and the run stops once it is written" in (
        process.stderr
    )
    assert "error: stopped by SIGINT" not in process.stderr


def test_a_third_ctrl_c_stops_the_save_and_says_every_step_is_lost(tmp_path):
    process = train_with_ctrl_c(tmp_path, extra=2)
    assert process.returncode == 130, process.stderr[-3000:]
    assert not list(checkpoints(tmp_path).glob("*.ckpt"))
    assert error_line(process.stderr) == (
        f"error: stopped by SIGINT again during the save of step 3's checkpoint: no checkpoint of this run was "
        f"saved ({checkpoints(tmp_path)} holds none), so every step is lost — run the command again (it trains "
        "from the start, in a new run folder); to keep the steps, press Ctrl+C once and wait for the checkpoint"
    )


class Trainer:
    global_step, is_global_zero, strategy = 7, True, None


def test_a_second_ctrl_c_in_the_step_says_the_steps_since_the_last_checkpoint_are_lost():
    preemption = Preemption(every_n_minutes=None)
    preemption._trainer, preemption.last_saved_step = Trainer(), 4  # type: ignore[assignment]
    preemption._note(signal.SIGINT, None)  # the first: noted, saved at the end of the step
    try:
        preemption._note(signal.SIGINT, None)
        raise AssertionError("a second Ctrl+C in the step must stop at once")
    except StoppedUnsaved as stopped:
        assert stopped.code == 130
        assert f"{said(stopped.problem)} — {said(stopped.fix)}" == (
            "stopped by SIGINT again in step 7: the steps since the checkpoint of step 4 are lost — resume with "
            "--ckpt_path last (step 4); to keep the steps, press Ctrl+C once and wait for the checkpoint"
        )
