"""Test-only callbacks that watch what each training step pays for, for tests/training/test_steady_state.py.

`train.py` subprocesses import them by class path (`helpers.step_costs.StepCosts`), so tests/ must be on
PYTHONPATH. Each rank writes what it saw to `<out_dir>/costs_rank<global rank>.json`.
"""

import functools
import json
import threading
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

# The torch.distributed calls that run a collective (DDP's gradient all-reduce runs in its C++ reducer, as the
# step's own asynchronous work, and is not among them; its buffer broadcast, `_broadcast_coalesced`, is).
COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "broadcast_object_list", "all_gather",
    "all_gather_into_tensor", "all_gather_object", "all_gather_coalesced", "gather", "gather_object", "scatter",
    "scatter_object_list", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv", "_broadcast_coalesced",
)  # fmt: skip
# The Tensor methods that hand a value to the host (on a GPU, each waits for the device's queue to drain).
# `.to("cpu")` is left out: on a CPU it cannot be told from Lightning moving each batch to the training device.
READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__complex__")
READING_FUNCTIONS = ("equal", "allclose", "is_nonzero")  # torch functions that return a Python value


class StepCosts(L.Callback):
    """Records, per training batch, the collectives and host reads of tensors made (in the main thread, by
    Python code: Lightning's, the project's, torch's Python layers) from the start of that batch to the start of
    the next, so Lightning's own work after a batch (metrics, loggers) and before the next (its per-batch
    collectives, the data) counts too. Nested calls count once (`all_gather_object` reads inside).

    Writes `<out_dir>/costs_rank<r>.json`: {"batches": [{"step": optimizer steps after the batch,
    "collectives": [names], "reads": [names], "loss": this rank's loss}], "progress_bar_loss": the bar's
    train/loss at the end, "world_size", "log_every_n_steps", "max_steps"}. Its own reads are not counted.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.batches: list[dict[str, Any]] = []
        self._originals: list[tuple[Any, str, Any]] = []
        self._depth = 0  # > 0 inside a counted call, or while this callback reads

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._patch(dist, COLLECTIVES, "collectives")
        self._patch(torch.Tensor, READS, "reads")
        self._patch(torch, READING_FUNCTIONS, "reads")

    def _patch(self, owner: Any, names: tuple[str, ...], kind: str) -> None:
        for name in names:
            original = getattr(owner, name, None)
            if original is None:
                continue
            self._originals.append((owner, name, original))
            setattr(owner, name, self._counting(original, name, kind))

    def _counting(self, original: Any, name: str, kind: str) -> Any:
        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0 and self.batches and threading.current_thread() is threading.main_thread():
                self.batches[-1][kind].append(name)
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def _unpatch(self) -> None:
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.batches.append({"collectives": [], "reads": []})

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._depth += 1
        try:
            # Lightning divides the loss it returns here by accumulate_grad_batches.
            loss = float(outputs["loss"]) * trainer.accumulate_grad_batches
        finally:
            self._depth -= 1
        self.batches[-1].update(step=trainer.global_step, loss=loss)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._unpatch()
        bar_loss = trainer.progress_bar_metrics.get("train/loss")
        record = {
            "batches": self.batches, "progress_bar_loss": bar_loss, "world_size": trainer.world_size,
            "log_every_n_steps": trainer.log_every_n_steps, "max_steps": trainer.max_steps,
        }  # fmt: skip
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"costs_rank{trainer.global_rank}.json").write_text(json.dumps(record))

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._unpatch()


class NoSyncOnCuda(L.Callback):
    """Runs the steady-state batches (not the first, not the last, not completing a logging step: from the
    batch's start to the next batch's start, or to a validation) under `torch.cuda.set_sync_debug_mode("error")`,
    so any synchronizing CUDA call there raises and ends the run. For runs without gradient accumulation."""

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        torch.cuda.set_sync_debug_mode("default")
        step = trainer.global_step + 1  # the optimizer step this batch completes (no accumulation)
        every = trainer.log_every_n_steps
        if 1 < step < trainer.max_steps and step % every != 0:
            torch.cuda.set_sync_debug_mode("error")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.set_sync_debug_mode("default")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.set_sync_debug_mode("default")

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        torch.cuda.set_sync_debug_mode("default")
