"""Exact resume: what a checkpoint carries, besides weights, so that a run killed at any step and resumed from
its last checkpoint ends with the weights of a run left alone.

Lightning restores the weights, the optimizer and LR scheduler, the loop counters, callback states (EMA) and
the state of a *stateful* training DataLoader. The rest of what decides the next step is here:

- where the epoch stopped: `ResumableLoader` counts the batches it handed out and `ResumableSampler` starts
  the epoch's order there again (Lightning saves and restores the loader's `state_dict`);
- the random streams of every rank: the training-noise generator (fast noise mode, the module's) and the
  global RNGs that dropout and data augmentation draw from. Only rank 0 writes the checkpoint, so every rank's
  states are gathered into it while it is saved (`gather_from_ranks`).

`describe_batches` is the line a run starts with: its global batch, and how `ResumableSampler` cuts each epoch
into whole global batches.

A resume is also refused when it would change what the run trains (`check_same_training_settings`: the
checkpoint's optimizer state, EMA and data order belong to the run's own settings).

Reproduced (same world size): the data order, noise, timesteps, dropout masks and augmentations drawn in the
main process (num_workers=0) and the flips of data held on the device (`diffusion.data.on_device`: a function of
(seed, epoch, sample)), whichever step the checkpoint was taken at. Not reproduced: augmentations drawn in
DataLoader worker processes after a mid-epoch resume (workers restart from their epoch's seed); and with a
different world size (a warning says so), the noise and dropout streams (each rank restarts from (seed, step,
rank)) and the rest of the interrupted epoch: it continues from the same place in the epoch's order, but
Lightning still counts that epoch's batches as the old world size would, so a few of its samples may be
skipped or seen twice. Later epochs are whole.
"""

import itertools
import math
from collections.abc import Iterator, Sized
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, DistributedSampler


class ResumableSampler(DistributedSampler):
    """DistributedSampler (the very order Lightning would inject) that can start an epoch part-way.

    Positions count entries of the epoch's global order (the padded permutation that rank r reads at r, r + W,
    r + 2W, ...), so a position means the same samples whatever the world size.

    With `global_batch` (samples per optimizer step, all ranks and accumulated micro-batches together), each
    epoch's order is cut to whole global batches: every step then has the same shape (a compiled network is
    not compiled again for a ragged last batch) and the same samples whatever the split into processes and
    accumulation (Lightning would scale an incomplete accumulation group by 1/k, and DDP pads the last
    shards with repeated samples). The order is the same permutation, so the samples cut off differ from
    epoch to epoch. A dataset smaller than one global batch is kept whole (each epoch one smaller step).
    """

    def __init__(self, *args: Any, global_batch: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        whole = len(self.dataset) // global_batch * global_batch if global_batch else 0  # type: ignore[arg-type]
        if whole and global_batch % self.num_replicas == 0:  # type: ignore[operator]  # whole: global_batch set
            # DistributedSampler.__iter__ cuts its order at total_size when drop_last is set.
            self.drop_last, self.total_size, self.num_samples = True, whole, whole // self.num_replicas
        self._resume_at: tuple[int, int] | None = None  # (epoch, position) from a checkpoint
        self._skip = 0  # items of this rank's share to skip in the next iteration

    def resume_at(self, epoch: int, position: int) -> None:
        self._resume_at = (epoch, position)
        self.set_epoch(epoch)  # Lightning sets it again before the epoch runs; this covers eager iterators

    def start_position(self) -> int:
        """Called once as an iteration begins: the position it starts at (0 unless resuming this epoch)."""
        resume, self._resume_at = self._resume_at, None
        # Every rank skips the same count, so all ranks run the same number of batches (no collective waits).
        self._skip = resume[1] // self.num_replicas if resume and resume[0] == self.epoch else 0
        return self._skip * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        skip, self._skip = self._skip, 0
        return itertools.islice(super().__iter__(), skip, None)


class ResumableLoader(DataLoader):
    """A DataLoader over a `ResumableSampler` whose place in the epoch is saved in checkpoints.

    It counts the batches it has handed out (not those its workers prefetched), so a checkpoint taken after
    batch k of an epoch resumes at batch k + 1. Lightning calls `state_dict` when saving and `load_state_dict`
    when resuming any training loader that has both. Its `generator` (for worker seeds) is reseeded by
    (seed, epoch), so creating an iterator never draws from the global RNG that dropout uses.
    """

    _epoch = 0
    _position = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator: runs at the first batch, after Lightning's set_epoch
        sampler = self.sampler
        if not isinstance(sampler, ResumableSampler):
            yield from super().__iter__()  # the sampler was replaced (overfit_batches): not resumable
            return
        self._epoch, self._position = sampler.epoch, sampler.start_position()
        if self.generator is not None:
            self.generator.manual_seed(sampler.seed * 1_000_003 + sampler.epoch)
        for batch in super().__iter__():
            self._position += self.batch_size * sampler.num_replicas  # type: ignore[operator]  # batched
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if isinstance(self.sampler, ResumableSampler):
            self.sampler.resume_at(int(state["epoch"]), int(state["position"]))


def describe_batches(trainer: L.Trainer) -> str:
    """'N samples, B per device x W processes x A accumulation = global batch G, S optimizer steps per epoch', and
    on a second line how batches are made: 'training data: held on cuda:0: ...' (`SplitDataModule.data_path`).

    Each epoch is cut to whole global batches (`ResumableSampler`): S = N // G, and the N - S x G samples left
    over sit out that epoch (others the next). A dataset smaller than one global batch is kept whole:
    DistributedSampler pads it to ceil(N / (B x W)) batches per rank, and Lightning steps the optimizer every
    A batches and at the end of the epoch.
    """
    world, accumulate = trainer.world_size, trainer.accumulate_grad_batches  # world = devices x nodes
    loader = trainer.train_dataloader
    dataset, batch_size = getattr(loader, "dataset", None), getattr(loader, "batch_size", None)
    samples = getattr(loader, "num_samples", None)  # a streamed set's, all ranks together
    if samples is None and isinstance(dataset, Sized):
        samples = len(dataset)
    if batch_size is None or samples is None:  # an iterable dataset
        return f"{world} processes x {accumulate} accumulation"
    batches = trainer.num_training_batches
    steps = "?" if math.isinf(batches) else str(math.ceil(batches / accumulate))
    line = (
        f"{samples} samples, {batch_size} per device x {world} processes x {accumulate} accumulation "
        f"= global batch {batch_size * world * accumulate}, {steps} optimizer steps per epoch"
    )
    sampler = getattr(loader, "sampler", None)
    left_over = samples - sampler.total_size if isinstance(sampler, ResumableSampler) else 0
    if left_over > 0:
        line += f" (a random {left_over} sit out each epoch: steps of whole global batches)"
    elif samples < batch_size * world * accumulate:
        line += " (fewer samples than one global batch: each epoch is one smaller step)"
    data_path = getattr(getattr(trainer, "datamodule", None), "data_path", None)
    return line if data_path is None else f"{line}\ntraining data: {data_path}"
