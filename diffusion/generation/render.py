"""Model units -> data units -> pictures and files: the one place samples are turned into something to see.

Inside, samples are torch tensors in the model's units: (N, C, H, W) images in [-1, 1] or (N, D) vectors.
`normalization` ({"shift": [...], "scale": [...]}, from the data module, stored in every checkpoint) maps
them to data units: data = model * scale + shift, per channel or per feature. Numpy NHWC appears only in
`samples.npz`, the layout image evaluators (guided-diffusion's, EDM's) read. Samples of a class-conditional
model come with their labels (N,): `samples.npz` then holds them as `arr_1` (guided-diffusion's format) and
grids show one row per class.

Images may also arrive as uint8 (N, C, H, W) in 0..255 (`compact`): what ranks gather when they sample
together, a quarter of float32's bytes. `write_samples` and `save_preview` take either form.
"""

import math
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from torchvision.utils import make_grid, save_image


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


def to_uint8(x: torch.Tensor, normalization: dict) -> torch.Tensor:
    """(N, C, H, W) images in model units -> uint8 (N, C, H, W) in 0..255, on x's device."""
    if x.ndim != 4:
        raise ValueError(f"expected images of shape (N, C, H, W), got shape {tuple(x.shape)}")
    images = denormalize(x.detach().float(), normalization).clamp(0, 1)
    return images.mul(255).round().to(torch.uint8)


def compact(samples: torch.Tensor, normalization: dict) -> torch.Tensor:
    """Samples in the form ranks exchange and files store: images as uint8 (N, C, H, W) in 0..255 (`to_uint8`;
    1 byte a value instead of float32's 4), vectors unchanged (float, model units: small, with no uint8 form).
    uint8 images pass through as they are."""
    if samples.ndim != 4 or samples.dtype == torch.uint8:
        return samples
    return to_uint8(samples, normalization)


def to_uint8_images(x: torch.Tensor, normalization: dict) -> np.ndarray:
    """(N, C, H, W) in model units -> numpy uint8 (N, H, W, C), the layout of `samples.npz`."""
    return to_uint8(x, normalization).permute(0, 2, 3, 1).cpu().numpy()


def rows_by_class(
    images: torch.Tensor, labels: torch.Tensor, per_class: int | None = None
) -> tuple[torch.Tensor, int]:
    """(N, C, H, W) images rearranged into one row per class present (ascending; samples in index order, at
    most `per_class` of each), short rows padded with blank images: (images, images per row)."""
    labels = torch.as_tensor(labels).cpu()
    if labels.shape != (len(images),):
        raise ValueError(
            f"need one label per image, got {tuple(labels.shape)} labels for {len(images)} images"
        )
    rows = [images[labels == c][:per_class] for c in labels.unique(sorted=True)]
    width = max(len(row) for row in rows)
    blank = images.new_zeros((1, *images.shape[1:]))
    return torch.cat([torch.cat([row, blank.expand(width - len(row), -1, -1, -1)]) for row in rows]), width


def save_image_grid(images: torch.Tensor, path: str | Path, nrow: int | None = None) -> torch.Tensor:
    """Save (N, C, H, W) images in [0, 1] as a grid PNG, `nrow` per row (default near-square); return the grid
    (C, H', W')."""
    nrow = nrow or int(math.ceil(math.sqrt(len(images))))
    grid = make_grid(images.clamp(0, 1), nrow=nrow, padding=1)
    save_image(grid, str(path))
    return grid


def save_scatter(
    points: np.ndarray,
    path: str | Path,
    reference: np.ndarray | None = None,
    labels: np.ndarray | None = None,
) -> None:
    """Scatter plot of the first two features of (N, D) points, optionally over reference data; with `labels`,
    coloured by class."""
    # A bare Figure needs no pyplot backend: works headless and leaves a notebook's backend alone.
    fig = Figure(figsize=(5, 5), dpi=100)
    ax = fig.subplots()
    second = lambda a: a[:, 1 % a.shape[1]]  # noqa: E731  (1-D data: plot the feature against itself)
    if reference is not None:
        ax.scatter(reference[:, 0], second(reference), s=2, alpha=0.3, c="tab:gray", label="data")
    colour = {"c": "tab:blue"} if labels is None else {"c": np.asarray(labels), "cmap": "tab10"}
    ax.scatter(points[:, 0], second(points), s=2, alpha=0.6, label="samples", **colour)
    ax.set_aspect("equal", adjustable="datalim")
    if reference is not None:
        ax.legend(loc="upper right", markerscale=4)
    fig.tight_layout()
    fig.savefig(path)


def save_preview(
    samples: torch.Tensor,
    normalization: dict,
    path: str | Path,
    labels: torch.Tensor | None = None,
    per_class: int | None = None,
) -> torch.Tensor | None:
    """A picture of samples in model units (or uint8 images, see `compact`): an image grid (returned, for
    TensorBoard) or, for vectors, a scatter plot of the first two features (returns None). With `labels` of more
    than one class, the grid has one row per class (at most `per_class` samples each) and the scatter is
    coloured by class."""
    if samples.ndim == 4:
        # Through uint8 whatever the input, so the grid shows exactly the pixels samples.npz holds.
        images = compact(samples, normalization).cpu().float() / 255
        if labels is not None and len(torch.as_tensor(labels).unique()) > 1:
            images, per_row = rows_by_class(images, labels, per_class)
            return save_image_grid(images, path, per_row)
        return save_image_grid(images, path)
    points = denormalize(samples.detach().float().cpu(), normalization).numpy()
    save_scatter(points, path, labels=None if labels is None else torch.as_tensor(labels).cpu().numpy())
    return None


def write_samples(
    samples: torch.Tensor,
    normalization: dict,
    out_dir: str | Path,
    grid_size: int = 64,
    labels: torch.Tensor | None = None,
) -> Path:
    """Write out_dir/samples.npz (`arr_0`: uint8 N x H x W x C images, or float32 N x D vectors in data
    units; with `labels`, `arr_1`: int64 N labels) and out_dir/grid.png (the first `grid_size` images, or with
    labels of several classes about grid_size of them in one row per class; a scatter of all vectors); return
    the npz. `samples` are in model units, or images already uint8 (`compact`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    label_array = None if labels is None else torch.as_tensor(labels).cpu().numpy().astype(np.int64)
    if samples.ndim == 4:
        images = compact(samples, normalization)  # (N, C, H, W) uint8
        array = images.permute(0, 2, 3, 1).cpu().numpy()
        if label_array is not None and len(np.unique(label_array)) > 1:
            per_class = max(1, round(grid_size / len(np.unique(label_array))))
            save_preview(images, normalization, out_dir / "grid.png", labels, per_class)
        else:
            save_preview(images[:grid_size], normalization, out_dir / "grid.png")
    else:
        array = denormalize(samples.detach().float().cpu(), normalization).numpy().astype(np.float32)
        save_scatter(array, out_dir / "grid.png", labels=label_array)
    path = out_dir / "samples.npz"
    np.savez(path, *([array] if label_array is None else [array, label_array]))  # arr_0[, arr_1]
    return path
