"""Pictures of samples: image grids and scatter plots of vector data (first two features)."""

import math
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from torchvision.utils import make_grid, save_image


def save_image_grid(images: torch.Tensor, path: str | Path) -> torch.Tensor:
    """Save (N, C, H, W) images in [0, 1] as a near-square grid PNG; return the grid (C, H', W')."""
    grid = make_grid(images.clamp(0, 1), nrow=int(math.ceil(math.sqrt(len(images)))), padding=1)
    save_image(grid, str(path))
    return grid


def save_scatter(points: np.ndarray, path: str | Path, reference: np.ndarray | None = None) -> None:
    """Scatter plot of the first two features of (N, D) points, optionally over reference data."""
    # A bare Figure needs no pyplot backend: works headless and leaves a notebook's backend alone.
    fig = Figure(figsize=(5, 5), dpi=100)
    ax = fig.subplots()
    second = lambda a: a[:, 1 % a.shape[1]]  # noqa: E731  (1-D data: plot the feature against itself)
    if reference is not None:
        ax.scatter(reference[:, 0], second(reference), s=2, alpha=0.3, c="tab:gray", label="data")
    ax.scatter(points[:, 0], second(points), s=2, alpha=0.6, c="tab:blue", label="samples")
    ax.set_aspect("equal", adjustable="datalim")
    if reference is not None:
        ax.legend(loc="upper right", markerscale=4)
    fig.tight_layout()
    fig.savefig(path)
