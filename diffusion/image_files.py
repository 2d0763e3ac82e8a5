"""A folder's image files as a Dataset: decoded with PIL, a corrupt file reported by name when it is read."""

from pathlib import Path
from typing import Literal

import torch
from PIL import Image
from torch.utils.data import Dataset

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff")


def read_image(path: Path, mode: Literal["RGB", "L"]) -> Image.Image:
    """The decoded image at `path` in `mode`; a corrupt or unreadable file raises ValueError naming it."""
    try:
        with Image.open(path) as image:
            return image.convert(mode)
    except (OSError, SyntaxError, ValueError) as err:  # PIL raises all three for broken files
        raise ValueError(f"cannot read image {path}: {err}. Remove or replace the file.") from err


class ImageFiles(Dataset):
    """Image files loaded with PIL; a corrupt file is reported by name when it is first read. With ``labels``
    (one per path), items are (image, label)."""

    def __init__(
        self, paths: list[Path], mode: Literal["RGB", "L"], transform, labels: list[int] | None = None
    ) -> None:
        self.paths = paths
        self.mode = mode
        self.transform = transform
        self.labels = labels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        image = self.transform(read_image(self.paths[index], self.mode))
        if self.labels is not None:
            return image, self.labels[index]
        return image
