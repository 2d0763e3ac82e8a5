"""Test-only callbacks and a data module for tests/training/test_distributed.py and tests/training/test_resume.py.

`train.py` subprocesses import them by class path (`helpers.ddp.Recorder`), so tests/ must be on PYTHONPATH.
Each rank writes what it saw to its own JSON file; the tests compare the files across ranks and runs.
"""

import functools
import io
import json
import os
import signal
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from diffusion.core.compiling import compiling_with
from diffusion.data.vectors import VectorDataModule


class Recorder(L.Callback):
    """Writes `<out_dir>/rank<global rank>.json` at the end of fit with what this rank saw:

    - `indices`: the dataset indices of every micro-batch, per epoch (items are `(x, index)`);
    - `first_t`, `first_noise`: the timesteps and noise `training_step` drew for the first micro-batch;
    - `losses`: the rank's own (not synced) loss of every micro-batch;
    - `synced_losses`: `trainer.callback_metrics["train/loss"]` after every micro-batch (the synced value; None
      before the first logging step);
    - `allreduce_calls`: how many times DDP's communication hook had run after every micro-batch;
    - `num_training_batches`, `global_step`, `world_size`, `accumulate_grad_batches`.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.record: dict[str, Any] = {
            k: [] for k in ("indices", "losses", "synced_losses", "allreduce_calls")
        }
        self._allreduce_calls = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.record.update(
            num_training_batches=trainer.num_training_batches,
            world_size=trainer.world_size,
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            ddp=isinstance(trainer.strategy.model, DistributedDataParallel),
        )
        if self.record["ddp"]:
            # Registered before the first backward, as DDP requires; counts every bucket all-reduce.
            trainer.strategy.model.register_comm_hook(None, self._counting_allreduce)
        draw = pl_module.draw_noise_and_timesteps

        def recording_draw(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            noise, t = draw(*args, **kwargs)
            if "first_t" not in self.record:
                self.record.update(first_t=t.tolist(), first_noise=noise.flatten().tolist())
            return noise, t

        pl_module.draw_noise_and_timesteps = recording_draw  # instance attribute: only this run

    def _counting_allreduce(
        self, state: Any, bucket: torch.distributed.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        self._allreduce_calls += 1
        return default_hooks.allreduce_hook(None, bucket)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.record["indices"].append([])

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.record["indices"][-1].append(batch[1].tolist())
        # Lightning divides the loss it returns here by accumulate_grad_batches.
        self.record["losses"].append(float(outputs["loss"]) * trainer.accumulate_grad_batches)
        synced = trainer.callback_metrics.get("train/loss")  # logged at logging steps, before the optimizer's
        self.record["synced_losses"].append(None if synced is None else float(synced))
        self.record["allreduce_calls"].append(self._allreduce_calls)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.record["global_step"] = trainer.global_step
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.record))


class AtStep(L.Callback):
    """Base of the test callbacks that act once, on one rank, when the batch after optimizer step `step` starts
    (so in the middle of a run, as a crash or a scheduler's signal would): subclasses implement `act`."""

    def __init__(self, step: int, rank: int) -> None:
        self.step = step
        self.rank = rank

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            self.act(trainer)

    def act(self, trainer: L.Trainer) -> None:
        raise NotImplementedError


class FailOnRank(AtStep):
    """Raises on `rank` when the run reaches optimizer step `step`, to check that the other ranks do not hang."""

    def __init__(self, rank: int = 1, step: int = 2) -> None:
        super().__init__(step, rank)

    def act(self, trainer: L.Trainer) -> None:
        raise RuntimeError(f"deliberate failure on rank {self.rank} at step {self.step}")


class KillRankOnce(AtStep):
    """SIGKILL to this one rank's own process when the run reaches optimizer step `step` (after that step's
    checkpoints), in a torchrun job's first attempt only (TORCHELASTIC_RESTART_COUNT 0): a rank lost as a crash or
    the kernel's OOM killer loses it, which torchrun's --max-restarts answers by restarting every rank; the restart
    runs this callback too and must train on."""

    def __init__(self, step: int, rank: int = 1) -> None:
        super().__init__(step, rank)

    def act(self, trainer: L.Trainer) -> None:
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)


class CountingVectorData(VectorDataModule):
    """VectorDataModule whose `prepare_data` appends one line (global rank, local rank, pid) to `prepare_log`."""

    def __init__(self, prepare_log: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prepare_log = prepare_log

    def prepare_data(self) -> None:
        rank = self.trainer.global_rank if self.trainer is not None else 0
        with open(self.prepare_log, "a") as f:
            f.write(f"{rank} {os.environ.get('LOCAL_RANK', 0)} {os.getpid()}\n")


class KillAt(L.Callback):
    """Kills the whole run with SIGKILL at optimizer step `step`, as `kill -9` or a lost node would.

    By default just before the next batch, once the checkpoints of `step` are written (mid-epoch unless
    `step` ends an epoch). With `during_save_of="last.ckpt"`, half-way through writing that file at `step`:
    the writer has put half of the bytes on disk when the process dies.

    It kills its whole process group (the ranks Lightning launched, or the warm ranks helpers/warm.py started, are
    in it), so it refuses to run anywhere but in a train.py whose rank 0 leads its group: started in a session of its
    own, or as the warm ranks of one group, as tests/training/test_resume.py starts it.
    """

    def __init__(self, step: int, during_save_of: str | None = None) -> None:
        self.step = step
        self.during_save_of = during_save_of

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.is_global_zero and os.getpgrp() != os.getpid():
            raise RuntimeError("KillAt kills its process group: start train.py with start_new_session=True")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.during_save_of is None and trainer.global_step == self.step and trainer.is_global_zero:
            self._kill()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Checkpoint callbacks run after all others: they save this step's files right after this hook.
        if self.during_save_of is not None and trainer.global_step == self.step and trainer.is_global_zero:
            torch.save = self._dying_save(torch.save)

    def _dying_save(self, save: Any) -> Any:
        def dying_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            if self.during_save_of not in Path(str(getattr(f, "name", f))).name:
                return save(obj, f, *args, **kwargs)
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            f.write(buffer.getvalue()[: buffer.tell() // 2])
            f.flush()
            os.fsync(f.fileno())
            self._kill()

        return dying_save

    @staticmethod
    def _kill() -> None:
        os.killpg(os.getpgrp(), signal.SIGKILL)


class WeightProbe(L.Callback):
    """Saves this rank's network weights in `setup` (before the strategy wraps the model in DDP, which would
    broadcast rank 0's weights and hide a rank that did not load them) to <out_dir>/rank<r>.pt."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        assert not isinstance(trainer.strategy.model, torch.nn.parallel.DistributedDataParallel)
        torch.save(pl_module.network.state_dict(), self.out_dir / f"rank{trainer.global_rank}.pt")


class CompileWith(L.Callback):
    """The project's graphs compiled with `backend` for the fit: entered at setup, before the module's own setup
    compiles its training graph (a train.py subprocess then compiles with aot_eager, not with Inductor's minutes
    of C++ on a CPU)."""

    def __init__(self, backend: str = "aot_eager") -> None:
        self.backend = backend
        self._within = ExitStack()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._within.enter_context(compiling_with(self.backend))

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._within.close()


def run_in_session(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float, *, warm: bool = False, ranks: int = 1
) -> tuple[int | None, str]:
    """Run `cmd` in a session of its own (a DDP launcher's ranks with it), its output and exit status; past
    `timeout` the whole session is killed and the status is None (the output then says how long it ran).
    warm: forked with the imports done (helpers/warm.py), for runs that test what a run does, not how it starts;
    `ranks` of them started warm, in one process group (warm.popen)."""
    import subprocess

    from helpers import warm as warm_launches

    if ranks != 1 and not warm:
        raise ValueError("ranks > 1 start warm (warm=True); a cold command's ranks are its launcher's")
    launch = functools.partial(warm_launches.popen, ranks=ranks) if warm else subprocess.Popen
    process = launch(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output = process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return None, f"still running after {timeout} s:\n{process.communicate()[0]}"
    return process.returncode, output
