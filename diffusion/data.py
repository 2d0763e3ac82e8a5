"""LightningDataModules for diffusion training: images here, vectors in `diffusion.vectors`; all in [-1, 1].

Every dataset item is ``(x, index)``: ``x`` a float32 tensor in model units ([-1, 1]) and ``index`` the
sample's position in the full dataset. The training module seeds per-sample noise with that index, so the
noise a sample gets does not depend on which rank or batch it lands in.

``sample_shape`` and ``normalization`` are known right after ``__init__`` (the CLI sizes the network from
them before ``setup`` runs). ``normalization`` maps model units back to data units:
``data = model * scale + shift`` per channel (images) or per feature (vectors).

``batch_size`` is per device: the global batch is
``batch_size x devices x num_nodes x accumulate_grad_batches``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset
from torchvision import datasets
from torchvision.transforms import v2

ImageDatasetName = Literal["digits", "mnist", "fashion_mnist", "cifar10", "folder"]
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff")

# name -> (torchvision class, channels, native size)
_TORCHVISION = {
    "mnist": (datasets.MNIST, 1, 28),
    "fashion_mnist": (datasets.FashionMNIST, 1, 28),
    "cifar10": (datasets.CIFAR10, 3, 32),
}


class IndexedDataset(Dataset):
    """Wraps any dataset so that items become ``(x, index)``; a tuple item (x, label, ...) keeps only x."""

    def __init__(self, base: Dataset, transform=None) -> None:
        self.base = base
        self.transform = transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = self.base[index]
        if isinstance(x, tuple | list):
            x = x[0]
        if self.transform is not None:
            x = self.transform(x)
        return x, int(index)


def read_image(path: Path, mode: Literal["RGB", "L"]) -> Image.Image:
    """The decoded image at `path` in `mode`; a corrupt or unreadable file raises ValueError naming it."""
    try:
        with Image.open(path) as image:
            return image.convert(mode)
    except (OSError, SyntaxError, ValueError) as err:  # PIL raises all three for broken files
        raise ValueError(f"cannot read image {path}: {err}. Remove or replace the file.") from err


class ImageFiles(Dataset):
    """Image files loaded with PIL; a corrupt file is reported by name when it is first read."""

    def __init__(self, paths: list[Path], mode: Literal["RGB", "L"], transform) -> None:
        self.paths = paths
        self.mode = mode
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.transform(read_image(self.paths[index], self.mode))


def denormalize(x: torch.Tensor, normalization: dict) -> torch.Tensor:
    """Map a batch from model units back to data units: (B, C, H, W) per channel, (B, D) per feature."""
    if x.ndim < 2:
        raise ValueError(f"expected a batch of shape (B, C, H, W) or (B, D), got shape {tuple(x.shape)}")
    shift = torch.as_tensor(normalization["shift"], dtype=x.dtype, device=x.device)
    scale = torch.as_tensor(normalization["scale"], dtype=x.dtype, device=x.device)
    if shift.numel() != x.shape[1] or scale.numel() != x.shape[1]:
        raise ValueError(
            f"normalization has {shift.numel()} shift and {scale.numel()} scale values "
            f"but the batch has {x.shape[1]} channels/features (shape {tuple(x.shape)})"
        )
    view = (1, -1) + (1,) * (x.ndim - 2)
    return x * scale.view(view) + shift.view(view)


def to_uint8_images(x: torch.Tensor, normalization: dict) -> np.ndarray:
    """(N, C, H, W) in model units -> uint8 (N, H, W, C), the layout image evaluators read."""
    if x.ndim != 4:
        raise ValueError(f"expected images of shape (N, C, H, W), got shape {tuple(x.shape)}")
    images = denormalize(x.detach().float(), normalization).clamp(0, 1)
    return images.mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


class SplitDataModule(LightningDataModule):
    """Shared train/val split and dataloaders; subclasses set ``_full`` in ``setup``."""

    def __init__(self, batch_size: int, num_workers: int, val_fraction: float, seed: int) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if not 0 <= val_fraction < 1:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.val_fraction = val_fraction
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    def _split(self, full: Dataset) -> None:
        n = len(full)
        n_val = max(1, round(n * self.val_fraction)) if self.val_fraction > 0 else 0
        if n - n_val < 1:
            raise ValueError(
                f"{n} samples leave none for training with val_fraction={self.val_fraction}; "
                "add data or set --data.val_fraction 0"
            )
        # A fixed generator: the same seed gives the same split on every rank and every run.
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        self.val_set = Subset(full, perm[:n_val].sort().values.tolist()) if n_val else None
        self.train_set = Subset(full, perm[n_val:].sort().values.tolist())

    def _loader(self, dataset: Dataset, **kwargs) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            drop_last=False,
            **kwargs,
        )

    def train_dataloader(self) -> DataLoader:
        if self.train_set is None:
            self.setup("fit")
        trainer = self.trainer
        if trainer is not None and trainer.world_size == 1:
            # Under DDP Lightning injects DistributedSampler(shuffle=True, seed=PL_GLOBAL_SEED) and splits
            # its permutation across ranks. The same sampler with one replica yields exactly that
            # permutation, so a 1-process run and an N-process run see the same samples in each global
            # batch. Lightning calls set_epoch on it every epoch, as it does for the injected one.
            sampler = DistributedSampler(
                self.train_set,
                num_replicas=1,
                rank=0,
                shuffle=True,
                seed=int(os.environ.get("PL_GLOBAL_SEED", 0)),
                drop_last=False,
            )
            return self._loader(self.train_set, sampler=sampler)
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader | list:
        if self.train_set is None:
            self.setup("validate")
        if self.val_set is None:
            return []  # val_fraction=0: Lightning then skips validation
        return self._loader(self.val_set, shuffle=False)


class ImageDataModule(SplitDataModule):
    """Images in [-1, 1] of shape (C, image_size, image_size).

    Args:
        dataset: ``digits`` (scikit-learn's bundled 8x8 digits, no download), ``mnist``, ``fashion_mnist``,
            ``cifar10`` (torchvision, downloaded by ``prepare_data`` into ``root``) or ``folder`` (your own
            images found recursively under ``root``, extensions ``IMAGE_EXTENSIONS``).
        root: download directory for torchvision datasets; the image folder for ``folder``.
        image_size: side length. Defaults: digits 16 (nearest-neighbour upscaling, so 2x2 area
            averaging recovers the original 8x8 grid), mnist/fashion_mnist 28, cifar10 32; required
            for ``folder`` (shorter side resized, then center-cropped).
        channels: only for ``folder``: 3 (RGB, default) or 1 (grayscale). Other datasets have a fixed
            channel count; giving a different one is an error.
        random_flip: random horizontal flips; default True for cifar10 (Ho et al. 2020), else False.
        batch_size: per device (global = batch_size x devices x num_nodes x accumulate_grad_batches).
        val_fraction: share of the training split held out for validation (the official test splits are
            not used); 0 disables validation.
        seed: seed of the train/val split.
        verify: only for ``folder``: decode every image in ``prepare_data``, before the first training step,
            so a corrupt file stops the run at once (naming it) rather than whenever it is first drawn.
    """

    def __init__(
        self,
        dataset: ImageDatasetName = "digits",
        root: str = "data",
        image_size: int | None = None,
        channels: Literal[1, 3] | None = None,
        random_flip: bool | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        val_fraction: float = 0.05,
        seed: int = 0,
        verify: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers, val_fraction, seed)
        if dataset not in get_args(ImageDatasetName):
            raise ValueError(f"unknown image dataset {dataset!r}; choose one of {get_args(ImageDatasetName)}")
        if channels is not None and channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels}")
        if dataset == "folder":
            if image_size is None:
                raise ValueError("dataset 'folder' needs an image size: set --data.image_size (e.g. 64)")
            native_channels = channels or 3
        else:
            native_channels, native_size = _TORCHVISION[dataset][1:] if dataset in _TORCHVISION else (1, 16)
            if channels is not None and channels != native_channels:
                raise ValueError(
                    f"dataset {dataset!r} has {native_channels} channel(s), got channels={channels}; "
                    "leave --data.channels unset (it only applies to dataset 'folder')"
                )
            image_size = native_size if image_size is None else image_size
        if image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {image_size}")
        self.dataset = dataset
        self.root = root
        self.image_size = image_size
        self.channels = native_channels
        self.random_flip = dataset == "cifar10" if random_flip is None else random_flip
        self.verify = verify
        self._files = self._find_images() if dataset == "folder" else None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (self.channels, self.image_size, self.image_size)

    @property
    def normalization(self) -> dict[str, list[float]]:
        # Image data units are [0, 1]: data = model * 0.5 + 0.5.
        return {"shift": [0.5] * self.channels, "scale": [0.5] * self.channels}

    def _find_images(self) -> list[Path]:
        root = Path(self.root).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"image folder {root} does not exist; point --data.root at your images")
        # Sorted so that indices (and so the split and per-sample noise) are the same on every machine;
        # dot-files are skipped because macOS "._name.png" resource forks are not images.
        files = sorted(
            p
            for p in root.rglob("*")
            if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".") and p.is_file()
        )
        if not files:
            raise FileNotFoundError(
                f"no images found under {root} (searched recursively for {', '.join(IMAGE_EXTENSIONS)})"
            )
        return files

    def _transform(self, native_size: int | None) -> v2.Compose:
        # Resize on uint8 (before ToDtype) so that interpolation cannot overshoot [0, 1].
        steps = [v2.ToImage()]
        if native_size is None:  # folder: arbitrary sizes and aspect ratios
            steps += [v2.Resize(self.image_size, antialias=True), v2.CenterCrop(self.image_size)]
        elif native_size != self.image_size:
            steps.append(v2.Resize(self.image_size, antialias=True))
        if self.random_flip:
            steps.append(v2.RandomHorizontalFlip())
        steps += [
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.5] * self.channels, [0.5] * self.channels),
            v2.ToPureTensor(),  # a plain tensor, like every other source
        ]
        return v2.Compose(steps)

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node, so concurrent downloads cannot corrupt the files.
        if self.dataset in _TORCHVISION:
            _TORCHVISION[self.dataset][0](self.root, train=True, download=True)
        if self.verify and self._files is not None:
            for path in self._files:
                read_image(path, "RGB" if self.channels == 3 else "L")

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.dataset == "digits":
            full = IndexedDataset(
                TensorDataset(self._digits()), v2.RandomHorizontalFlip() if self.random_flip else None
            )
        elif self.dataset == "folder":
            mode = "RGB" if self.channels == 3 else "L"
            full = IndexedDataset(ImageFiles(self._files, mode, self._transform(None)))
        else:
            cls, _, native_size = _TORCHVISION[self.dataset]
            try:
                base = cls(self.root, train=True, download=False, transform=self._transform(native_size))
            except RuntimeError as err:
                raise FileNotFoundError(
                    f"{self.dataset} not found under {self.root!r}: {err} "
                    "(the Trainer downloads it via prepare_data; call dm.prepare_data() when used alone)"
                ) from err
            full = IndexedDataset(base)
        self._split(full)

    def _digits(self) -> torch.Tensor:
        from sklearn.datasets import load_digits

        images = torch.from_numpy(load_digits().images).float().div(16).unsqueeze(1)  # (N, 1, 8, 8)
        # Nearest-neighbour: each pixel becomes a constant block, so area-averaging undoes it exactly.
        images = torch.nn.functional.interpolate(images, size=self.image_size, mode="nearest-exact")
        return images * 2 - 1
