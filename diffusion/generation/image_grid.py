"""Images as a grid picture: `save_image_grid` (and `rows_by_class`, one row per class), for images already in
pixel units, float in [0, 1] or uint8 in 0..255. Samples in model units become those by
`diffusion.generation.render` (`to_uint8`, `denormalize`), which draws its own previews through here.

What cannot become the picture the caller meant is refused by the argument's name, never drawn otherwise: values
outside [0, 1] (model units -1..1, or 0..255 in a float tensor; clamped they would turn every negative value
black), values that are not finite (NaN would become black pixels), channels other than 1 or 3 (2 would be
written as gray + alpha), no images at all, and a path whose suffix names no format this writes.
"""

import math
import os
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torchvision.utils import make_grid

from diffusion.data.staging import write_atomically
from diffusion.errors import (
    CannotWrite,
    InvalidValue,
    WrongType,
    check_can_replace,
    check_folder_exists,
    check_whole_number,
    naming_a_refusing_folder,
    refusing_flag,
)

FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG"}  # suffix -> PIL's format
HALF_A_LEVEL = (
    0.5 / 255
)  # a float this far outside [0, 1] still rounds to pixel 0 or 255: rounding, not a range
TAKES = "float images in [0, 1] or uint8 images in 0..255"
FROM_SAMPLES = (
    "pass to_uint8(samples, module.normalization) (model units -> uint8 pixels, as the README does), or "
    "denormalize(samples, module.normalization) for images in [0, 1]"
)


def check_images(images: Any, fix: str) -> None:
    """`images` is a tensor of (N, C, H, W) images: WrongType for anything else, InvalidValue naming the shape of a
    tensor of another rank (one image (C, H, W) is a batch of one as `images[None]`)."""
    if not isinstance(images, torch.Tensor):
        raise WrongType("images", images, "(N, C, H, W) images as a tensor", fix)
    if images.ndim != 4:
        one = "; one image (C, H, W) is images[None]" if images.ndim == 3 else ""
        raise InvalidValue(f"images has shape {tuple(images.shape)}, not (N, C, H, W)", f"{fix}{one}")


def check_some_pixels(images: torch.Tensor) -> None:
    """`images` (a tensor) holds some: an empty batch, refused naming `images` (there is nothing to draw or score)."""
    if images.numel() == 0:
        raise InvalidValue(
            f"images has shape {tuple(images.shape)}, which holds no pixels", "pass at least one image"
        )


def rows_by_class(
    images: torch.Tensor, labels: torch.Tensor, per_class: int | None = None
) -> tuple[torch.Tensor, int]:
    """(N, C, H, W) images rearranged into one row per class present (ascending; samples in index order, at
    most `per_class` of each), short rows padded with blank images: (images, images per row)."""
    check_images(images, "pass generate's samples of images")
    check_some_pixels(images)  # no rows: Python's max() of none had failed naming nothing
    if per_class is not None:
        check_whole_number(
            "per_class", per_class, 1, "pass how many samples of each class a row shows, or None"
        )
    labels_fix = "pass the labels generate was given (ints)"
    if labels is None:  # torch said "Could not infer dtype of NoneType"
        raise WrongType(
            "labels",
            labels,
            "integer class indices, one per image",
            "an unconditional model's samples have no labels: save them with save_image_grid(images, path), not in rows by class; of a conditional model, pass the labels generate was given",
        )
    try:
        labels = torch.as_tensor(labels).cpu()
    except (TypeError, ValueError, RuntimeError) as error:  # strings, ragged lists, objects
        raise WrongType("labels", labels, "integer class indices", labels_fix) from error
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise WrongType("labels", labels, "integer class indices", labels_fix)
    if labels.shape != (len(images),):
        raise InvalidValue(
            f"labels has shape {tuple(labels.shape)}, not one label per image ({len(images)} images)",
            "pass the labels generate was given for these images, one per image",
        )
    rows = [images[labels == c][:per_class] for c in labels.unique(sorted=True)]
    width = max(len(row) for row in rows)
    blank = images.new_zeros((1, *images.shape[1:]))
    return torch.cat([torch.cat([row, blank.expand(width - len(row), -1, -1, -1)]) for row in rows]), width


def check_channels_first(images: torch.Tensor, channels: tuple[int, ...]) -> None:
    """Refuse, as channels last, a batch (N, H, W, C) whose last axis is one of the `channels` taken and whose second
    is not: the layout of sample's samples.npz, NumPy and PIL, read as (N, C, H, W) it has H channels."""
    shape = tuple(images.shape)
    if len(shape) == 4 and shape[-1] in channels and shape[1] not in channels:
        raise InvalidValue(
            f"images has shape {shape}: channels last (N, H, W, C), as samples.npz and NumPy hold images, where "
            "(N, C, H, W) goes",
            "pass images.permute(0, 3, 1, 2) (a NumPy array: torch.from_numpy(array).permute(0, 3, 1, 2))",
        )


def check_pixels(images: torch.Tensor) -> None:
    """`images` (N, C, H, W) are pictures `save_image_grid` can draw as they are: some, of 1 or 3 channels, uint8
    or float in [0, 1] (up to half a pixel level) with every value finite; InvalidValue naming `images` else."""
    shape = tuple(images.shape)
    if images.is_meta:
        raise InvalidValue(
            "images is a tensor on the meta device, whose values cannot be read",
            "pass images that hold values",
        )
    check_some_pixels(images)
    if images.shape[1] not in (1, 3):
        check_channels_first(images, (1, 3))
        raise InvalidValue(
            f"images has {images.shape[1]} channels (shape {shape}), not 1 (gray) or 3 (RGB)",
            "pass gray or RGB images (of RGBA, images[:, :3]; one channel of several, images[:, i : i + 1])",
        )
    if images.dtype == torch.uint8:
        return
    if not images.is_floating_point():
        raise InvalidValue(
            f"images are {images.dtype} values, not {TAKES}",
            "pass pixels 0..255 as images.to(torch.uint8), or values in [0, 1] as images.float()",
        )
    finite = torch.isfinite(images).flatten(1).all(1)
    if not bool(finite.all()):
        raise InvalidValue(
            f"images holds values that are not finite (NaN or infinity), which have no pixels, in "
            f"{int((~finite).sum())} of its {len(images)} images",
            "pass finite images; samples that are not finite come from weights that diverged: sample the "
            "checkpoint's other weights (load_checkpoint(path, weights='ema' or 'raw')) or an earlier one",
        )
    low, high = (float(value) for value in torch.aminmax(images.detach()))
    if low >= -HALF_A_LEVEL and high <= 1 + HALF_A_LEVEL:
        return
    problem = f"images holds values from {low:.4g} to {high:.4g}, outside [0, 1] ({TAKES} are drawn)"
    if low < -HALF_A_LEVEL:  # generate's samples as they come: -1..1
        problem += ": negative values look like samples in model units (-1..1)"
        fix = FROM_SAMPLES
    elif high > 2:
        problem += ": values above 1 look like pixels 0..255 in a float tensor"
        fix = "pass them as images.round().to(torch.uint8), or as images / 255"
    else:
        fix = f"{FROM_SAMPLES}; to cut off what lies beyond, pass images.clamp(0, 1)"
    raise InvalidValue(problem, fix)


def check_picture_path(path: Any) -> Path:
    """`path` as a Path to a picture in an existing folder whose suffix names a format `FORMATS` holds."""
    if not isinstance(path, str | os.PathLike):
        raise WrongType("path", path, "a path", "pass the picture's path (a str or pathlib.Path)")
    formats = "end it in .png (lossless) or .jpg"
    if isinstance(path, str) and not path:
        raise InvalidValue("path is empty", f"pass the picture's path; {formats}")
    picture = Path(path)
    if picture.suffix.lower() not in FORMATS:
        ends = f"ends in {picture.suffix}" if picture.suffix else "has no suffix"
        raise InvalidValue(f"path={str(path)!r} {ends}, which names no picture format this writes", formats)
    check_folder_exists(picture, "path")
    if picture.is_dir():  # the move into place said IsADirectoryError of a temporary file
        raise InvalidValue(
            f"path={str(path)!r} is a folder, not a picture's file",
            "move that folder away, or pass another path",
        )
    return picture


def save_image_grid(images: torch.Tensor, path: str | Path, nrow: int | None = None) -> torch.Tensor:
    """Save (N, C, H, W) images, 1 (gray) or 3 (RGB) channels, as a grid picture, `nrow` per row (default
    near-square); return the grid (C, H', W') in the images' dtype.

    The images are pixels: float in [0, 1] (`denormalize(samples, module.normalization)` of an image model) or
    uint8 in 0..255 (`to_uint8(samples, module.normalization)`). The format is `path`'s suffix: .png, or .jpg
    (.jpeg). Samples in model units (-1..1), values that are not finite, other channel counts and other suffixes
    are refused by the argument's name (a ValueError; a folder that is not there, FileNotFoundError; a file where
    a folder of the path should be, ValueError), not drawn as something else. A folder or an existing picture that
    refuses the write (by its mode, or flagged immutable), or a full disk, is said naming the picture (an
    OSError)."""
    check_images(images, f"pass {TAKES}, (N, C, H, W)")
    picture = check_picture_path(path)
    if nrow is not None:
        check_whole_number("nrow", nrow, 1, "pass the images per row, or None for a near-square grid")
    check_pixels(images)
    images = images.detach()
    grid = make_grid(images, nrow=nrow or int(math.ceil(math.sqrt(len(images)))), padding=1)
    # Rounded as torchvision's save_image rounds; clamped only within HALF_A_LEVEL, which rounds to 0 or 255 anyway.
    pixels = (
        grid if grid.dtype == torch.uint8 else grid.float().mul(255).add_(0.5).clamp_(0, 255).to(torch.uint8)
    )
    write_picture(pixels, picture)
    return grid


def write_picture(pixels: torch.Tensor, picture: Path) -> None:
    """`pixels` (C, H, W uint8) written to `picture`. A refusal is one line naming the picture and what refuses,
    not PIL's bare PermissionError (CannotWrite, DiskFull: OSErrors still): a folder flagged immutable by that flag
    (FlaggedFolder), a picture already there that refuses to be overwritten as that file (CannotReplace), any other
    refusing folder as the folder, a full disk as its disk, and a folder that takes no new files (/proc: PIL's
    bare FileNotFoundError) as that folder. Written to a hidden temporary name in the folder and renamed into place
    (`write_atomically`): a full disk, a kill or Ctrl+C leaves the picture there before intact and no partial file."""
    folder, name = picture.parent, picture.name
    full_disk = "free space on that disk, or save the picture on another disk"
    with naming_a_refusing_folder(folder, name, full_disk):
        # a flagged folder is said as the folder, its flag the first to clear
        if refusing_flag(folder) is None:
            check_can_replace(picture)
        image = Image.fromarray(pixels.permute(1, 2, 0).cpu().numpy())
        try:  # whole or not at all: the picture there before stays as it was, and no partial file is left
            write_atomically(
                picture, lambda into: save_synced(image, into, FORMATS[picture.suffix.lower()]), full_disk
            )
        except FileNotFoundError as error:
            if not folder.is_dir():  # removed meanwhile: said as PIL says it
                raise
            raise CannotWrite(
                folder,
                name,
                f"{error.strerror or 'No such file or directory'}: the folder takes no new files",
                "pass a path in a folder that takes files (not one of the system's, such as /proc or /sys)",
            ) from error


def save_synced(image: Image.Image, into: Path, format: str) -> None:
    """`image` saved in `format` as the new file `into`, on disk (fsynced) before it is renamed into place."""
    with open(into, "xb") as file:
        image.save(file, format=format)
        file.flush()
        os.fsync(file.fileno())
