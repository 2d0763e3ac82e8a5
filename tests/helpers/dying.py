"""A rank that dies: `helpers.dying.DieAt` (by class path, in a `train.py --devices 2` subprocess) at the batch
after optimizer step `step`: every rank writes `<out_dir>/pid_rank<r>.json` (its pid and the time), then rank `rank`
SIGKILLs itself once the others have written theirs, as the kernel's OOM killer or a crash would end it: the others
are then in that step's collective, or with `others_sleep` asleep outside any collective (loading data, say), where
no collective can tell them, only the heartbeat's watch."""

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L


class DieAt(L.Callback):
    def __init__(self, out_dir: str, step: int = 2, rank: int = 0, others_sleep: bool = False) -> None:
        self.out_dir, self.step, self.rank, self.others_sleep = Path(out_dir), step, rank, others_sleep

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, index: int
    ) -> None:
        if trainer.global_step != self.step:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        me = trainer.global_rank
        record = {"pid": os.getpid(), "at": time.time()}
        (self.out_dir / f"pid_rank{me}.json").write_text(json.dumps(record))
        if me != self.rank:
            if self.others_sleep:
                time.sleep(120)
            return
        deadline = time.monotonic() + 60
        others = [self.out_dir / f"pid_rank{r}.json" for r in range(trainer.world_size) if r != me]
        while not all(p.exists() for p in others) and time.monotonic() < deadline:  # the others' step began
            time.sleep(0.05)
        (self.out_dir / f"died_rank{me}.json").write_text(json.dumps({"at": time.time()}))
        os.kill(os.getpid(), signal.SIGKILL)
