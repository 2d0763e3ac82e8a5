"""No silent hang, and no wrong name: a rank that died is named dead with its exit at once, a rank that stopped
answering ends the job within `--ddp_timeout`; either way each surviving rank says it in one line and exits with
status 1, no traceback.

The timeout is the process group's, set from `--ddp_timeout` once the group is up (`Heartbeat.setup`): a
collective that waits longer raises on the ranks still running. Start-up keeps torch's 30 minutes, for the
rendezvous and the barrier after `prepare_data` (rank 0 may be downloading a data set while the others wait).

A death: every rank writes its pid and host into the process group's key-value store (the rendezvous store rank 0
hosts) and watches the other ranks of its machine through pidfds, from a daemon thread. A process that exited is
seen within a beat (a second at most), its exit read from the kernel (the pidfd's exit information once its parent
reaped it, /proc's exit code while it is a zombie); a rank on another machine is not watched, but rank 0 dying
closes the store's connection, which the others see at once. The thread prints the line and ends the process (its
main thread may be far from any collective); a failed collective on the main thread says the same. Lightning's
launcher has a watch of its own that SIGKILLs rank 0 without a word when a rank it started dies: this one takes
its place.

A stop: which rank stopped, a timed-out collective does not say; so every rank bumps a counter in the store a few
times per timeout, and a rank whose collective failed names the ranks whose counter no longer moves. A stopped
process (SIGSTOP, a machine gone) stops its threads too; if rank 0 itself stopped, the store does not answer
either, which names rank 0.
"""

import contextlib
import math
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch.distributed as dist
from lightning.fabric.strategies.launchers import subprocess_script

from diffusion.errors import OutOfRange, check_real, said
from diffusion.training.callbacks.preemption import Preemption

DEFAULT_DDP_TIMEOUT_S = 600.0  # 10 minutes; Lightning's and torch's default is 30
RESUME = "its log above says why; resume with {command:--ckpt_path} last"
# Killed before the first checkpoint: `--ckpt_path last` would find none and be refused.
RUN_AGAIN = (
    "its log above says why; no checkpoint was saved yet: run the command again (it trains from the start)"
)
# Linux's PIDFD_GET_INFO ioctl (6.15+) on struct pidfd_info's first 64 bytes: the mask at 0, the exit status at 60.
PIDFD_GET_INFO, PIDFD_INFO_EXIT = (3 << 30) | (64 << 16) | (0xFF << 8) | 11, 1 << 3


class RankLost(SystemExit):
    """The job ended because another rank died or stopped answering: its line (`error: <problem> — <fix>`) is
    printed by Python as it exits with status 1, without a traceback (not a user error, nor a bug of this one)."""

    def __init__(self, problem: str, fix: str = RESUME) -> None:
        super().__init__(said(f"error: {problem} — {fix}"))
        self.problem, self.fix = problem, fix


class RankStoppedAnswering(RankLost):
    """A rank did not answer a collective within the timeout."""


class RankDied(RankLost):
    """A rank's process ended while the others trained."""


def is_collective_failure(error: BaseException) -> bool:
    """A distributed error (timeout, closed connection) anywhere in the exception's chain. By type where torch
    gives one (DistError); gloo's own failures when a peer dies are still plain RuntimeErrors (torch 2.14: with
    the type alone, tests/cli/test_dead_ranks.py and test_distributed's failing rank go red), known by their text."""
    cause: BaseException | None = error
    while cause is not None:
        text = str(cause)
        if isinstance(cause, dist.DistError) or any(
            word in text for word in ("Gloo", "gloo", "NCCL", "imed out")
        ):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def set_collective_timeout(timeout: timedelta) -> None:
    """The default group's timeout for every collective from now on. `torch.distributed.set_timeout` is public
    from torch 2.12; an older torch (2.11 on the lent GPU machines) has the private helper it replaced, which
    newer ones keep as a deprecated alias."""
    setter = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    setter(timeout)


def exit_said(status: int) -> str:
    """A wait status as a shell would say it: `killed by SIGKILL`, `exit status 1`."""
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.WEXITSTATUS(status)}"


class Peer:
    """Another rank's process on this machine, watched through a pidfd (Linux)."""

    def __init__(self, rank: int, pid: int) -> None:
        self.rank, self.pid = rank, pid
        self.descriptor = os.pidfd_open(pid)

    def exit_status(self) -> int | None:
        """Its wait status once it has exited (None: running, or its exit cannot be read here)."""
        if not select.select([self.descriptor], [], [], 0)[0]:
            return None  # a pidfd turns readable when its process exits
        # Reaped, the kernel keeps the exit with the pidfd; until then /proc shows a zombie's. A reap between the
        # two reads is caught by reading the pidfd's again.
        for read in (self._reaped_exit, self._zombie_exit, self._reaped_exit):
            status = read()
            if status is not None:
                return status
        return None

    def _reaped_exit(self) -> int | None:
        import fcntl  # here, not at the top: Windows has none, and no pidfd either (no Peer is made there)

        info = bytearray(64)
        struct.pack_into("Q", info, 0, PIDFD_INFO_EXIT)
        with contextlib.suppress(OSError):  # a kernel before 6.15 has no PIDFD_GET_INFO
            fcntl.ioctl(self.descriptor, PIDFD_GET_INFO, info)
            if struct.unpack_from("Q", info, 0)[0] & PIDFD_INFO_EXIT:
                return struct.unpack_from("i", info, 60)[0]
        return None

    def _zombie_exit(self) -> int | None:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                return int(fields[-1])
        return None


class Heartbeat(L.Callback):
    """Every rank's counter in the store, bumped every `interval` seconds while the process runs, and the watch on
    the other ranks' processes."""

    def __init__(self, timeout_s: float) -> None:
        # A str failed in the arithmetic below; 0, a negative, NaN or inf set a collective timeout of no meaning.
        fix = "pass the seconds a collective may wait before the job is ended, e.g. 600"
        if not 0 < check_real("timeout_s", timeout_s, fix) < math.inf:
            raise OutOfRange("timeout_s", timeout_s, "> 0 and finite", fix)
        self.timeout_s = float(timeout_s)
        self.interval = min(max(timeout_s / 20, 0.05), 1.0)  # a store call per second at most
        self._store: dist.Store | None = None
        self._world_size = 1
        self._rank = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ending = threading.Lock()
        self._ended = False  # the job's end was said (by the thread or by `explain`): nobody says it again
        self._peers: list[Peer] = []  # the other ranks on this machine, while they run
        self._finished: list[Peer] = []
        self._wake: tuple[int, int] | None = None  # a pipe whose write wakes the thread from its wait
        self._launched: list = []  # the ranks Lightning's launcher started from this process (Popen)
        self._trainer: L.Trainer | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size < 2 or not dist.is_initialized() or self._thread is not None:
            return
        # The default group's store: private in torch, but the one every rank already shares.
        set_collective_timeout(timedelta(seconds=self.timeout_s))  # every collective from here on
        self._store = dist.distributed_c10d._get_default_store()
        self._world_size, self._rank, self._trainer = trainer.world_size, trainer.global_rank, trainer
        self._store.set(f"process/{self._rank}", f"{os.getpid()} {socket.gethostname()}")
        self._launched = list(getattr(trainer.strategy.launcher, "procs", None) or [])
        if self._launched:
            self._take_over_lightnings_watch()
        self._stop.clear()
        self._ended = False
        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")
        self._thread.start()

    @staticmethod
    def _take_over_lightnings_watch() -> None:
        """Lightning's launcher watches the ranks it started every 5 s and SIGKILLs everything, rank 0 included,
        with no word on the console, when one exits non-zero: its thread is told it is done (after its current
        sleep), as this callback's watch says which rank died and ends the job itself."""
        # Private in Lightning: a release without it leaves its watch on (the job still ends, without the line).
        observer = getattr(subprocess_script, "_ChildProcessObserver", None)
        for thread in threading.enumerate():
            if observer is not None and isinstance(thread, observer):
                cast(Any, thread)._run = lambda: True  # the private flag its loop reads

    def _watch_peers(self) -> None:
        """The other ranks on this machine (read once every rank has written itself into the store)."""
        host, store = socket.gethostname(), self._store
        assert store is not None, "set in setup, before the thread starts"
        for rank in range(self._world_size):
            if rank == self._rank:
                continue
            pid, _, peer_host = store.get(f"process/{rank}").decode().partition(" ")
            if peer_host == host and hasattr(os, "pidfd_open"):
                with contextlib.suppress(OSError):  # gone already: the store's answers or a collective tell
                    self._peers.append(Peer(rank, int(pid)))

    def _beat(self) -> None:
        store = self._store
        assert store is not None, "set in setup, before the thread starts"
        with contextlib.suppress(Exception):  # the store gone before every rank wrote itself in
            self._watch_peers()
        while not self._stop.is_set():
            died = self.dead_rank(wait=self.interval, wakeable=True)  # wakes as soon as a peer exits
            if self._stop.is_set():
                return
            if died is not None:
                self._end_now(*died)
                return
            try:
                store.add(f"heartbeat/{self._rank}", 1)
            except (
                Exception
            ):  # the store is gone (rank 0 ended or stopped): the peers' exits or `explain` say
                if self._rank == 0 or not any(peer.rank == 0 for peer in self._peers):
                    return

    def dead_rank(self, wait: float = 0.0, wakeable: bool = False) -> tuple[int, str] | None:
        """(rank, how it ended) of a rank on this machine that exited with a failure (an exit of 0 is a rank
        that finished), else None; waiting up to `wait` seconds for one to exit (`wakeable`: or for
        `_stop_beating`)."""
        deadline = time.monotonic() + wait
        while True:
            for peer in list(self._peers):
                status = peer.exit_status()
                if status == 0 and peer in self._peers:  # it finished: its pidfd stays readable, unwatched
                    self._peers.remove(peer)
                    self._finished.append(peer)  # closed at teardown
                elif status is not None:
                    return peer.rank, exit_said(status)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            wakes = [self._wake[0]] if wakeable and self._wake is not None else []
            woken = select.select([*wakes, *(peer.descriptor for peer in self._peers)], [], [], remaining)[0]
            if set(wakes) & set(woken):
                return None
            if woken:  # exited, its exit not readable yet (being reaped): look again shortly
                time.sleep(min(0.05, max(remaining, 0)))

    def _fix(self, resume: str = RESUME) -> str:
        """`resume` where the run has a checkpoint to resume from (saved by it, or the one it resumed from: every
        rank knows, from its Checkpoint callback and the Trainer), else: run the command again."""
        callbacks = getattr(self._trainer, "callbacks", None) or []
        preemptions = [getattr(cb, "preemption", None) for cb in callbacks]
        steps = [p.resumable_step for p in preemptions if isinstance(p, Preemption)]
        return resume if any(steps) or getattr(self._trainer, "ckpt_path", None) else RUN_AGAIN

    def _end_now(self, rank: int, how: str) -> None:
        """From the thread: say the death, end the ranks this process launched and this process."""
        with self._ending:
            if self._ended or self._stop.is_set():
                return
            self._ended = True
            print(RankDied(f"rank {rank} died ({how})", self._fix()).code, file=sys.stderr, flush=True)
            for process in self._launched:
                with contextlib.suppress(OSError):
                    process.send_signal(signal.SIGKILL)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            os._exit(1)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop_beating()
        thread, self._thread = self._thread, None
        if thread is not None:
            # Woken by the pipe at once; a store call in progress may hold it a little longer.
            thread.join(timeout=1.0)
            if thread.is_alive():
                return  # it still uses the descriptors: they go with the process
        for descriptor in [*(peer.descriptor for peer in self._peers + self._finished), *(self._wake or ())]:
            os.close(descriptor)
        self._peers, self._finished, self._wake = [], [], None

    def _stop_beating(self) -> None:
        self._stop.set()
        if self._wake is not None:
            with contextlib.suppress(OSError):
                os.write(self._wake[1], b"x")

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
        # This rank's own counter stands still once `explain` stopped the beats: it answers, it is not silent.
        return [r for r, (b, a) in enumerate(zip(before, after, strict=True)) if a == b and r != self._rank]

    def _store_closed(self) -> bool:
        """Rank 0's store refused at once (its connection closed: rank 0's process is gone), rather than not
        answering within the wait (a stopped rank 0)."""
        started, store = time.monotonic(), self._store
        if store is None:  # no store: no rank 0 to have lost
            return False
        try:
            store.set_timeout(timedelta(seconds=max(3 * self.interval, 2.0)))
            store.add(f"heartbeat/{self._rank}", 0)
        except Exception:
            return time.monotonic() - started < max(3 * self.interval, 2.0) / 2
        return False

    def explain(self, error: BaseException) -> RankLost | None:
        """The error to raise instead of `error` on the way out of a failed fit: a rank that died, or (after a
        failed collective) the ranks that stopped answering; None when no other rank is to blame. Once it has
        answered, the watch says nothing more (the ranks this process launched are ended next)."""
        if self._store is None:
            return None
        with self._ending:
            already_said, self._ended = self._ended, True  # the watch says nothing from here on
        if already_said:
            # said by the watch, which is ending this process
            return RankDied("another rank died", self._fix())
        try:  # beating on meanwhile: the other ranks' `explain` must not find this one silent
            return self._blame(error)
        finally:
            self._stop_beating()

    def _blame(self, error: BaseException) -> RankLost | None:
        if not is_collective_failure(error):
            died = self.dead_rank()
            return None if died is None else RankDied(f"rank {died[0]} died ({died[1]})", self._fix())
        # A peer's death closes its connections a moment before the kernel says it has exited: wait for that.
        died = self.dead_rank(wait=2.0)
        if died is not None:
            return RankDied(f"rank {died[0]} died ({died[1]})", self._fix())
        if self._rank != 0 and self._store_closed():
            return RankDied(
                "rank 0 died (its process is gone; its exit status is not known on this machine)", self._fix()
            )
        silent = self.silent_ranks()
        if not silent:
            return None
        ranks = ", ".join(map(str, silent))
        return RankStoppedAnswering(
            f"rank {ranks} stopped answering: no reply within {{command:--ddp_timeout}} {self.timeout_s:g} s; the job was ended",
            self._fix("resume with {command:--ckpt_path} last"),
        )
