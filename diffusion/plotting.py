"""Pictures of samples: image grids and scatter plots of vector data (first two features)."""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torchvision.utils import make_grid, save_image  # noqa: E402


def save_image_grid(images: torch.Tensor, path: str | Path) -> torch.Tensor:
    """Save (N, C, H, W) images in [0, 1] as a near-square grid PNG; return the grid (C, H', W')."""
    grid = make_grid(images.clamp(0, 1), nrow=int(math.ceil(math.sqrt(len(images)))), padding=1)
    save_image(grid, str(path))
    return grid


def save_scatter(points: np.ndarray, path: str | Path, reference: np.ndarray | None = None) -> None:
    """Scatter plot of the first two features of (N, D) points, optionally over reference data."""
    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    if reference is not None:
        ax.scatter(
            reference[:, 0], reference[:, 1 % reference.shape[1]], s=2, alpha=0.3, c="tab:gray", label="data"
        )
    ax.scatter(points[:, 0], points[:, 1 % points.shape[1]], s=2, alpha=0.6, c="tab:blue", label="samples")
    ax.set_aspect("equal", adjustable="datalim")
    if reference is not None:
        ax.legend(loc="upper right", markerscale=4)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
