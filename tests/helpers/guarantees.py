"""Test-only callbacks for tests/training/test_preemption.py and tests/training/test_distributed_guarantees.py.

`train.py` subprocesses import them by class path (`helpers.guarantees.SignalAt`), so tests/ must be on
PYTHONPATH. Each writes what it saw to `<out_dir>/<what>_rank<global rank>.json`.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L

from helpers.ddp import AtStep


def write_record(out_dir: str, what: str, rank: int, record: Any) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"{what}_rank{rank}.json").write_text(json.dumps(record))


class SignalAt(AtStep):
    """Sends `signal` to this process on `rank` when the batch after optimizer step `step` starts, as a
    scheduler would (`kill -TERM <pid>`, SLURM's `--signal`): the signal arrives in the middle of a step."""

    def __init__(self, step: int, signal: str = "SIGTERM", rank: int = 0) -> None:
        super().__init__(step, rank)
        self.signal = signal

    def act(self, trainer: L.Trainer) -> None:
        os.kill(os.getpid(), getattr(signal, self.signal))


class StopAt(AtStep):
    """Rank `rank` writes its pid to `<out_dir>/pid_rank<rank>.json` and stops itself (SIGSTOP) at step `step`:
    a rank that stops answering without exiting (a hung process, a frozen machine)."""

    def __init__(self, out_dir: str, step: int = 2, rank: int = 1) -> None:
        super().__init__(step, rank)
        self.out_dir = out_dir

    def act(self, trainer: L.Trainer) -> None:
        write_record(self.out_dir, "pid", self.rank, {"pid": os.getpid(), "stopped_at": time.time()})
        os.kill(os.getpid(), signal.SIGSTOP)


class FailOrSleepAt(L.Callback):
    """At step `step`: rank 1 writes its pid and sleeps `sleep_s` outside any collective (loading data, say), so
    no collective can tell it that rank 0 is gone; rank 0 raises once rank 1 is asleep. For two ranks."""

    def __init__(self, out_dir: str, step: int = 2, sleep_s: float = 120.0) -> None:
        self.out_dir = out_dir
        self.step = step
        self.sleep_s = sleep_s

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step != self.step:
            return
        if trainer.global_rank == 0:
            deadline = time.monotonic() + 60
            while not (Path(self.out_dir) / "pid_rank1.json").exists() and time.monotonic() < deadline:
                time.sleep(0.1)  # until rank 1 is asleep
            raise RuntimeError(f"deliberate failure on rank 0 at step {self.step}")
        write_record(self.out_dir, "pid", trainer.global_rank, {"pid": os.getpid()})
        time.sleep(self.sleep_s)


class Audit(L.Callback):
    """Records, per rank: every file this process opens for writing, renames or links under `watch_dir`
    (Python's audit events: torch.save to a path, fsspec, os.replace, symlinks), and the sample indices it
    draws in validation-time sampling (`DiffusionModule.initial_noise`'s `indices`, all of them when None).

    Written to `<out_dir>/audit_rank<rank>.json` at the end of fit or on an exception (preemption)."""

    def __init__(self, out_dir: str, watch_dir: str) -> None:
        self.out_dir = out_dir
        self.watch_dir = str(Path(watch_dir).absolute())
        self.record: dict[str, list] = {"writes": [], "sampled": []}
        self._active = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._active = True
        sys.addaudithook(self._audit)  # cannot be removed: `_active` switches it off after fit
        initial_noise = pl_module.initial_noise  # where every sampling path draws its samples' x_T

        def recording_initial_noise(num_samples: int, seed: Any = None, indices: Any = None) -> Any:
            self.record["sampled"].append(list(range(num_samples)) if indices is None else indices.tolist())
            return initial_noise(num_samples, seed, indices)

        pl_module.initial_noise = recording_initial_noise  # instance attribute: only this run

    def _audit(self, event: str, args: tuple) -> None:
        if not self._active:
            return
        if event == "open":
            path, mode = args[0], args[1]
            writing = isinstance(mode, str) and any(c in mode for c in "wxa+")
            writing |= isinstance(args[2], int) and bool(args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            paths = [path] if writing else []
        elif event in ("os.rename", "os.symlink", "os.link"):
            paths = [args[1]]
        else:
            return
        for path in paths:
            if isinstance(path, str | os.PathLike) and str(Path(path).absolute()).startswith(self.watch_dir):
                self.record["writes"].append(str(path))

    def _write(self, trainer: L.Trainer) -> None:
        self._active = False
        write_record(self.out_dir, "audit", trainer.global_rank, self.record)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._write(trainer)
