"""Reading a prepared set (`diffusion.data.prepared`) through litdata's `StreamingDataset`, each chunk checked the
first time a process reads it (`diffusion.data.checked_chunks`): a part read whole into memory (`PreparedPart`,
`read_part`: validation sets, the set held on the device, FID's reference), or training batches streamed from a set
that is not held on the device (`StreamLoader`): litdata's `StreamingDataset` and `StreamingDataLoader` read its
chunks from a folder or object storage through a bounded local cache, prefetching, in `num_workers` loading
processes. Stored samples are decoded by `decoded_sample` (PNG / JPEG bytes to uint8 pixels).

What litdata decides for a stream: every rank and loading process reads a disjoint share of each epoch, the same count
of samples on every rank (drop_last), in an order drawn from (seed, epoch): chunks shuffled, then the samples within
each. What `StreamLoader` adds:

- whole global batches: each rank's batches are cut to a multiple of `accumulate_grad_batches`, so every optimizer
  step has the same shape and no step is taken on a partial accumulation;
- the epoch is the Trainer's (litdata counts its own, one ahead, in each loading process);
- exact resume: `state_dict` holds the epoch, the batches this rank has taken and litdata's own position, saved in
  the checkpoint with the rest of the loop's state. On resume the stream starts at the next batch, in the same
  order, on the same loading process (litdata's loader starts on the one whose turn it was). Lightning may hand the
  state back before or after it first iterates (it reads the loader's length for `estimated_stepping_batches`);
  the position is applied when the epoch's iteration starts, and only to the epoch it was saved in;
- batches stay uint8 images (or float32 vectors) until they are on the device, where the DataModule converts and
  flips them (`diffusion.data.on_device.as_batch`): flips a function of (seed, epoch, sample) alone, as for data
  held on the device, so a resumed run draws the same ones.

A resume on another number of processes goes on with the epoch from where it stopped (litdata re-stripes the rest
of the epoch's order over the new ranks; it rounds the position down to whole batches, so at most one global batch
is drawn twice), and says so.
"""

from __future__ import annotations

import io
import pickle
import secrets
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from diffusion.core.guidance import NO_LABEL
from diffusion.data.batch import Batch, StoredBatch
from diffusion.data.image_transform import to_model_units
from diffusion.data.prepared import NO_LABEL_STORED, PreparedSet, litdata


def decoded_sample(item: dict[str, Any]) -> dict[str, Any]:
    """A stored item with its sample as an array: PNG / JPEG bytes decoded to uint8 (C, H, W)."""
    sample = item["sample"]
    if isinstance(sample, bytes | bytearray | memoryview):
        from PIL import Image

        try:
            with Image.open(io.BytesIO(sample)) as image:
                pixels = np.asarray(image)
        except OSError as error:  # damaged bytes: named with their chunk by `CheckedStream`
            raise ValueError(f"an image cannot be decoded ({error})") from error
        sample = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
        item = {**item, "sample": np.ascontiguousarray(sample)}
    return item


def read_part(
    prepared: PreparedSet, part: str, cache_dir: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sample of `part` as one tensor (N, ...) in the stored dtype, at its index, and the (N,) labels."""
    from torch.utils.data import DataLoader

    litdata()
    from litdata.utilities.env import _DistributedEnv

    from diffusion.data.checked_chunks import checked_stream

    dataset = checked_stream(prepared, part, cache_dir=cache_dir, transform=decoded_sample)
    # Every sample, on every rank: litdata would otherwise give this process the share of its DDP rank (it reads the
    # rank from torch.distributed and WORLD_SIZE), and the other ranks' rows would stay unwritten memory.
    dataset.distributed_env = _DistributedEnv(world_size=1, global_rank=0, num_nodes=1)
    n = prepared.counts[part]
    samples = torch.empty(
        (n, *prepared.sample_shape), dtype=torch.uint8 if prepared.kind == "images" else torch.float32
    )
    labels = torch.full((n,), NO_LABEL_STORED, dtype=torch.long)
    read = torch.zeros(n, dtype=torch.bool)
    for batch in DataLoader(dataset, batch_size=1024):
        samples[batch["index"]] = torch.as_tensor(batch["sample"])
        labels[batch["index"]] = batch["label"]
        read[batch["index"]] = True
    if not read.all():  # a row never written holds whatever the memory held: never handed on
        raise RuntimeError(f"read {int(read.sum())} of the {n} samples of {prepared.root}/{part}")
    return samples, labels


class PreparedPart(torch.utils.data.Dataset):
    """A part of a prepared set as a map-style dataset of `Batch(x, index, label)` in model units, item i the sample
    stored with index i: read whole, once, at the first item (validation sets; the held path; FID's reference)."""

    def __init__(
        self, prepared: PreparedSet, part: str, with_labels: bool, cache_dir: str | None = None
    ) -> None:
        self.prepared, self.part, self.with_labels, self.cache_dir = prepared, part, with_labels, cache_dir
        self._tensors: tuple[torch.Tensor, torch.Tensor] | None = None

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(samples (N, ...) as stored, labels (N,)), read at the first call."""
        if self._tensors is None:
            self._tensors = read_part(self.prepared, self.part, self.cache_dir)
        return self._tensors

    def __len__(self) -> int:
        return self.prepared.counts[self.part]

    def __getitem__(self, index: int) -> Any:
        samples, labels = self.tensors()
        x = to_model_units(samples[index]) if self.prepared.kind == "images" else samples[index]
        # An item: its index and label as ints, collated into the batch's tensors.
        return Batch(x, int(index), int(labels[index]) if self.with_labels else NO_LABEL)  # type: ignore[arg-type]


class StreamLoader:
    """The training loader of a streamed prepared set: `StoredBatch`es, resumable mid-epoch (see the module)."""

    def __init__(
        self,
        prepared: PreparedSet,
        batch_size: int,
        num_workers: int,
        seed: int,
        world_size: int = 1,
        rank: int = 0,
        num_nodes: int = 1,
        accumulate: int = 1,
        cache_dir: str | None = None,
        max_cache_size: str | None = None,
        epoch_of: Callable[[], int] | None = None,
        pin_memory: bool = False,
    ) -> None:
        lit = litdata()
        from litdata.utilities.env import _DistributedEnv

        from diffusion.data.checked_chunks import checked_stream

        self.stream = checked_stream(  # each chunk checked against prepared.json the first time it is read
            prepared,
            "train",
            cache_dir=cache_dir,
            max_cache_size=max_cache_size,
            shuffle=True,
            drop_last=True,
            seed=seed,
            transform=decoded_sample,
            # In loading processes, each sample decoded alone: litdata's default decodes a window of 256 around each
            # sample, most of them other processes' (benchmarks/results/prepared_data.md, 32 px raw on 2 processes:
            # 6,774 -> 26,385 images/s); in the training process its window is the faster (47,505).
            batch_decode=0 if num_workers > 0 else "auto",
        )
        # A damaged chunk met in a loading process: raised here as itself (`CheckedStream.errors`). The folder is made
        # by the first refusal, so a run killed with SIGKILL (no finalizer) leaves nothing behind in the common case.
        self.stream.errors = str(Path(tempfile.gettempdir(), f"diffusion-stream-{secrets.token_hex(8)}"))
        weakref.finalize(self, shutil.rmtree, self.stream.errors, ignore_errors=True)
        # The Trainer's ranks, not litdata's guess from the visible GPUs (which miscounts nodes on CPUs).
        self.stream.distributed_env = _DistributedEnv(world_size, rank, num_nodes)
        # Its own generator: a DataLoader draws a seed for its workers each time it starts an epoch, from the global
        # RNG when it has none, which would shift the dropout masks of a resumed run (it starts one more time).
        self.loader = lit.StreamingDataLoader(
            self.stream,
            batch_size=batch_size,
            num_workers=num_workers,
            drop_last=True,
            pin_memory=pin_memory,
            generator=torch.Generator().manual_seed(seed),
        )
        self.num_samples = prepared.counts["train"]  # all ranks together, for the start-up line
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.world_size, self.accumulate = world_size, accumulate
        self._epoch_of = epoch_of
        self._epoch = 0  # the epoch being (or last) iterated
        self._batches = 0  # batches this rank has handed out in it
        self._pending: dict[str, Any] | None = None  # a checkpoint's position, applied as its epoch starts
        self._length: int | None = None

    def __len__(self) -> int:
        """Batches per epoch on this rank: whole accumulation groups."""
        if self._length is None:
            batches = len(self.loader)
            self._length = batches // self.accumulate * self.accumulate or batches
        return self._length

    def __iter__(self) -> Iterator[StoredBatch]:
        epoch = self._epoch_of() if self._epoch_of is not None else self._epoch + (self._batches > 0)
        pending, self._pending = self._pending, None
        self._epoch, self._batches = epoch, 0
        if pending is not None and pending["epoch"] == epoch and 0 < pending["batches"] < len(self):
            self._resume(pending)
        else:
            # A fresh epoch: litdata's loader replays a loaded position until an epoch of it ran to its end, which the
            # cut below never lets it; and it counts epochs from 1, adding one as it starts.
            self.loader.restore = False
            self.loader.current_epoch = epoch
        length = len(self)
        try:
            for batch in self.loader:
                if self._batches >= length:
                    break  # the last, incomplete accumulation group sits out, as for every other loader here
                self._batches += 1
                yield StoredBatch(batch["sample"], batch["index"], batch["label"], epoch, self.seed)
        except Exception:
            # A loading process's refusal of a damaged chunk, which the DataLoader says as a RuntimeError.
            met = sorted(Path(self.stream.errors).glob("*.pickle"))
            if met:
                raise pickle.loads(met[0].read_bytes()) from None
            raise

    def _resume(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state["stream"])
        self._batches = state["batches"]
        if state["world_size"] != self.world_size:
            warnings.warn(
                f"resumed on {self.world_size} processes a stream saved on {state['world_size']}: epoch "
                f"{state['epoch']} goes on from where it stopped, re-striped over the new ranks (at most one global "
                "batch of it is drawn twice); later epochs are whole",
                stacklevel=2,
            )
            self._batches = 0  # this rank's count starts again on the new stripes

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "batches": self._batches,
            "world_size": self.world_size,
            "stream": self.loader.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending = dict(state)

    def describe(self) -> str:
        workers = f"{self.num_workers} loading process{'es' if self.num_workers != 1 else ''}"
        if self.stream.input_dir.url is None:
            return f"streamed by litdata from {self.stream.input_dir.path}, {workers}"
        return (
            f"streamed by litdata, {workers}, cached in {self.stream.cache_dir.path or 'its default cache'}"
        )
