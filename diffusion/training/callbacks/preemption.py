"""Preemption and interrupts: SIGTERM, SIGUSR1 or SIGINT (Ctrl+C) saves a checkpoint of the current step and ends the run with a non-zero exit;
checkpoints by wall time between validations.

Lightning's own path is not used for the save: its SIGTERM handler runs a collective inside the signal handler
(which can pair with another rank's gradient all-reduce), its loops then raise `SIGTERMException` with exit
status 0 (a scheduler takes the run as finished), possibly in the middle of a validation, with the EMA weights
swapped in; under SLURM, its SIGUSR1 handler saves from inside the handler, mid-step. Here the handler only
notes the signal (and passes it on to the ranks Lightning launched); `Checkpoint.on_train_batch_end` polls
after an optimizer step and, if any rank was signalled, every rank saves there, in the same state as any step
checkpoint, so resuming continues exactly. Then `Preempted(128 + signal)`, a `SIGTERMException`, ends the run
(143 for SIGTERM, 138 for SIGUSR1, 130 for SIGINT, as a shell reports a process killed by the signal); under
SLURM with auto-requeue, rank 0 first requeues the job, as Lightning does. A second SIGINT during the step stops at
once, without saving (`StoppedUnsaved`, an `Interrupted` whose line says which steps are lost): a step that never
ends can still be stopped from the keyboard. During the save itself (`Preemption.saving`, short) the second SIGINT
only says that the save finishes first; a third stops at once. SIGINT is not passed on to the launched ranks: a
terminal's Ctrl+C reaches each of them already, and one that did not hear it learns of it when the ranks poll.

When it polls: one process after every optimizer step, so it saves the step the signal arrived in (its flags
are host values: the poll costs nothing). Under DDP the ranks must agree, which takes an all-reduce and a read
of its result, and a read makes the host wait for the device's queue to drain (see
`diffusion.training.logging_steps`): so the ranks poll at the logging steps (every `log_every_n_steps`) and at
the run's last step, and save the first of those at or after the step the signal arrived in, at most
`log_every_n_steps - 1` steps later. Lightning's own per-batch SIGTERM broadcast under DDP (a collective and an
`.item()` before every batch, `_TrainingEpochLoop._broadcast_sigterm_tensor`) is switched off while these
handlers are in place: its flag could only change in its own handler, which they replace.
"""

import contextlib
import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from types import FrameType

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException

from diffusion.errors import Interrupted, OutOfRange, check_real
from diffusion.training.logging_steps import is_logging_step

log = logging.getLogger(__name__)

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
UNLOGGED_POLL_EVERY_N_STEPS = 10  # under DDP with log_every_n_steps=0 (no logging steps)


class Preempted(SIGTERMException):
    """The run stopped for a preemption signal, exiting with `exit_status` (128 + the signal's number).

    A `SIGTERMException`, so Lightning's loops and `on_exception` hooks treat it as theirs, with an `__init__` of
    its own: Lightning's unreleased master drops the argument of `SIGTERMException.__init__`, where
    `SIGTERMException(143)` would become a TypeError.
    """

    def __init__(self, exit_status: int) -> None:
        SystemExit.__init__(self, exit_status)


class StoppedUnsaved(Interrupted):
    """Training stopped by Ctrl+C again before the checkpoint the first one asked for was saved: `problem` and
    `fix` say what was lost and what to do (flags as `{command:--name}`), for the command's one line."""

    def __init__(self, signum: int, problem: str, fix: str) -> None:
        super().__init__(signum)
        self.problem, self.fix = problem, fix


class Preemption:
    """Notes SIGTERM / SIGUSR1 / SIGINT from `install` (at train start) until Lightning restores the handlers it found
    (trainer teardown), and tells every rank at once whether to save and stop, or to save because
    `every_n_minutes` of wall time passed on rank 0."""

    def __init__(self, every_n_minutes: float | None) -> None:
        fix = "pass minutes > 0, or null for no timed checkpoints"
        # NaN passed `<= 0` and inf never came: timed checkpoints silently never written.
        if (
            every_n_minutes is not None
            and not 0 < check_real("every_n_minutes", every_n_minutes, fix) < math.inf
        ):
            raise OutOfRange("every_n_minutes", every_n_minutes, "> 0 and finite", fix)
        self.every_n_minutes = every_n_minutes
        self.signal: int | None = None  # the first preemption signal received
        self._trainer: L.Trainer | None = None
        self._last_save = time.monotonic()
        self._start_step = 0  # the step training started (or resumed) from
        self.last_saved_step: int | None = None  # the step of the last checkpoint saved in this run
        self.checkpoints: str | None = None  # the folder the checkpoints go to (for the line)
        self._saving: int | None = None  # the step whose checkpoint is being saved
        self._deferred = False  # a second SIGINT came during that save

    def install(self, trainer: L.Trainer) -> None:
        """Take over SIGTERM, SIGUSR1 and SIGINT (called after Lightning registered its handlers, which it restores)."""
        self._trainer = trainer
        self._last_save = time.monotonic()
        self._start_step = trainer.global_step
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for signum in PREEMPTION_SIGNALS:
            signal.signal(signum, self._note)
        # An instance attribute over the loop's method (`uninstall` removes it). After a SIGTERM that came before
        # training, Lightning's handler set its flag: its broadcast is left to stop every rank.
        if not trainer.received_sigterm:
            trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = _no_broadcast  # type: ignore[method-assign]

    def uninstall(self, trainer: L.Trainer) -> None:
        """Give Lightning's loop its per-batch SIGTERM broadcast back (Lightning restores the handlers itself)."""
        vars(trainer.fit_loop.epoch_loop).pop("_broadcast_sigterm_tensor", None)

    @contextlib.contextmanager
    def saving(self, step: int) -> Iterator[None]:
        """Around a checkpoint's save: a second Ctrl+C waits for it (a third stops at once), and once it is
        written, `last_saved_step` is `step`."""
        outer = self._saving is not None
        self._saving = step
        try:
            yield
            self.last_saved_step = step
        finally:
            if not outer:
                self._saving = None

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.signal is not None:  # Ctrl+C again
            if self._saving is not None and not self._deferred:
                self._deferred = True
                self._say(
                    f"SIGINT again: the checkpoint of step {self._saving} is being saved and the run stops once it "
                    "is written (Ctrl+C once more stops at once, without it)"
                )
                return
            raise self.stopped_unsaved()
        first = self.signal is None
        self.signal = self.signal or signum
        if first and signum == signal.SIGINT:
            self._say(
                "SIGINT received: the run saves a checkpoint at the end of this step, then stops (Ctrl+C again "
                "stops at once, without it)"
            )
        launcher = getattr(self._trainer.strategy, "launcher", None) if self._trainer else None
        if first and signum != signal.SIGINT and launcher is not None and getattr(launcher, "procs", None):
            launcher.kill(signum)  # the ranks this process started (python train.py --devices N)

    def _say(self, line: str) -> None:
        """A line on stderr from the signal handler (os.write: print could be inside a write already), rank 0's."""
        if self._trainer is None or self._trainer.is_global_zero:
            with contextlib.suppress(OSError):
                os.write(2, f"\n{line}\n".encode())

    def stopped_unsaved(self) -> Interrupted:
        """The Interrupted that stops the run at once, saying what the stop loses."""
        step = self._trainer.global_step if self._trainer is not None else None
        if step is not None and self.last_saved_step == step and self._saving is None:
            return StoppedUnsaved(
                signal.SIGINT,
                f"stopped by SIGINT again, after the checkpoint of step {step} was saved",
                "resume with {command:--ckpt_path} last",
            )
        where = (
            f"in step {step}"
            if self._saving is None
            else f"during the save of step {self._saving}'s checkpoint"
        )
        since = self.resumable_step
        keep = "to keep the steps, press Ctrl+C once and wait for the checkpoint"
        if since == 0:
            folder = f" ({self.checkpoints} holds none)" if self.checkpoints else ""
            return StoppedUnsaved(
                signal.SIGINT,
                f"stopped by SIGINT again {where}: no checkpoint of this run was saved{folder}, "
                "so every step is lost",
                f"run the command again (it trains from the start, in a new run folder); {keep}",
            )
        return StoppedUnsaved(
            signal.SIGINT,
            f"stopped by SIGINT again {where}: the steps since the checkpoint of step {since} are lost",
            f"resume with {{command:--ckpt_path}} last (step {since}); {keep}",
        )

    @property
    def resumable_step(self) -> int:
        """The step of the checkpoint a resume of this run starts from: the last one it saved, or the one it resumed
        from; 0 when there is none (nothing to resume)."""
        return max(self._start_step, self.last_saved_step or 0)

    def saved(self) -> None:
        self._last_save = time.monotonic()

    @staticmethod
    def polls_after(trainer: L.Trainer, last_step: bool) -> bool:
        """Whether to poll after the optimizer step just taken: always in one process; under DDP at the logging
        steps and the run's last step (`last_step`), the same steps on every rank."""
        if trainer.world_size == 1 or last_step or is_logging_step(trainer, trainer.global_step):
            return True
        return trainer.log_every_n_steps == 0  # type: ignore[attr-defined]  # set by Lightning's logger connector and trainer.global_step % UNLOGGED_POLL_EVERY_N_STEPS == 0

    def poll(self, trainer: L.Trainer) -> tuple[int | None, bool]:
        """(signal to stop for or None, whether a timed checkpoint is due), the same on every rank.

        A collective under DDP: every rank calls it after the same optimizer steps (`polls_after`)."""
        due = (
            self.every_n_minutes is not None
            and time.monotonic() - self._last_save >= 60 * self.every_n_minutes
        )
        flags = [self.signal or 0, int(due and trainer.is_global_zero)]  # rank 0's clock decides the time
        if trainer.world_size > 1:
            reduced = torch.tensor(flags, device=trainer.strategy.root_device)
            dist.all_reduce(reduced, op=dist.ReduceOp.MAX)  # without the barrier of Lightning's reduce
            flags = [int(value) for value in reduced.tolist()]
        return flags[0] or None, bool(flags[1])


def _no_broadcast() -> None:
    """Stands in for Lightning's per-batch SIGTERM broadcast (see the module's docstring)."""


def requeue_slurm_job(trainer: L.Trainer, signum: int) -> None:
    """On rank 0 under SLURM with auto-requeue (Lightning's default there): `scontrol requeue` the job after
    its requeue signal (SIGUSR1 unless configured otherwise), as Lightning's own handler would."""
    environment = trainer._accelerator_connector.cluster_environment
    if not (
        trainer.is_global_zero
        and isinstance(environment, SLURMEnvironment)
        and environment.auto_requeue
        and signum == environment.requeue_signal
    ):
        return
    job_id = os.environ["SLURM_JOB_ID"]
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        job_id = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    with contextlib.suppress(OSError):
        result = subprocess.call(["scontrol", "requeue", job_id])
        log.warning(f"requeued SLURM job {job_id}" if result == 0 else f"scontrol requeue {job_id}: {result}")
