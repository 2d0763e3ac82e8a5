"""A folder's image files (`find_images`) as a Dataset: decoded with PIL, a corrupt file reported by name when it
is read."""

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from diffusion.errors import InvalidValue, MissingFile

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff")
# PIL's 16-bit grayscale modes; 16-bit RGB(A) PNGs already open as 8-bit RGB(A).
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


class UnconvertibleImage(InvalidValue):
    """An image that decodes but has no safe 8-bit form (float or 32-bit pixels)."""


def read_image(path: Path, mode: Literal["RGB", "L"]) -> Image.Image:
    """The decoded image at `path` in `mode`; a corrupt, unreadable or unconvertible file raises InvalidValue
    naming it (from a DataLoader worker too: `diffusion.data.split.FailedItem`). 16-bit grayscale is scaled to
    8 bits; float and 32-bit pixels, whose range is unknown, are refused."""
    try:
        with Image.open(path) as image:
            return _to_mode(image, path, mode)
    except UnconvertibleImage:
        raise
    except (OSError, SyntaxError, ValueError) as err:  # PIL raises all three for broken files
        raise InvalidValue(f"cannot read image {path}: {err}", "remove or replace the file") from err


def _to_mode(image: Image.Image, path: Path, mode: Literal["RGB", "L"]) -> Image.Image:
    # PIL's convert() clips 16-bit and float pixels to 0..255 rather than scaling them: a 16-bit PNG would
    # come out almost white, a float TIFF in [0, 1] black.
    if image.mode in _SIXTEEN_BIT_MODES or (image.mode == "I" and image.format == "PNG"):  # PNG: <= 16 bits
        pixels = np.asarray(image, dtype=np.float64)  # 0..65535
        image = Image.fromarray(np.round(pixels / 257).astype(np.uint8), mode="L")  # 65535 / 257 = 255
    elif image.mode in ("F", "I"):
        kind = "floating-point" if image.mode == "F" else "32-bit integer"
        raise UnconvertibleImage(
            f"image {path} has {kind} pixels (PIL mode {image.mode}), whose range is unknown, so they cannot be "
            "converted to 8 bits without guessing",
            "save it as an 8- or 16-bit PNG, e.g. "
            "Image.fromarray(np.round(array / array_max * 255).astype(np.uint8)).save('image.png')",
        )
    return image.convert(mode)


def find_images(root: str | os.PathLike, flag: str = "{--root}") -> list[Path]:
    """The image files under `root`, searched recursively and sorted; `flag` is the option that named `root`."""
    root = Path(root).expanduser()
    if root.is_file():  # not "does not exist": it does, as a file
        raise InvalidValue(
            f"{flag} {root} is a file, not a folder of images",
            f"point {flag} at the folder that holds your images",
        )
    if not root.is_dir():
        raise MissingFile(f"image folder {root} does not exist", f"point {flag} at your images")
    # Sorted so that indices (and so the split and per-sample noise) are the same on every machine;
    # dot-files are skipped because macOS "._name.png" resource forks are not images.
    files = sorted(
        p
        for p in root.rglob("*")
        if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".") and p.is_file()
    )
    if not files:
        raise MissingFile(
            f"no images found under {root} (searched recursively for {', '.join(IMAGE_EXTENSIONS)})",
            f"put your images there, or point {flag} at the folder that holds them",
        )
    return files


class ImageFiles(Dataset):
    """Image files loaded with PIL; a corrupt file is reported by name when it is first read. With ``labels``
    (one per path), items are (image, label)."""

    def __init__(
        self,
        paths: list[Path],
        mode: Literal["RGB", "L"],
        transform: Callable[[Image.Image], torch.Tensor],
        labels: list[int] | None = None,
    ) -> None:
        self.paths = paths
        self.mode = mode
        self.transform = transform
        self.labels = labels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor | tuple[torch.Tensor, int]:
        image = self.transform(read_image(self.paths[index], self.mode))
        if self.labels is not None:
            return image, self.labels[index]
        return image


def check_root_of_digits(root: str, owner: type) -> None:
    """The bundled digits read no root: one given (`--data.root my_images` without `--data.dataset folder`, the
    README's line without its --config) trained on the digits without a word. A root that holds images is refused
    (those were meant); any other is said in a warning (a config kept for several datasets may carry one)."""
    folder = Path(root).expanduser()
    try:  # a glance at the folder and its subfolders (a class per folder), not a search
        top = [folder, *(p for p in folder.iterdir() if p.is_dir())] if folder.is_dir() else []
        images = any(
            p.suffix.lower() in IMAGE_EXTENSIONS for level in top for p in level.iterdir() if p.is_file()
        )
    except OSError:  # a folder it may not read: not looked into
        images = False
    if images:
        raise InvalidValue(
            f"{{--root}} {root} holds images, and dataset 'digits' (the default) does not read root: "
            "the digits are bundled with scikit-learn",
            "to train on those images pass {--dataset} folder and {--image_size} (configs/folder.yaml sets them), "
            "or leave {--root} out to train on the digits",
            owner,
        )
    warnings.warn(
        f"root={root!r} not used: dataset 'digits' is bundled with scikit-learn and reads no folder — leave it "
        "out, or pass dataset='folder' for a folder of images",
        stacklevel=3,
    )
