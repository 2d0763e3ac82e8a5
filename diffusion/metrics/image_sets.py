"""The image sets an evaluation reads, as uint8 (N, H, W, C) arrays: a samples file, and the reference it is
compared with — another .npz of images, a dataset's train split rendered at the samples' size, or a file of
FID statistics (`diffusion.metrics.reference_stats`) standing in for the reference images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast, get_args

import numpy as np
from torch.utils.data import DataLoader, Subset

from diffusion.data.file_in_folder import file_in_folder
from diffusion.data.image_files import find_images
from diffusion.data.images import MIN_IMAGE_SIZE, ImageDataModule, ImageDatasetName
from diffusion.data.numpy_files import ARRAY_FILE, read_images
from diffusion.data.split import READING_BATCH
from diffusion.errors import InvalidValue, check_whole_number
from diffusion.generation.render import to_uint8_images
from diffusion.metrics.progress import progress_bar
from diffusion.metrics.reference_stats import FeatureStatistics, is_statistics_file, load_statistics


def load_npz_images(path: str | Path, flag: str = "{command:--samples}") -> np.ndarray:
    """The uint8 (N, H, W, C) images of a samples file (.npz or .npy, by `diffusion.data.numpy_files`'s rule)."""
    images, _ = read_images(path, flag)
    if len(images) < 2:
        raise InvalidValue(
            f"{path} holds {len(images)} image(s) and FID needs at least 2",
            "sample more ({command:--num_samples})",
        )
    return images


def load_reference(
    reference: str,
    image_size: int | None,
    channels: int | None,
    data_root: str = "data",
    num_reference: int | None = None,
    seed: int = 0,
) -> np.ndarray | FeatureStatistics:
    """The reference: FID statistics (an .npz holding ``mu`` and ``sigma`` and no images), uint8 (N, H, W, C)
    images of an .npz, or of a dataset's train split rendered at ``image_size`` (None: the dataset's own; all
    images, or a fixed random ``num_reference`` of them). A folder holding one .npz or .npy stands for it."""
    # -3 was all but 3 images (a slice), 0 numpy's error: evaluate's --num_reference takes 2 or more
    if num_reference is not None:
        fix = "pass at least 2 (FID needs 2), or None for all of them"
        check_whole_number("num_reference", num_reference, MIN_REFERENCE, fix)
    if Path(reference).is_dir() and reference not in get_args(ImageDatasetName):
        reference = str(file_in_folder(reference, "{command:--reference}", ARRAY_FILE))
    if is_statistics_file(reference):
        if num_reference is not None:
            raise InvalidValue(
                f"{{command:--num_reference}} picks reference images, and {reference} holds statistics, not images",
                "leave {command:--num_reference} out",
            )
        return load_statistics(reference)
    if reference.endswith((".npz", ".npy")) or Path(reference).is_file():
        images = load_npz_images(reference, "{command:--reference}")
        return images[_subset(len(images), num_reference, seed)]
    if reference not in get_args(ImageDatasetName):
        raise InvalidValue(
            f"{{command:--reference}} {reference!r} is neither an existing .npz file nor a dataset",
            f"pass an .npz (images or "
            f"FID statistics) or one of the datasets {', '.join(get_args(ImageDatasetName))}",
        )
    if image_size is not None and image_size < MIN_IMAGE_SIZE:  # rendered at the samples' size
        raise InvalidValue(
            f"the samples are {image_size}x{image_size}, smaller than the {MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE} a "
            f"dataset reference can be rendered at",
            f"compare them with an .npz of {image_size}x{image_size} images as {{command:--reference}}",
        )
    if reference == "folder":
        find_images(data_root, "{command:--data_root}")  # the folder's errors, naming evaluate's flag
    folder_channels: Any = channels if reference == "folder" else None  # 1 or 3: the samples' channels
    name = cast(ImageDatasetName, reference)  # one of get_args(ImageDatasetName): checked above
    data = ImageDataModule(
        name, root=data_root, image_size=image_size, channels=folder_channels, random_flip=False,
        val_fraction=0.0,
    )  # fmt: skip
    data.prepare_data()  # downloads torchvision datasets on first use
    data.setup("fit")
    train_set: Any = data.train_set  # made by setup
    dataset = Subset(train_set, _subset(len(train_set), num_reference, seed).tolist())
    parts = []
    with progress_bar(len(dataset), f"reading {reference}") as bar:
        for batch in DataLoader(dataset, batch_size=READING_BATCH, shuffle=False):
            parts.append(to_uint8_images(batch.x, data.normalization))
            bar.update(len(batch.x))
    return np.concatenate(parts)


MIN_REFERENCE = 2  # FID's covariance needs 2 images: evaluate's --num_reference takes 2 or more


def _subset(n: int, num: int | None, seed: int) -> np.ndarray:
    """All n indices, or a fixed random ``num`` of them in increasing order."""
    if num is None or num >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:num])
