"""A run held at a step until the test lets it go: `helpers.holding.WaitAt` (by class path, in a `train.py`
subprocess) writes `started` when the batch after optimizer step `step` starts on rank 0, then waits until the file
`release` exists (at most `limit_s`), so a test can do something while the run is certainly in the middle of it."""

import time
from pathlib import Path
from typing import Any

import lightning as L


class WaitAt(L.Callback):
    def __init__(self, step: int, started: str, release: str, limit_s: float = 120.0) -> None:
        self.step, self.started, self.release, self.limit_s = step, Path(started), Path(release), limit_s

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, index: int
    ) -> None:
        if trainer.global_step != self.step or not trainer.is_global_zero:
            return
        self.started.write_text("started")
        deadline = time.monotonic() + self.limit_s
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
