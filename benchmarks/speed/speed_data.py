"""Data for the speed benchmarks on machines that cannot download CIFAR-10, and the two training data paths'
own throughput.

`SyntheticCIFAR10` is the recipe's ImageDataModule (its split, per-image transform, workers, resumable loader and
on-device path) over 50,000 random uint8 images (`--data.init_args.num_images`: fewer for short runs) held as torchvision's CIFAR10 holds its data, an (N, 32, 32, 3)
uint8 array decoded by CIFAR10.__getitem__ (PIL image, then the transform): only the pixels are made up.
`python train.py --config configs/cifar10.yaml --data.class_path benchmarks.speed.speed_data.SyntheticCIFAR10` (run
from the repository root, or with it on PYTHONPATH) trains on it with every other setting of the recipe.

The measures (no model; each a dict with `images_per_s`, the median of `repeats` passes, and what was measured):
- `loader_throughput(datamodule, batches, warmup=5, repeats=3)`: the per-item DataLoader (`--data.on_device
  false`): its workers, transforms, collation and pinning, on the host;
- `on_device_throughput(datamodule, device, batches, warmup=5, repeats=3)`: the on-device path alone, on
  `device`: the index loader's batch, its copy to the device and the DataModule's `on_after_batch_transfer`
  (gather, flips, conversion), the device synchronized at the end of each pass. Its `path` says which path
  the datamodule took (the per-item loader for data that is not held as arrays or does not fit);
- `recipe_data_throughput(cli, device, batches, synthetic)`: whichever of the two a recipe's DataModule takes
  (speed.py's data path row).
"""

import statistics
import time
from typing import Any

import numpy as np
import torch
from torchvision import datasets
from torchvision.datasets.vision import VisionDataset

from diffusion.data.images import ImageDataModule
from diffusion.data.split import IndexedDataset
from diffusion.errors import OutOfRange

CIFAR10_IMAGES = 50_000
DATA_CLASS = "benchmarks.speed.speed_data.SyntheticCIFAR10"  # train.py's --data.class_path


class SyntheticCIFAR10(ImageDataModule):
    """ImageDataModule whose `cifar10` is `num_images` random images in torchvision's CIFAR10 (other datasets as
    usual). The tests' and quick modes' short runs take fewer than CIFAR-10's 50,000: making and holding them was
    a third of a 2-step run here."""

    def __init__(self, *args: Any, num_images: int = CIFAR10_IMAGES, **kwargs: Any) -> None:
        # ImageDataModule's own arguments, positional too (it stands in for ImageDataModule).
        super().__init__(*args, **kwargs)
        if num_images < 1:
            raise OutOfRange("num_images", num_images, ">= 1", owner=type(self))
        self.num_images = num_images

    def prepare_data(self) -> None:
        if self.dataset != "cifar10":
            super().prepare_data()

    def _full_dataset(self, random_flip: bool):
        if self.dataset != "cifar10":
            return super()._full_dataset(random_flip)
        base = datasets.CIFAR10.__new__(datasets.CIFAR10)  # its files' checksums would refuse made-up data
        VisionDataset.__init__(base, self.root, transform=self._transform(random_flip))
        rng = np.random.default_rng(0)
        base.train = True
        base.data = rng.integers(0, 256, (self.num_images, 32, 32, 3), dtype=np.uint8)
        base.targets = rng.integers(0, 10, self.num_images).tolist()
        return IndexedDataset(base, with_labels=self.conditional)


def loader_throughput(datamodule, batches: int, warmup: int = 5, repeats: int = 3) -> dict:
    """Training images/s of `datamodule`'s per-item training loader alone (its workers, transforms, collation and
    pinning, as the Trainer iterates it with `--data.on_device false`; no model): the median over `repeats`
    passes of `batches` batches, each after `warmup` batches that start the workers and fill their prefetch
    queues."""
    datamodule.setup("fit")
    on_device, datamodule.on_device = getattr(datamodule, "on_device", False), False
    try:
        loader = datamodule.train_dataloader()
    finally:
        datamodule.on_device = on_device
    batches = max(1, min(batches, len(loader) - warmup))  # within one epoch
    rates = []
    for _ in range(repeats):
        batch_iter = iter(loader)
        for _ in range(warmup):
            next(batch_iter)
        images, start = 0, time.perf_counter()
        for _ in range(batches):
            images += len(next(batch_iter)[0])
        rates.append(images / (time.perf_counter() - start))
        del batch_iter
    return {
        "images_per_s": statistics.median(rates),
        "per_pass": rates,
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "batches": batches,
        "dataset": type(datamodule).__name__ + f"({getattr(datamodule, 'dataset', '?')})",
        "threads": torch.get_num_threads(),
    }


def on_device_throughput(
    datamodule, device: torch.device | str, batches: int, warmup: int = 5, repeats: int = 3
) -> dict:
    """Training images/s of `datamodule`'s on-device data path alone on `device` (`SplitDataModule.
    training_batches`: index batch -> device -> `Batch` gathered, flipped and converted there; no model): the
    median over `repeats` passes of `batches` batches, each after `warmup` batches (the first copies the dataset
    to the device), the device synchronized before the clock starts and stops."""
    device = torch.device(device)
    datamodule.setup("fit")

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rates, per_epoch = [], None
    for _ in range(repeats):
        epoch = datamodule.training_batches(device)
        for _ in range(warmup):
            next(epoch)
        per_epoch = per_epoch or len(datamodule.train_set) // datamodule.batch_size
        count = max(1, min(batches, per_epoch - warmup))  # within one epoch
        synchronize()
        images, start = 0, time.perf_counter()
        for _ in range(count):
            images += len(next(epoch).x)
        synchronize()
        rates.append(images / (time.perf_counter() - start))
    return {
        "images_per_s": statistics.median(rates),
        "per_pass": rates,
        "batch_size": datamodule.batch_size,
        "batches": count,
        "device": str(device),
        "path": datamodule.data_path,
        "random_flip": getattr(datamodule, "random_flip", False),
        "dataset": type(datamodule).__name__ + f"({getattr(datamodule, 'dataset', '?')})",
    }


def recipe_data_throughput(cli, device: torch.device, batches: int, synthetic: bool) -> dict | None:
    """The recipe's data path alone (its DataModule as `cli` built it, or with `synthetic` the same settings over
    SyntheticCIFAR10's made-up pixels): batches as training gets them, no model. None: `synthetic` on a recipe
    other than CIFAR-10."""
    data, recipe = cli.datamodule, cli.config.data.init_args.as_dict()
    if synthetic and recipe.get("dataset") != "cifar10":
        return None
    if synthetic:
        data = SyntheticCIFAR10(**recipe)
    # A dataset held on the device (the default where it fits): its gather, flips and conversion there; else the
    # per-item loader with the recipe's workers.
    if data.on_device:
        return on_device_throughput(data, device, batches)
    return loader_throughput(data, batches)
