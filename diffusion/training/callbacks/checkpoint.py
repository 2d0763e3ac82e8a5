"""Checkpoints written atomically, last.ckpt always the final step, preemption and timed saves."""

import os
import signal
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

from diffusion.errors import InvalidValue, check_whole_number, options_of, said
from diffusion.training import atomic_writes as checkpoint_io
from diffusion.training.callbacks.preemption import Preempted, Preemption, requeue_slurm_job
from diffusion.training.module import VAL_LOSS


def check_checkpoint_options(options: dict[str, Any]) -> None:
    """ModelCheckpoint's own checks name no fix; these say what to pass (each option said as its caller wrote it:
    a parameter, or train.py's `--checkpoint.*` flag)."""
    save_top_k, every_n_train_steps = options.get("save_top_k", 1), options.get("every_n_train_steps")
    with options_of(Checkpoint):
        check_whole_number(
            "save_top_k", save_top_k, fix="pass an integer >= -1 (-1 keeps every checkpoint, 0 none)"
        )
        if every_n_train_steps is not None:
            check_whole_number("every_n_train_steps", every_n_train_steps, fix="pass an integer >= 0")
    if save_top_k < -1:
        raise InvalidValue(
            f"{{--save_top_k}} {save_top_k} is out of range",
            "pass an integer >= -1 (-1 keeps every checkpoint, 0 none)",
            owner=Checkpoint,
        )
    if every_n_train_steps is not None and every_n_train_steps < 0:
        raise InvalidValue(
            f"{{--every_n_train_steps}} {every_n_train_steps} is out of range",
            "pass an integer >= 0 (0: no saves by step count)",
            owner=Checkpoint,
        )
    # Lightning's refusal named its constructor, ModelCheckpoint(save_top_k=3, monitor=None), and no fix
    if isinstance(save_top_k, int) and save_top_k > 1 and options.get("monitor") is None:
        raise InvalidValue(
            f"{{--save_top_k}} {save_top_k} keeps the best {save_top_k} checkpoints by a monitored value, and no "
            "{--monitor} is given",
            f"add {{--monitor}} {VAL_LOSS} (the validation loss, lowest best), or pass {{--save_top_k}} "
            "-1 to keep every checkpoint (1: the newest)",
            owner=Checkpoint,
        )
    # Lightning refuses two of them in its own words ("should be mutually exclusive"), naming one it set itself.
    triggers = {
        name: options.get(name)
        for name in ("every_n_train_steps", "every_n_epochs", "train_time_interval")
        if options.get(name) is not None
        and (name == "train_time_interval" or (isinstance(options[name], int | float) and options[name] >= 1))
    }
    if len(triggers) > 1:
        given = " and ".join(f"{{--{name}}} {value}" for name, value in triggers.items())
        raise InvalidValue(
            f"{given} each say when to save a checkpoint, and only one may",
            "keep one of them",
            owner=Checkpoint,
        )
    if options.get("mode", "min") not in ("min", "max"):
        raise InvalidValue(
            f"{{--mode}} {options['mode']} is not min or max",
            "pass min (e.g. for val/loss) or max",
            owner=Checkpoint,
        )


class Checkpoint(ModelCheckpoint):
    """ModelCheckpoint whose last.ckpt is always the final step, and whose files are written atomically.

    Lightning writes last.ckpt at train end only if it never wrote one, so a run whose max_steps is not a
    multiple of the validation interval would keep a last.ckpt from before its final steps.

    That train-end checkpoint records the loops as they were right after the final optimizer step, as a step
    checkpoint does. By train end Lightning's fit loop has closed the epoch, and a run extended from its state
    (a larger --max_steps) skips data: an epoch cut short counts as finished, so the rest of it is never seen;
    after a whole epoch the batch counters carry into the next one, which then ends after a single batch.

    In `setup` it makes the strategy's saves atomic (`diffusion.training.atomic_writes`; on every rank, rank 0
    writes) and removes temporary files a killed save left in its folder; `save_last="link"` replaces
    last.ckpt atomically too.

    Besides the saves ModelCheckpoint makes (at validation by default), at the end of an optimizer step it
    saves last.ckpt when `every_n_minutes` of wall time passed since the last save, and when the run got
    SIGTERM or SIGUSR1, after which it ends the run with a non-zero exit (`diffusion.training.callbacks.preemption`; under DDP it
    asks the ranks at the logging steps only, so such a save can come up to log_every_n_steps - 1 steps later).

    Args:
        every_n_minutes: wall-time interval of the timed checkpoints (None: none).
        **kwargs: ModelCheckpoint's arguments.
    """

    def __init__(self, *args: Any, every_n_minutes: float | None = 30.0, **kwargs: Any) -> None:
        check_checkpoint_options(kwargs)
        super().__init__(*args, **kwargs)
        self.preemption = Preemption(every_n_minutes)
        self._polled_step = -1
        self._loops_after_step: tuple[int, dict[str, Any]] | None = None  # (global step, fit loop state)
        self._saving_at_train_end = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        checkpoint_io.install(trainer.strategy)
        if trainer.is_global_zero and self.dirpath and _is_local_file_protocol(self.dirpath):
            checkpoint_io.remove_leftovers(Path(self.dirpath))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # After Lightning registered its signal handlers (it restores the ones it found after fit).
        self.preemption.install(trainer)
        self.preemption.checkpoints = None if self.dirpath is None else str(self.dirpath)
        self._polled_step, self._loops_after_step = trainer.global_step, None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if trainer.global_step == self._polled_step:
            return  # no optimizer step since the last poll (accumulating): a save here would lose gradients
        self._polled_step = trainer.global_step
        last_step = (
            trainer.should_stop or trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps
        )
        if last_step:
            # The run's final step (max_steps reached, or a callback stopped it here as max_time's Timer does).
            self._loops_after_step = (trainer.global_step, trainer.fit_loop.state_dict())
        signum, due = None, False
        if self.preemption.polls_after(trainer, last_step):
            signum, due = self.preemption.poll(trainer)
        if (signum or due) and not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            with self.preemption.saving(trainer.global_step):
                if self.save_last:
                    self._save_last_checkpoint(trainer, candidates)
                else:
                    self._save_checkpoint(trainer, self.format_checkpoint_name(candidates))
        if self._last_global_step_saved == trainer.global_step:
            self.preemption.saved()
        if signum:
            name = signal.Signals(signum).name
            rank_zero_info(
                said(
                    f"{name} received: saved the checkpoint of step {trainer.global_step} "
                    f"({self.last_model_path or self.best_model_path}); resume with {{command:--ckpt_path}} last"
                )
            )
            requeue_slurm_job(trainer, signum)
            raise Preempted(128 + signum)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self.preemption.uninstall(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saving_at_train_end = True
        try:
            if self.save_last and self._last_global_step_saved != trainer.global_step:
                self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            else:
                super().on_train_end(trainer, pl_module)
        finally:
            self._saving_at_train_end = False

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._saving_at_train_end and self._loops_after_step is not None:
            step, fit_loop = self._loops_after_step
            if step == trainer.global_step:
                checkpoint["loops"]["fit_loop"] = fit_loop
                checkpoint["epoch"] = fit_loop["epoch_progress"]["current"]["completed"]  # = current_epoch

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        # Every save: a second Ctrl+C during it waits for it to be written (`Preemption.saving`).
        with self.preemption.saving(trainer.global_step):
            super()._save_checkpoint(trainer, filepath)

    @staticmethod
    def _link_checkpoint(trainer: L.Trainer, filepath: str, linkpath: str) -> None:
        # Lightning removes last.ckpt and then links or copies: a kill in between leaves no last.ckpt, or a
        # truncated copy.
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            checkpoint_io.link_atomically(filepath, linkpath)
        trainer.strategy.barrier()
