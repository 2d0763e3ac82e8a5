"""The batch contract between data modules and the training module: `Batch(x, index, label)`, and the check
that turns anything else into one clear error; `IndexBatch`, what the training loader of data held on the device
yields before its DataModule makes a `Batch` of it."""

from collections.abc import Callable
from numbers import Integral
from typing import Any, NamedTuple

import numpy as np
import torch

from diffusion.core.guidance import NO_LABEL
from diffusion.core.noise import WrongDtype
from diffusion.data.labels import check_labels
from diffusion.errors import InvalidValue, WrongType


class BatchFields(NamedTuple):
    """`Batch`'s fields (a NamedTuple cannot check its own arguments: `Batch` subclasses it to)."""

    x: torch.Tensor
    """(B, C, H, W) images or (B, D) vectors in model units (a dataset item: one sample)."""
    index: torch.Tensor  # type: ignore[assignment]  # the contract's name, over tuple.index
    """(B,) int64 positions in the full dataset (an item: an int); they seed per-sample noise."""
    label: torch.Tensor | int | None = NO_LABEL
    """(B,) int64 classes 0..num_classes-1, or NO_LABEL (an item: an int); used by class-conditional models."""


class Batch(BatchFields):
    """What the training module takes: samples in model units and their indices in the full dataset.

    Checked as it is built (a user's DataModule yields it: a mistake there was found, if at all, deep inside
    training): a batch's ``x`` is a tensor, its ``index`` a 1-D integer tensor of one position per sample, its
    ``label`` None, an int (NO_LABEL) or an integer tensor of the index's shape; an item's (a dataset's, before
    the DataLoader stacks them) ``index`` is an int, or a 0-d integer tensor (`torch.tensor(i)`), taken as its
    int. Types and shapes only, no values: it is built every step."""

    __slots__ = ()

    def __new__(
        cls, x: torch.Tensor, index: torch.Tensor, label: torch.Tensor | int | None = NO_LABEL
    ) -> "Batch":
        if isinstance(index, torch.Tensor) and index.ndim == 0:  # an item's position, never a batch's
            index = item_position(index)  # type: ignore[assignment]  # an item's index is an int
        check_fields(x, index, label)
        return super().__new__(cls, x, index, label)


WRAP = "wrap your dataset in diffusion.data.IndexedDataset, whose items the DataLoader stacks into Batches"


def item_position(index: torch.Tensor) -> int:
    """The int of an item's 0-d `index` tensor (`torch.tensor(i)`): the DataLoader stacks it as it stacks an int
    (into the batch's (B,) positions), so it is taken, as that int; one of no integer refused naming `index`."""
    if not _integers(index):
        raise InvalidValue(
            f"index is a {index.dtype} tensor of shape (), and an item's index is its position in the dataset,"
            " a whole number",
            f"pass the index as an int: int(i); {WRAP}",
        )
    return int(index)


def check_fields(x: Any, index: Any, label: Any) -> None:
    """`Batch`'s fields (see its docstring): WrongType or InvalidValue naming the field; O(1)."""
    if isinstance(index, torch.Tensor):  # a batch
        if not isinstance(x, torch.Tensor):
            raise WrongType(
                "x", x, "a tensor of samples", f"pass the samples as a tensor (torch.as_tensor(x)); {WRAP}"
            )
        if index.ndim == 2 and index.shape[1] == 1 and _integers(index) and x.ndim and len(x) == len(index):
            raise InvalidValue(  # what the DataLoader stacks from items whose index is torch.tensor([i])
                f"index is a {index.dtype} tensor of shape {tuple(index.shape)}, not a 1-D integer tensor:"
                " the DataLoader stacks such a column from items whose index is a 1-element tensor"
                " (torch.tensor([i]))",
                "give each item its index as an int: Batch(x, int(i)) in your dataset's __getitem__"
                f" (a batch: index.flatten()); {WRAP}",
            )
        if index.ndim != 1 or not _integers(index):
            raise InvalidValue(
                f"index is a {index.dtype} tensor of shape {tuple(index.shape)}, not a 1-D integer tensor",
                f"pass one int64 position per sample (torch.arange(len(x)) for a batch of the whole data); {WRAP}",
            )
        if x.ndim == 0 or len(x) != len(index):
            raise InvalidValue(
                f"index holds {len(index)} positions for {len(x) if x.ndim else 'no'} samples (x of shape "
                f"{tuple(x.shape)})",
                f"pass one position per sample; {WRAP}",
            )
        if isinstance(label, torch.Tensor) and (label.shape != index.shape or not _integers(label)):
            raise InvalidValue(
                f"label is a {label.dtype} tensor of shape {tuple(label.shape)}, not integer classes of the "
                f"index's shape {tuple(index.shape)}",
                f"pass one int64 class per sample, or leave label out for an unconditional model; {WRAP}",
            )
    elif isinstance(index, bool) or not isinstance(index, Integral):  # an item: its position
        raise WrongType("index", index, "an int (an item) or a 1-D integer tensor (a batch)", WRAP)
    elif not isinstance(x, torch.Tensor | np.ndarray):  # a PIL image, None: torch's collate error, at the fit
        raise WrongType(
            "x", x, "a tensor of one sample",
            "make each item's x a tensor: a dataset of PIL images takes a transform, e.g. IndexedDataset(data, "
            "transform=lambda image: torchvision.transforms.functional.to_tensor(image) * 2 - 1) for model units "
            "-1..1",
        )  # fmt: skip
    elif isinstance(label, torch.Tensor) and (label.ndim != 0 or not _integers(label)):
        raise InvalidValue(
            f"label is a {label.dtype} tensor of shape {tuple(label.shape)}, and an item's label is one class",
            f"pass an int; {WRAP}",
        )
    if (
        label is not None
        and not isinstance(label, torch.Tensor)
        and (isinstance(label, bool) or not isinstance(label, Integral))
    ):
        raise WrongType(
            "label",
            label,
            "a class (an int) or integer classes (a tensor)",
            f"pass int classes, or leave label out; {WRAP}",
        )


def _integers(tensor: torch.Tensor) -> bool:
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


class IndexBatch(NamedTuple):
    """What the training loader yields for data held on the device (`diffusion.data.on_device`); the DataModule's
    `on_after_batch_transfer` turns it into a `Batch` there."""

    index: torch.Tensor  # type: ignore[assignment]  # the contract's name, over tuple.index
    """(B,) int64 positions in the full dataset, in the sampler's order."""
    epoch: int
    """The sampler's epoch: with `seed`, what the flips are drawn from."""
    seed: int
    """The sampler's seed (PL_GLOBAL_SEED)."""


class StoredBatch(NamedTuple):
    """What the training loader of a streamed prepared set yields (`diffusion.data.streaming`): samples as stored,
    made a `Batch` by the DataModule's `on_after_batch_transfer` once on the device."""

    samples: torch.Tensor
    """(B, C, H, W) uint8 images or (B, D) float32 vectors in model units."""
    index: torch.Tensor  # type: ignore[assignment]  # the contract's name, over tuple.index
    """(B,) int64 positions in the prepared set's training part."""
    label: torch.Tensor
    """(B,) int64 classes, -1 where the set holds none."""
    epoch: int
    seed: int


def check_sample_shape(
    x: torch.Tensor,
    sample_shape: tuple[int, ...],
    owner: str,
    which: str,
    network_check: Callable[[tuple[int, ...]], None] | None = None,
) -> None:
    """Refuse a `which` ("training", "validation") batch whose samples are not of the `sample_shape` its `owner`
    (the module's class name) was built with: it would train on one shape and sample another. Where the network
    cannot take the data's shape either, its own check (`network_check`) says so first (its fix is the network's).
    Shapes only (no read of the device: it runs every step); train.py sets sample_shape from the data."""
    if x.shape[1:] != sample_shape:
        data_shape = tuple(x.shape[1:])
        if network_check is not None:
            network_check(data_shape)
        raise InvalidValue(
            f"the {which} batch's samples have shape {data_shape}, and this {owner} was built with sample_shape "
            f"{sample_shape}: it would train on one shape and sample the other",
            f"build the {owner} with sample_shape={data_shape} (the data's), or resize the data to {sample_shape}",
        )


def check_batch(batch: Any, num_classes: int | None = None) -> Batch:
    """The training batch, or a clear error for a DataModule that does not yield `Batch(x, index)`, or (for a
    class-conditional model, `num_classes` set) whose labels are missing or out of range, or whose samples are not
    floats (uint8 images would train on their raw 0..255 values). Metadata only: it runs every step (the first
    batch's label values are checked by `diffusion.training.divergence.FirstBatch`).

    The returned batch's label is None for an unconditional model (its labels, if any, are not used)."""
    if isinstance(batch, IndexBatch | StoredBatch):
        raise TypeError(
            "training got a batch as its DataModule stores it (indices of data held on the device, or a streamed batch "
            "not yet converted), not a Batch: its DataModule's "
            "on_after_batch_transfer makes the Batch — pass the DataModule to fit (trainer.fit(model, "
            "datamodule=dm)) rather than its train_dataloader(), or build it with on_device=False"
        )
    if not isinstance(batch, Batch):
        raise TypeError(
            f"training batches must be diffusion.data.Batch(x, index), got {type(batch).__name__}; wrap your "
            "dataset in diffusion.data.IndexedDataset (the index seeds per-sample noise)"
        )
    # Metadata only: integer images would train on their raw 0..255 values.
    if not batch.x.is_floating_point():
        raise WrongDtype(
            "batch x",
            batch.x,
            "floating point in model units (floats in [-1, 1])",
            "convert them in your dataset: x.float() / 127.5 - 1 for 0..255 images, as the project's data modules "
            "do (x.float() for data already in model units)",
        )
    if num_classes is None:
        return batch._replace(label=None)
    labels = batch.label
    if (
        not isinstance(labels, torch.Tensor)
        or labels.shape != batch.index.shape
        or labels.is_floating_point()
    ):
        raise InvalidValue(
            f"a class-conditional model (num_classes={num_classes}) needs Batch(x, index, label) with integer "
            f"labels of shape {tuple(batch.index.shape)}, got {labels!r:.80}",
            "train with {LightningDataModule:--conditional} true, or build IndexedDataset(..., with_labels=True)",
        )
    # Values are checked where it is free (CPU): on a GPU it would cost a sync every step, and nn.Embedding
    # rejects a bad label there anyway (less readably).
    if labels.device.type == "cpu":
        check_labels(labels, num_classes, "batch labels")
    return batch
