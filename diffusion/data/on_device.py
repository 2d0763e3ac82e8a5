"""The training set held on the training device, each batch gathered and augmented there from the indices the
resumable loader yields.

A dataset held as arrays (the digits, MNIST, Fashion-MNIST, CIFAR-10, vectors, a `.npy` file) is copied once to the
trainer's root device in the dtype it is stored in (uint8 for 8-bit images: CIFAR-10 takes 150 MB). The training
DataLoader (`IndexLoader`) then yields only `IndexBatch(index, epoch, seed)`: the `ResumableSampler`'s order, DDP
shard, whole-global-batch cut and mid-epoch resume as before, in the main process (worker processes would only add
inter-process copies). Lightning moves it to the device and calls the DataModule's `on_after_batch_transfer`, where
`HeldSamples.batch` makes the `Batch(x, index, label)` the per-item loader would have made: gathered, flipped,
converted with the per-image transform's arithmetic (`diffusion.data.image_transform`), so x is bitwise the
loader's wherever nothing is flipped.

Random horizontal flips are counter-based (`diffusion.core.noise`, stream AUGMENTATION): sample i of epoch e is
flipped by a bit that is a function of (the sampler's seed, e, i) alone, so a resumed run, any world size and any
split into batches draw the same flips (a loader's worker processes draw theirs from RNGs a resume does not restore).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset

from diffusion.core.guidance import NO_LABEL
from diffusion.core.noise import AUGMENTATION, noise_key, randint
from diffusion.data.batch import Batch, IndexBatch
from diffusion.data.image_transform import resized, to_model_units
from diffusion.data.resumable import ResumableLoader, ResumableSampler

RESIZE_CHUNK = 1024  # images resized at a time while the held tensors are built: bounds the float copies

# Lightning suggests worker processes for every training loader with fewer than two; the loader of data held on the
# device hands out indices, which workers would only copy between processes. Set at import: a filter added later
# resets the warnings already shown once, which would then show again.
warnings.filterwarnings("ignore", message="The 'train_dataloader' does not have many workers")


class HeldSamples:
    """A whole dataset as tensors, on one device: what each training batch is gathered from.

    Args:
        samples: (N, ...) every sample of the full dataset, indexed as the dataset is: uint8 images (N, C, H, W)
            at the training size when `uint8_images`, else float32 already in model units (digits, vectors).
        labels: (N,) int64 classes of a class-conditional run, else None (batches get NO_LABEL).
        random_flip: flip images horizontally, each sample with probability 1/2 per epoch.
        uint8_images: samples are 8-bit images, converted to model units after the gather.
    """

    def __init__(
        self, samples: torch.Tensor, labels: torch.Tensor | None, random_flip: bool, uint8_images: bool
    ) -> None:
        if labels is not None and labels.shape != samples.shape[:1]:
            raise ValueError(f"{len(labels)} labels for {len(samples)} samples")
        self.samples, self.labels = samples, labels
        self.random_flip, self.uint8_images = random_flip, uint8_images

    @property
    def device(self) -> torch.device:
        return self.samples.device

    @property
    def nbytes(self) -> int:
        labels = 0 if self.labels is None else self.labels.nbytes
        return self.samples.nbytes + labels

    def to(self, device: torch.device) -> HeldSamples:
        labels = None if self.labels is None else self.labels.to(device)
        return HeldSamples(self.samples.to(device), labels, self.random_flip, self.uint8_images)

    def batch(self, index: torch.Tensor, epoch: int, seed: int) -> Batch:
        """The `Batch(x, index, label)` of the samples `index` (B,), on this device."""
        index = index.to(self.device, non_blocking=True)
        x = self.samples.index_select(0, index)  # (B, ...) in the stored dtype
        labels = None if self.labels is None else self.labels.index_select(0, index)
        return as_batch(x, index, labels, self.uint8_images, self.random_flip, epoch, seed)

    def describe(self) -> str:
        """'on cuda:0 (153.6 MB uint8), batched there, flips per sample' for the start-up line."""
        flips = ", flips per sample" if self.random_flip else ""
        return f"on {self.device} ({megabytes(self.nbytes)} {dtype_name(self.samples)}), batched there{flips}"


def as_batch(
    x: torch.Tensor,
    index: torch.Tensor,
    labels: torch.Tensor | None,
    uint8_images: bool,
    random_flip: bool,
    epoch: int,
    seed: int,
) -> Batch:
    """The `Batch` of samples `x` (B, ...) as stored (uint8 images, or model units), on their device: converted to
    model units and flipped by `random_flips`; labels None (or NO_LABEL values) for an unconditional set."""
    if uint8_images:
        x = to_model_units(x)
    # Flipped after the conversion, which it commutes with: a CPU flips uint8 several times slower than float.
    if random_flip:
        flip = random_flips(index, epoch, seed).view(-1, *[1] * (x.ndim - 1))  # (B, 1, 1, 1)
        x = torch.where(flip, x.flip(-1), x)
    return Batch(x, index, torch.full_like(index, NO_LABEL) if labels is None else labels)


def random_flips(index: torch.Tensor, epoch: int, seed: int) -> torch.Tensor:
    """(B,) bool: which of the samples `index` (B,) epoch `epoch` flips, each with probability 1/2; a function of
    (seed, epoch, index) alone, on the device of `index`."""
    return randint(2, noise_key(seed, AUGMENTATION, epoch), index).bool()


def held_images(
    images: torch.Tensor, labels: torch.Tensor | None, size: int, random_flip: bool
) -> HeldSamples:
    """HeldSamples of uint8 images (N, C, H, W), resized to `size` where they are not (as the per-image transform
    resizes each image, a chunk of images at a time so the interpolation's float copies stay small)."""
    if tuple(images.shape[-2:]) != (size, size):
        images = torch.cat([resized(chunk, size) for chunk in images.split(RESIZE_CHUNK)])
    return HeldSamples(images.contiguous(), labels, random_flip, uint8_images=True)


def room_for(nbytes: int, device: torch.device, in_host_memory: bool = True) -> str | None:
    """None when `nbytes` of data may be held on `device`; else why not, as a clause. `in_host_memory`: the data is
    in this process's memory already (arrays), not read from files (a prepared set)."""
    if device.type == "cpu" and in_host_memory:
        return None  # the memory the per-item loader holds it in anyway
    if device.type == "cpu":
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        # A quarter of the machine's memory, as a GPU's quarter below: the rest is the run's and its workers'.
        if nbytes <= total // 4:
            return None
        return f"its {megabytes(nbytes)} would take more than a quarter of this machine's {megabytes(total)}"
    if device.type != "cuda":
        return f"no memory rule for {device.type} devices here"
    free, total = torch.cuda.mem_get_info(device)
    # The rest of the card is the network's: weights, optimizer state, activations, the compiler's and cuDNN's
    # workspaces and the caching allocator's slack. A quarter of the card (and half of what is free, as other
    # processes may hold some of it) keeps the data from ever being what runs a training out of memory, and
    # still holds every dataset this project names: CIFAR-10 is 0.2% of an 80 GB card.
    limit = min(total // 4, free // 2)
    if nbytes <= limit:
        return None
    return (
        f"its {megabytes(nbytes)} would take more than a quarter of {device}'s {megabytes(total)} or half of the "
        f"{megabytes(free)} free"
    )


class TrainingIndices(Dataset):
    """The training split as the full dataset's indices: item p is the index of the split's p-th sample."""

    def __init__(self, indices: list[int] | torch.Tensor) -> None:
        self.indices = torch.as_tensor(indices, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> int:
        return int(self.indices[position])

    def __getitems__(self, positions: list[int]) -> torch.Tensor:  # a whole batch in one gather
        return self.indices[positions]


def keep_tensor(batch: torch.Tensor) -> torch.Tensor:
    """The collate function of `IndexLoader`: `TrainingIndices.__getitems__` returns the batch already."""
    return batch


class IndexLoader(ResumableLoader):
    """The training loader of the on-device path: `IndexBatch(index, epoch, seed)` in the ResumableSampler's order
    (its state_dict and mid-epoch resume are ResumableLoader's)."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator over DataLoader's iterator
        sampler = self.sampler
        seed = sampler.seed if isinstance(sampler, ResumableSampler) else 0  # 0: replaced (overfit_batches)
        for index in super().__iter__():
            yield IndexBatch(index, self._epoch, seed)


def megabytes(nbytes: int) -> str:
    if nbytes < 1e6:
        return f"{nbytes / 1e3:.1f} kB"
    return f"{nbytes / 1e6:,.1f} MB" if nbytes < 1e10 else f"{nbytes / 1e9:,.1f} GB"


def dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")
