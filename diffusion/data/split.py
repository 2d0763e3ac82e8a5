"""The dataset contract and the train/validation split every DataModule of this project shares.

Every dataset item is a `Batch` ``(x, index)`` (`IndexedDataset` wraps any dataset so): ``x`` a float32 tensor in
model units and ``index`` the sample's position in the full dataset, which per-sample noise is seeded with, so
the noise a sample gets does not depend on which rank or batch it lands in. A third field, ``label``, holds the
class of each sample for class-conditional training and `NO_LABEL` otherwise.

``batch_size`` is per device: the global batch is ``batch_size x devices x num_nodes x accumulate_grad_batches``.
The training loader is resumable mid-epoch (`diffusion.data.resumable`). A dataset held as arrays is batched on the
training device (`diffusion.data.on_device`) unless ``on_device`` is False; other datasets are read item by item
by a DataLoader (and its ``num_workers`` worker processes).
"""

import os
from collections.abc import Callable, Iterator, Sized
from typing import Any, cast

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Subset, default_collate, get_worker_info

from diffusion.core.guidance import NO_LABEL
from diffusion.data.batch import Batch, IndexBatch, StoredBatch
from diffusion.data.labels import item_label
from diffusion.data.on_device import (
    HeldSamples,
    IndexLoader,
    TrainingIndices,
    as_batch,
    keep_tensor,
    room_for,
)
from diffusion.data.prepared import PreparedSet
from diffusion.data.resumable import ResumableLoader, ResumableSampler
from diffusion.data.split_options import check_streaming_options, checked_split_options
from diffusion.data.streaming import PreparedPart, StreamLoader
from diffusion.errors import InvalidValue, UserError, WrongType, check_bool

# Items read at once when a command collects a data set's images (evaluation's reference, the bound's held-out
# images), not training's batches (--data.batch_size).
READING_BATCH = 500


class FailedItem:
    """An item a DataLoader worker could not read for a fault of the user's data (a corrupt image): its UserError
    carried to the main process as data, where `SplitDataModule.on_after_batch_transfer` raises it as itself. A
    worker's exception reaches the main process only as its type and traceback text, which no code reads."""

    def __init__(self, error: UserError) -> None:
        self.error = error


def collate_or_failed(items: list[Any]) -> Any:
    """The batch of `items`, or the first FailedItem among them."""
    failed = next((item for item in items if isinstance(item, FailedItem)), None)
    return failed if failed is not None else default_collate(items)


class IndexedDataset(Dataset):
    """Wraps any dataset so that items become ``Batch(x, index, label)``: from a tuple item (x, label, ...) it keeps
    x, and the label too when ``with_labels`` (otherwise the label is NO_LABEL)."""

    def __init__(
        self, base: Dataset, transform: Callable[[Any], Any] | None = None, with_labels: bool = False
    ) -> None:
        if not (hasattr(base, "__len__") and hasattr(base, "__getitem__")) or isinstance(base, str | bytes):
            # None or an iterable-style dataset failed at the first len() or item, in torch's words
            fix = "pass a torch Dataset with __len__ and __getitem__, or a list of items"
            raise WrongType("base", base, "a map-style dataset (with __len__ and __getitem__)", fix)
        if transform is not None and not callable(transform):
            raise WrongType("transform", transform, "a callable", "pass a function of an item's x, or None")
        self.base = base
        self.transform = transform
        self.with_labels = check_bool("with_labels", with_labels)

    def __len__(self) -> int:
        return len(cast(Sized, self.base))  # torch's Dataset declares no __len__; every map-style one has it

    def __getitem__(self, index: int) -> Batch | FailedItem:
        try:
            x = self.base[index]
            label = item_label(x, index) if self.with_labels else NO_LABEL
        except UserError as error:
            if get_worker_info() is None:
                raise
            return FailedItem(error)
        if isinstance(x, tuple | list):
            x = x[0]
        if self.transform is not None:
            x = self.transform(x)
        # An item's index is an int, which default_collate stacks into the (B,) tensor that Batch declares.
        return Batch(x, cast(torch.Tensor, int(index)), label)


class SplitDataModule(LightningDataModule):
    """Shared train/val split and dataloaders; subclasses call ``_split`` in ``setup``.

    Either ``val_fraction`` of the data is held out, or (``val_from_train=N``, with ``val_fraction=0``) the
    model trains on all of it and validates on a fixed random subset of N training samples, as Ho et al.
    train CIFAR-10 on all 50,000 images.

    Training batches come one of two ways (``data_path`` says which, and the run prints it as it starts):

    - on the device (``on_device``, the default, where the subclass holds the data as arrays, `_held_samples`, and
      they fit, `diffusion.data.on_device.room_for`): the whole dataset is copied to the trainer's root device
      once, the training loader yields indices only and `on_after_batch_transfer` gathers, flips and converts
      each batch there;
    - by a DataLoader over the dataset's items, in ``num_workers`` worker processes (``on_device=False``, image
      files, a dataset that does not fit). Validation always takes this way.

    Both give the same batches: the same samples in the same order, bitwise the same x where nothing is flipped.
    """

    def __init__(
        self,
        batch_size: int,
        num_workers: int,
        val_fraction: float,
        seed: int,
        val_from_train: int | None = None,
        on_device: bool = True,
        cache_dir: str | None = None,
        max_cache_size: str | None = None,
    ) -> None:
        super().__init__()
        batch_size, num_workers, val_fraction, seed, val_from_train = checked_split_options(
            type(self), batch_size, num_workers, val_fraction, seed, val_from_train
        )
        self.val_from_train = val_from_train
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.val_fraction = val_fraction
        self.seed = seed
        self.on_device = on_device
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self._held: HeldSamples | None = None  # the training data on its device, once copied there
        # A prepared set (diffusion.data.prepared) the subclass trains on, with its streaming cache's settings.
        self.prepared: PreparedSet | None = None
        self.cache_dir, self.max_cache_size = cache_dir, max_cache_size
        self._data_path = "not chosen yet: no training loader built"

    # The state below is None until made (train_set by setup; prepared for a prepared set alone): read where it is
    # None, it is a bug of ours, not the user's.
    @property
    def _training_set(self) -> Dataset:
        if self.train_set is None:
            raise RuntimeError(f"{type(self).__name__}.train_set is read before setup() made it")
        return self.train_set

    @property
    def _training_split(self) -> Subset:
        """The held paths index the full dataset through the split's indices (`_hold_on` holds a Subset's alone)."""
        if not isinstance(self._training_set, Subset):
            raise RuntimeError(f"{type(self).__name__}.train_set is no Subset, yet its data is held")
        return self._training_set

    @property
    def _prepared_set(self) -> PreparedSet:
        if self.prepared is None:
            raise RuntimeError(f"{type(self).__name__} reads a prepared set on a path that has none")
        return self.prepared

    def _split(self, full: Dataset) -> None:
        n = len(cast(Sized, full))  # as IndexedDataset's
        # A fixed generator: the same seed gives the same split on every rank and every run.
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        if self.val_from_train is not None:
            if self.val_from_train > n:
                raise InvalidValue(
                    f"{{--val_from_train}} {self.val_from_train} is more than the {n} training samples",
                    f"pass {{--val_from_train}} {n} or less",
                    type(self),
                )
            self.train_set = Subset(full, list(range(n)))
            self.val_set = Subset(full, perm[: self.val_from_train].sort().values.tolist())
            return
        n_val = max(1, round(n * self.val_fraction)) if self.val_fraction > 0 else 0
        if n - n_val < 1:
            raise InvalidValue(
                f"{{--val_fraction}} {self.val_fraction} leaves none of the {n} samples for training",
                "add data or set {--val_fraction} 0",
                type(self),
            )
        self.val_set = Subset(full, perm[:n_val].sort().values.tolist()) if n_val else None
        self.train_set = Subset(full, perm[n_val:].sort().values.tolist())

    def _check_streaming_options(self) -> None:
        """The cache options apply to a prepared set alone (`diffusion.data.split_options`)."""
        check_streaming_options(type(self), self.prepared is not None, self.cache_dir, self.max_cache_size)

    def _prepared_split(self, with_labels: bool) -> None:
        """The prepared set's own parts as the training and validation sets (its split was made by prepare)."""
        prepared = self._prepared_set
        train = PreparedPart(prepared, "train", with_labels, self.cache_dir)
        self.train_set = Subset(train, list(range(len(train))))
        if "val" in prepared.counts:
            val = PreparedPart(prepared, "val", with_labels, self.cache_dir)
            self.val_set = Subset(val, list(range(len(val))))

    def _prepared_held(self, with_labels: bool, random_flip: bool) -> HeldSamples:
        part = self._training_split.dataset
        if not isinstance(part, PreparedPart):
            raise RuntimeError(f"{type(self).__name__}'s training split is not of its prepared set")
        samples, labels = part.tensors()
        images = self._prepared_set.kind == "images"
        return HeldSamples(samples, labels if with_labels else None, random_flip, uint8_images=images)

    def _loader(self, dataset: Dataset, loader: type[DataLoader] = DataLoader, **kwargs: Any) -> DataLoader:
        return loader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            drop_last=False,
            collate_fn=collate_or_failed,
            **kwargs,
        )

    def train_dataloader(self) -> DataLoader | StreamLoader:
        root = getattr(getattr(self.trainer, "strategy", None), "root_device", None)
        return self._train_loader(root if root is not None else torch.device("cpu"))

    def _train_loader(self, device: torch.device) -> DataLoader | StreamLoader:
        if self.train_set is None:
            self.setup("fit")
        train_set, trainer = self._training_set, self.trainer
        world = trainer.world_size if trainer is not None else 1
        accumulate = getattr(trainer, "accumulate_grad_batches", 1) if trainer is not None else 1
        # The DistributedSampler(shuffle=True, seed=PL_GLOBAL_SEED) Lightning would inject under DDP, built
        # here for every world size: with one replica it yields the very permutation DDP splits across ranks
        # (a 1-process run and an N-process run see the same samples in each global batch), and it resumes
        # mid-epoch at the next batch (diffusion.data.resumable). Lightning sees a DistributedSampler, injects none,
        # and calls set_epoch on it every epoch. Each epoch is cut to whole optimizer steps (global_batch).
        sampler = ResumableSampler(
            train_set,
            num_replicas=world,
            rank=trainer.global_rank if trainer is not None and world > 1 else 0,
            shuffle=True,
            seed=int(os.environ.get("PL_GLOBAL_SEED", 0)),
            drop_last=False,
            global_batch=self.batch_size * world * accumulate,
        )
        if self._hold_on(device) is None and self.prepared is not None:
            return self._stream_loader(device, world, accumulate)
        if self._hold_on(device) is None:
            return self._loader(train_set, ResumableLoader, sampler=sampler, generator=torch.Generator())
        return IndexLoader(
            TrainingIndices(torch.as_tensor(self._training_split.indices)),
            batch_size=self.batch_size,
            sampler=sampler,
            # TrainingIndices.__getitems__ gives it the batch as one tensor, not the list DataLoader declares.
            collate_fn=cast(Callable[[list[Any]], Any], keep_tensor),
            pin_memory=device.type == "cuda",
            generator=torch.Generator(),
        )

    def _stream_loader(self, device: torch.device, world: int, accumulate: int) -> StreamLoader:
        trainer = self.trainer
        loader = StreamLoader(
            self._prepared_set,
            self.batch_size,
            self.num_workers,
            seed=int(os.environ.get("PL_GLOBAL_SEED", 0)),
            world_size=world,
            rank=trainer.global_rank if trainer is not None and world > 1 else 0,
            num_nodes=getattr(trainer, "num_nodes", 1) if trainer is not None else 1,
            accumulate=accumulate,
            cache_dir=self.cache_dir,
            max_cache_size=self.max_cache_size,
            epoch_of=(lambda: trainer.current_epoch) if trainer is not None else None,
            pin_memory=device.type == "cuda",
        )
        self._data_path = f"{loader.describe()} ({self._not_held})"
        return loader

    def _hold_on(self, device: torch.device) -> HeldSamples | None:
        """The training data on `device` (copied there once), or None for the per-item loader; sets `data_path`."""
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.on_device and self._held is not None and self._held.device == device:
            return self._held
        self._held, held = None, None
        reason: str | None = "on_device=False"
        if self.on_device and self.prepared is not None:  # sized before it is read
            nbytes = self.prepared.counts["train"] * self.prepared.sample_nbytes
            reason = room_for(nbytes, device, in_host_memory=False)
        elif self.on_device:
            reason = None
        if self.on_device and reason is None:
            held = self._held_samples() if isinstance(self.train_set, Subset) else None
            reason = self._not_held_reason() if held is None else room_for(held.nbytes, device)
        if held is not None and reason is None:  # read and room for it
            self._held = held.to(device)
            self._data_path = f"held {self._held.describe()}"
        else:
            self._not_held = reason
            workers = f"{self.num_workers} worker process{'es' if self.num_workers != 1 else ''}"
            self._data_path = f"per-item DataLoader, {workers} ({reason})"
        return self._held

    def _held_samples(self) -> HeldSamples | None:
        """The whole dataset as tensors in host memory, indexed as the dataset is (None: read it item by item).
        Called after `setup`; subclasses that hold their data as arrays return them."""
        return None

    def _not_held_reason(self) -> str:
        """Why `_held_samples` gives None, for `data_path`."""
        return f"{type(self).__name__} does not hold its data as arrays"

    @property
    def data_path(self) -> str:
        """How training batches are made, as the start-up line prints it: 'held on cuda:0 (153.6 MB uint8),
        batched there, flips per sample' or 'per-item DataLoader, 8 worker processes (<why>)'."""
        return self._data_path

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Lightning calls it on every batch once it is on the device: the training loader's `IndexBatch` becomes
        the `Batch` it names (gathered, flipped, converted there); a worker's FailedItem raises its error; any
        other batch is left as it is."""
        if isinstance(batch, FailedItem):
            raise batch.error
        if isinstance(batch, IndexBatch):
            if self._held is None:
                raise RuntimeError("an IndexBatch reached a DataModule that holds no data on a device")
            return self._held.batch(batch.index, batch.epoch, batch.seed)
        if isinstance(batch, StoredBatch):
            # A subclass's own names (those of a conditional run); the base class declares none.
            labels = batch.label if getattr(self, "class_names", None) is not None else None
            images = self._prepared_set.kind == "images"
            flips = images and bool(getattr(self, "random_flip", False))
            return as_batch(batch.samples, batch.index, labels, images, flips, batch.epoch, batch.seed)
        return batch

    def training_batches(self, device: torch.device | str = "cpu") -> Iterator[Batch]:
        """One epoch of training batches on `device`, as `training_step` gets them from the Trainer (whichever
        path `data_path` names): what a loop without a Trainer iterates (benchmarks' plain loops)."""
        device = torch.device(device)
        for batch in self._train_loader(device):
            yield self.on_after_batch_transfer(move_data_to_device(batch, device), 0)

    def val_dataloader(self) -> DataLoader | list:
        if self.train_set is None:
            self.setup("validate")
        if self.val_set is None:
            return []  # val_fraction=0: Lightning then skips validation
        if isinstance(self.val_set, Subset) and isinstance(self.val_set.dataset, PreparedPart):
            # Read whole here, once: the loading processes share it. Each reading it itself raced the others on one
            # cache folder (litdata: "doesn't contain any index.json") and held a copy of its own.
            self.val_set.dataset.tensors()
        # Its own generator: creating an iterator draws the worker seed from it, not from the global RNG that
        # dropout uses, so validating at other steps (or an extra time, where a run stops) leaves training as is.
        return self._loader(self.val_set, shuffle=False, generator=torch.Generator())
