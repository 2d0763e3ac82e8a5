"""Images in [-1, 1] as a LightningDataModule: the bundled digits, torchvision datasets, or a folder of yours.

Items are `Batch(x, index[, label])` (see `diffusion.data.split`). ``sample_shape`` and ``normalization`` are
known right after ``__init__`` (the CLI sizes the network from them before ``setup`` runs); ``normalization``
maps model units back to data units, ``data = model * 0.5 + 0.5`` per channel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NamedTuple
from urllib.error import URLError

import torch
from torch.utils.data import Dataset, Subset, TensorDataset
from torchvision import datasets
from torchvision.transforms import v2

from diffusion.data.file_in_folder import check_path_argument
from diffusion.data.image_files import ImageFiles, check_root_of_digits, find_images, read_image
from diffusion.data.image_transform import ToModelUnits
from diffusion.data.labels import folder_classes
from diffusion.data.on_device import HeldSamples, held_images
from diffusion.data.prepared import PreparedSet, open_prepared
from diffusion.data.split import IndexedDataset, SplitDataModule
from diffusion.data.split_options import DEFAULT_VAL_FRACTION
from diffusion.errors import (
    InvalidValue,
    MissingFile,
    OutOfRange,
    WrongType,
    check_bool,
    check_whole_number,
    options_of,
)

MIN_IMAGE_SIZE = 8


class Torchvision(NamedTuple):
    """Everything this module knows of a torchvision dataset it trains on, in one entry of `TORCHVISION`."""

    dataset: type  # called as (root, train=True, download=..., transform=...), with .data and .targets
    channels: int
    size: int  # the native image size, the default --data.image_size
    local_files: tuple[str, str]  # where under root its files lie, and which (for a failed download's line)
    class_names: list[str]  # classes 0..N-1 (conditional training), known before any download
    random_flip: bool = False  # the default of --data.random_flip (Ho et al. flip CIFAR-10)


_MNIST_FILES = "the four {train,t10k}-{images-idx3,labels-idx1}-ubyte files (or their .gz)"
DIGIT_NAMES = [str(i) for i in range(10)]
# A torchvision dataset is one entry here, its name also in ImageDatasetName (`--data.dataset NAME` takes it).
TORCHVISION = {
    "mnist": Torchvision(datasets.MNIST, 1, 28, ("MNIST/raw", _MNIST_FILES), DIGIT_NAMES),
    "fashion_mnist": Torchvision(
        datasets.FashionMNIST, 1, 28, ("FashionMNIST/raw", _MNIST_FILES),
        ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"],
    ),
    "cifar10": Torchvision(
        datasets.CIFAR10, 3, 32, ("", "cifar-10-python.tar.gz (or the cifar-10-batches-py folder it unpacks to)"),
        ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"], random_flip=True,
    ),
}  # fmt: skip
# The bundled digits, the torchvision entries and an image folder: the choices of --data.dataset. Written out, as
# a type checker reads no Literal built from TORCHVISION's keys (nor does jsonargparse see past a TYPE_CHECKING
# branch); tests/data/test_image_data.py holds them equal.
ImageDatasetName = Literal["digits", "mnist", "fashion_mnist", "cifar10", "folder", "streaming"]


DOWNLOADS = "data"  # root's default: where torchvision's sets are downloaded


class ImageDataModule(SplitDataModule):
    """Images in [-1, 1] of shape (C, image_size, image_size).

    Args:
        dataset: ``digits`` (scikit-learn's bundled 8x8 digits, no download), ``mnist``, ``fashion_mnist``,
            ``cifar10`` (torchvision, downloaded by ``prepare_data`` into ``root``) or ``folder`` (your own
            images found recursively under ``root``, see `diffusion.data.image_files.find_images`) or
            ``streaming`` (a set `python -m diffusion.prepare` wrote at ``root``, a folder or an ``s3://``,
            ``gs://`` URL: held on the device where it fits, else streamed, `diffusion.data.streaming`; its
            image size, channels, labels and split are the prepared ones).
        root: download directory for torchvision datasets; the image folder for ``folder``.
        image_size: side length. Defaults: digits 8 (their own grid; 16 or more upscales by nearest neighbour,
            so area averaging recovers the 8x8 grid), mnist/fashion_mnist 28, cifar10 32; required
            for ``folder`` (shorter side resized, then center-cropped).
        channels: only for ``folder``: 3 (RGB, default) or 1 (grayscale). Other datasets have a fixed
            channel count; giving a different one is an error.
        random_flip: random horizontal flips; default True for cifar10 (Ho et al. 2020), else False.
        batch_size: per device (global = batch_size x devices x num_nodes x accumulate_grad_batches).
        val_fraction: share of the training split held out for validation (the official test splits are
            not used); 0 disables validation.
        val_from_train: train on every image and validate on this many of them (a fixed random subset);
            needs ``val_fraction=0``. ``configs/cifar10.yaml`` uses it to train on all 50,000 images.
        seed: seed of the train/val split.
        verify: only for ``folder``: decode every image in ``prepare_data``, before the first training step,
            so a corrupt file stops the run at once (naming it) rather than whenever it is first drawn.
        conditional: train a class-conditional model on the dataset's labels (digits, MNIST, Fashion-MNIST,
            CIFAR-10: their own; folder: one subfolder of ``root`` per class, torchvision's ImageFolder
            convention). Sets ``num_classes`` and ``class_names``, which the CLI hands to the network and the
            checkpoint. Default False: labels are not read, and training is unconditional.
        cache_dir: only for ``streaming`` from object storage: where litdata keeps the chunks it has downloaded
            (default: its own, under ~/.lightning or /cache).
        max_cache_size: only for ``streaming``: the most that cache may hold, e.g. ``"50GB"`` (default: litdata's,
            a share of the free disk); chunks read are evicted past it.
        on_device: hold the dataset on the training device (uint8 for MNIST, Fashion-MNIST and CIFAR-10, at
            ``image_size``) and gather and flip each training batch there (`diffusion.data.on_device`), where it
            fits; False reads it image by image in ``num_workers`` DataLoader workers. ``folder`` is always
            read image by image (decoding every file before the first step would be a long start).
    """

    def __init__(
        self,
        dataset: ImageDatasetName = "digits",
        root: str = DOWNLOADS,
        image_size: int | None = None,
        channels: Literal[1, 3] | None = None,
        random_flip: bool | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        val_fraction: float = DEFAULT_VAL_FRACTION,
        seed: int = 0,
        val_from_train: int | None = None,
        verify: bool = False,
        conditional: bool = False,
        on_device: bool = True,
        cache_dir: str | None = None,
        max_cache_size: str | None = None,
    ) -> None:
        for name, flag in (("verify", verify), ("conditional", conditional), ("on_device", on_device)):
            check_bool(name, flag)
        if random_flip is not None and not isinstance(random_flip, bool):
            fix = "pass random_flip=True or random_flip=False, or leave it None (the dataset's default)"
            raise WrongType("random_flip", random_flip, "True, False or None", fix)
        super().__init__(
            batch_size, num_workers, val_fraction, seed, val_from_train, on_device, cache_dir, max_cache_size
        )
        fix = "pass the path of the folder (its images, the download, the prepared set)"
        check_path_argument("root", root, "a folder", fix, optional=False, owner=type(self))
        names = ("digits", *TORCHVISION, "folder", "streaming")  # the entries of now, not of import time
        if dataset not in names:
            raise InvalidValue(f"unknown image dataset {dataset!r}", f"choose one of {names}")
        if dataset == "digits" and root != DOWNLOADS:
            check_root_of_digits(root, type(self))
        # 1.0 and True passed `in (1, 3)`, and '3' was said as `channels=3 must be 1 or 3`
        if channels is not None:
            check_whole_number("channels", channels, fix="pass 1 (grayscale) or 3 (RGB), or leave it unset")
        if channels is not None and channels not in (1, 3):
            raise OutOfRange("channels", channels, "1 or 3", owner=type(self))
        native_channels: int
        if dataset == "folder":
            if image_size is None:
                raise InvalidValue(
                    "dataset 'folder' needs an image size", "set {--image_size} (e.g. 64)", type(self)
                )
            native_channels = channels or 3
        elif dataset == "streaming":
            with options_of(type(self)):
                self.prepared = prepared = open_prepared(root)
            image_size, native_channels = self._fit_prepared(prepared, image_size, channels, conditional)
        else:
            entry = TORCHVISION.get(dataset)
            native_channels, native_size = (entry.channels, entry.size) if entry else (1, 8)
            if channels is not None and channels != native_channels:
                raise InvalidValue(
                    f"{{--channels}} {channels} does not fit dataset {dataset!r}, whose images have "
                    f"{native_channels} channel{'s' if native_channels > 1 else ''}",
                    "leave the channels unset: they are chosen for dataset 'folder' only",
                    type(self),
                )
            image_size = native_size if image_size is None else image_size
        image_size = check_whole_number("image_size", image_size, fix=f"pass an int >= {MIN_IMAGE_SIZE}")
        if image_size < MIN_IMAGE_SIZE:
            raise OutOfRange(
                "image_size",
                image_size,
                f">= {MIN_IMAGE_SIZE}",
                f"pass {{--image_size}} {MIN_IMAGE_SIZE} or more",
                type(self),
            )
        self.dataset = dataset
        self.root = root
        self.image_size = image_size
        self.channels = native_channels
        flipped = dataset in TORCHVISION and TORCHVISION[dataset].random_flip  # CIFAR-10's, as Ho et al.
        flipped = self.prepared.random_flip if self.prepared is not None else flipped
        self.random_flip = flipped if random_flip is None else random_flip
        self.verify = verify
        with options_of(type(self)):
            self._files = files = find_images(root) if dataset == "folder" else None
        self.conditional = conditional
        self._labels: list[int] | None = None
        entry = TORCHVISION.get(dataset)
        self._class_names = DIGIT_NAMES if dataset == "digits" else entry.class_names if entry else None
        if self.prepared is not None:
            self._class_names = self.prepared.class_names
        if conditional and files is not None:  # a folder's
            with options_of(type(self)):
                self._labels, self._class_names = folder_classes(Path(root).expanduser(), files)
        self._check_streaming_options()

    def _fit_prepared(
        self, prepared: PreparedSet, image_size: int | None, channels: int | None, conditional: bool
    ) -> tuple[int, int]:
        """(image_size, channels) of the `prepared` set, refused where they are not what the run asks for."""
        if prepared.kind != "images":
            raise InvalidValue(
                f"{{--root}} {prepared.root} holds prepared vectors, not images",
                "train it with {--class_path} diffusion.data.VectorDataModule {--dataset} streaming "
                f"{{--path}} {prepared.root} and an MLP network (the vectors recipe, configs/toy2d.yaml, has both)",
                type(self),
            )
        have_channels, have_size = prepared.sample_shape[0], prepared.sample_shape[-1]
        for name, asked, have in (
            ("image_size", image_size, have_size),
            ("channels", channels, have_channels),
        ):
            if asked is not None and asked != have:
                raise InvalidValue(
                    f"{{--{name}}} {asked} does not fit the prepared set {prepared.root} ({name} {have})",
                    f"leave {{--{name}}} unset, or prepare the set again with {{--{name}}} {asked}",
                    type(self),
                )
        if conditional and prepared.class_names is None:
            raise InvalidValue(
                f"{{--conditional}} true needs labels, and the prepared set {prepared.root} holds none",
                "prepare it again from labelled data (a folder with one subfolder per class and "
                "{--conditional} true), or train unconditionally",
                type(self),
            )
        return have_size, have_channels

    @property
    def num_classes(self) -> int | None:
        """Classes of a conditional run (the network's `num_classes`); None when training is unconditional."""
        return len(self._conditional_names) if self.conditional else None

    @property
    def class_names(self) -> list[str] | None:
        """Names of classes 0..num_classes-1 (stored in the checkpoint); None when training is unconditional."""
        return list(self._conditional_names) if self.conditional else None

    @property
    def _conditional_names(self) -> list[str]:
        """The class names of a conditional run: `__init__` refuses conditional training without them (a prepared
        set with no labels), every other dataset has them, so None here is a bug of ours."""
        if self._class_names is None:
            raise RuntimeError(f"conditional training on {self.dataset!r} has no class names")
        return self._class_names

    @property
    def source_paths(self) -> list[tuple[str, str, str]]:
        """What the data is read from, as (option, its value, the folder read): the image folder, a prepared set,
        or a torchvision set's own folder under ``root`` (beside which other sets may lie); none for the digits.
        A prepare writes neither into nor over them (`diffusion.data.preparing`)."""
        entry = TORCHVISION.get(self.dataset)
        if entry is not None:  # CIFAR-10's batches folder (its archive beside), MNIST's MNIST/
            folder = getattr(entry.dataset, "base_folder", None) or entry.local_files[0].split("/")[0]
            return [("root", self.root, str(Path(self.root, folder)))]
        return [] if self.dataset == "digits" else [("root", self.root, self.root)]

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (self.channels, self.image_size, self.image_size)

    @property
    def normalization(self) -> dict[str, list[float]]:
        # Image data units are [0, 1]: data = model * 0.5 + 0.5.
        return {"shift": [0.5] * self.channels, "scale": [0.5] * self.channels}

    def _transform(self, random_flip: bool) -> ToModelUnits:
        return ToModelUnits(self.image_size, random_flip)

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node, so concurrent downloads cannot corrupt the files.
        if self.dataset in TORCHVISION:
            download(self.dataset, self.root)
        if self.verify and self._files is not None:
            for path in self._files:
                read_image(path, "RGB" if self.channels == 3 else "L")

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.prepared is not None:
            self._prepared_split(self.conditional)
            return
        self._split(self._full_dataset(self.random_flip))

    def unaugmented_train_set(self) -> Dataset:
        """The training split's images without random augmentation (no flips), same items and indices: the
        real images that FID statistics are computed from (the training set as stored, as in Ho et al.)."""
        self.setup("fit")
        train_set = self._training_set
        if not self.random_flip or self.prepared is not None:  # a prepared set's items are not flipped
            return train_set
        full = self._full_dataset(random_flip=False)
        return Subset(full, train_set.indices) if isinstance(train_set, Subset) else full

    def _held_samples(self) -> HeldSamples | None:
        # The arrays the per-image path reads its items from: the bundled digits' tensor (model units already)
        # or torchvision's in-memory uint8 arrays (MNIST's (N, H, W) tensor, CIFAR-10's (N, H, W, C) array).
        if self.prepared is not None:
            return self._prepared_held(self.conditional, self.random_flip)
        base = getattr(self._training_split.dataset, "base", None)
        if self.dataset == "digits" and isinstance(base, TensorDataset):
            labels = base.tensors[1] if self.conditional else None
            return HeldSamples(base.tensors[0], labels, self.random_flip, uint8_images=False)
        if self.dataset not in TORCHVISION or base is None or not hasattr(base, "data"):
            return None
        stored = torch.as_tensor(base.data)
        images = stored.unsqueeze(1) if stored.ndim == 3 else stored.permute(0, 3, 1, 2)  # (N, C, H, W)
        labels = torch.as_tensor(base.targets, dtype=torch.long) if self.conditional else None
        return held_images(images, labels, self.image_size, self.random_flip)

    def _not_held_reason(self) -> str:
        if self.dataset == "folder":
            return "image files are decoded as they are drawn"
        return super()._not_held_reason()

    def _full_dataset(self, random_flip: bool) -> Dataset:
        labelled = self.conditional
        if self.dataset == "digits":
            tensors = (self._digits(), self._digits_labels()) if labelled else (self._digits(),)
            return IndexedDataset(
                TensorDataset(*tensors), v2.RandomHorizontalFlip() if random_flip else None, labelled
            )
        if self.dataset == "folder":
            if self._files is None:
                raise RuntimeError("dataset 'folder' without its files: __init__ finds them")
            mode: Literal["RGB", "L"] = "RGB" if self.channels == 3 else "L"
            return IndexedDataset(
                ImageFiles(self._files, mode, self._transform(random_flip), self._labels),
                None,
                labelled,
            )
        cls = TORCHVISION[self.dataset].dataset
        try:
            base = cls(self.root, train=True, download=False, transform=self._transform(random_flip))
        except RuntimeError as err:
            raise MissingFile(
                f"{self.dataset} not found under {self.root!r}: {err}",
                "the Trainer downloads it via prepare_data; call dm.prepare_data() when the data module is used "
                "alone",
            ) from err
        return IndexedDataset(base, with_labels=labelled)

    def _digits(self) -> torch.Tensor:
        from sklearn.datasets import load_digits

        images = torch.from_numpy(load_digits().images).float().div(16).unsqueeze(1)  # (N, 1, 8, 8)
        # Nearest-neighbour: each pixel becomes a constant block, so area-averaging undoes it exactly.
        images = torch.nn.functional.interpolate(images, size=self.image_size, mode="nearest-exact")
        return images * 2 - 1

    @staticmethod
    def _digits_labels() -> torch.Tensor:
        from sklearn.datasets import load_digits

        return torch.from_numpy(load_digits().target).long()  # (N,) in 0..9


def download(dataset: str, root: str) -> None:
    """torchvision's `dataset` into `root` (nothing when its files are there already); a failed download says
    which files to put where instead."""
    try:
        TORCHVISION[dataset].dataset(root, train=True, download=True)
    # MNIST raises RuntimeError once every mirror failed; CIFAR-10 lets urllib's URLError through.
    except (RuntimeError, URLError, TimeoutError, ConnectionError) as err:
        folder, files = TORCHVISION[dataset].local_files
        raise MissingFile(  # an OSError too, as a failed download's is
            f"could not download {dataset} into {root} ({' '.join(str(err).split())})",
            f"check the network connection, or copy {files} into {Path(root, folder)} yourself",
        ) from err
