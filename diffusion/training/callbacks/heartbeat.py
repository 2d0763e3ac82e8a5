"""No silent hang: a rank that stops answering ends the job within `--ddp_timeout`, and the error names it.

The timeout is the process group's, set from `--ddp_timeout` once the group is up (`Heartbeat.setup`): a
collective that waits longer raises on the ranks still running. Start-up keeps torch's 30 minutes, for the
rendezvous and the barrier after `prepare_data` (rank 0 may be downloading a data set while the others wait). Which rank stopped, the collective does not
say; so every rank bumps a counter in the process group's key-value store (the rendezvous store rank 0 hosts)
a few times per timeout from a daemon thread, and a rank whose collective failed names the ranks whose counter
no longer moves. A stopped process (SIGSTOP, a machine gone) stops its threads too; if rank 0 itself stopped,
the store does not answer either, which names rank 0.
"""

import threading
import time
from datetime import timedelta

import lightning as L
import torch.distributed as dist

DEFAULT_DDP_TIMEOUT_S = 600.0  # 10 minutes; Lightning's and torch's default is 30


class RankStoppedAnswering(RuntimeError):
    """A rank did not answer a collective within the timeout."""


def is_collective_failure(error: BaseException) -> bool:
    """A distributed error (timeout, closed connection) anywhere in the exception's chain."""
    while error is not None:
        text = str(error)
        if isinstance(error, dist.DistError) or any(
            word in text for word in ("Gloo", "gloo", "NCCL", "imed out")
        ):
            return True
        error = error.__cause__ or error.__context__
    return False


def set_collective_timeout(timeout: timedelta) -> None:
    """The default group's timeout for every collective from now on. `torch.distributed.set_timeout` is public
    from torch 2.12; an older torch (2.11 on the lent GPU machines) has the private helper it replaced, which
    newer ones keep as a deprecated alias."""
    setter = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    setter(timeout)


class Heartbeat(L.Callback):
    """Every rank's counter in the store, bumped every `interval` seconds while the process runs."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.interval = min(max(timeout_s / 20, 0.05), 1.0)  # a store call per second at most
        self._store: dist.Store | None = None
        self._world_size = 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size < 2 or not dist.is_initialized() or self._thread is not None:
            return
        # The default group's store: private in torch, but the one every rank already shares.
        set_collective_timeout(timedelta(seconds=self.timeout_s))  # every collective from here on
        self._store = dist.distributed_c10d._get_default_store()
        self._world_size = trainer.world_size
        rank = trainer.global_rank
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, args=(rank,), daemon=True, name="heartbeat")
        self._thread.start()

    def _beat(self, rank: int) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._store.add(f"heartbeat/{rank}", 1)
            except Exception:  # the store is gone (rank 0 ended or stopped): nothing to report to
                return

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop.set()
        self._thread = None

    def silent_ranks(self) -> list[int] | None:
        """The ranks whose counter did not move over a few intervals (None: not running under DDP)."""
        if self._store is None:
            return None
        try:
            self._store.set_timeout(timedelta(seconds=max(3 * self.interval, 2.0)))
            before = [self._store.add(f"heartbeat/{r}", 0) for r in range(self._world_size)]
            time.sleep(4 * self.interval)
            after = [self._store.add(f"heartbeat/{r}", 0) for r in range(self._world_size)]
        except Exception:
            return [0]  # the store rank 0 hosts does not answer
        return [r for r, (b, a) in enumerate(zip(before, after, strict=True)) if a == b]

    def explain(self, error: BaseException) -> RankStoppedAnswering | None:
        """The error to raise instead of a failed collective, naming the silent ranks (None: none found)."""
        if not is_collective_failure(error):
            return None
        silent = self.silent_ranks()
        if not silent:
            return None
        ranks = ", ".join(map(str, silent))
        return RankStoppedAnswering(
            f"rank {ranks} stopped answering: no reply within --ddp_timeout {self.timeout_s:g} s; the job was "
            "ended (resume with --ckpt_path last)"
        )
