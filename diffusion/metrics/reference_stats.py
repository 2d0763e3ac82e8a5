"""FID statistics of a reference set in a file: the mean ``mu`` (D,) and covariance ``sigma`` (D, D) of its pool
features, so that real images are read and passed through Inception once, not at every evaluation.

The file is an .npz with keys ``mu`` and ``sigma``: the format of pytorch-fid's ``--save-stats`` and of TTUR's
precomputed statistics, and the keys of guided-diffusion's reference batches. ``sigma`` is the unbiased
covariance (``np.cov(features, rowvar=False)``, as those tools compute it). Files written here also hold
``features`` ("inception" or "pixels"), ``num_images`` and ``image_size`` (H, W), which let a mismatch be
named; files without them are accepted and checked by their dimensionality alone.

KID cannot use such a file: it compares random subsets of the features themselves, which a mean and a
covariance no longer hold.
"""

from __future__ import annotations

import os
import secrets
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from diffusion.data.numpy_files import holds_objects, numpy_file_kind
from diffusion.errors import InvalidValue, MissingFile, WrongType, check_can_replace, naming_a_full_disk

WRITE_FIX = "write one with python -m diffusion.evaluate {command:--reference} DATASET_OR_NPZ {command:--save_stats} FILE.npz"


@dataclass(frozen=True)
class FeatureStatistics:
    """Mean (D,) and unbiased covariance (D, D) of a set's pool features, float64; what produced them when
    known."""

    mu: np.ndarray
    sigma: np.ndarray
    features: str | None = None
    num_images: int | None = None
    image_size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        mu, sigma = self.mu, self.sigma
        if mu.ndim != 1 or sigma.shape != (len(mu), len(mu)):
            raise ValueError(
                f"mu has shape {mu.shape} and sigma {sigma.shape}, not (D,) and (D, D) of one feature space"
            )
        if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
            raise ValueError("mu or sigma holds NaN or infinite values")

    @property
    def size(self) -> int:
        return len(self.mu)

    def check_fits(self, features: str, size: int, image_size: tuple[int, int], name: str) -> None:
        """Raise InvalidValue (a ValueError) unless these statistics can be compared with ``features`` of length ``size`` of
        images of ``image_size``; ``name`` says where they come from (a path, an option)."""
        if self.features is not None and self.features != features:
            raise InvalidValue(
                f"{name} holds statistics of {self.features} features, not {features}",
                f"use features {self.features} ({{command:--features}} {self.features}), or write statistics of "
                f"{features} features ({{command:--save_stats}})",
            )
        if self.size != size:
            raise InvalidValue(
                f"{name} holds {self.size}-d statistics but {features} features of these images are {size}-d",
                f"use the statistics of the same features and channels ({WRITE_FIX})",
            )
        if features == "inception" and self.image_size is not None and tuple(self.image_size) != image_size:
            h, w = self.image_size
            raise InvalidValue(
                f"{name} holds statistics of {h}x{w} images but the samples are {image_size[0]}x{image_size[1]}",
                "Inception FID compares images of one size: write statistics at the samples' size "
                "({command:--save_stats} with a dataset name as {command:--reference} renders it at that size)",
            )


def is_statistics_file(path: str | Path) -> bool:
    """Whether ``path`` is an .npz archive holding ``mu`` or ``sigma`` and no images (``arr_0``): an .npz of
    images with statistics beside them (guided-diffusion's reference batches) is read as images."""
    path = Path(path)
    if not path.is_file() or numpy_file_kind(path) != "npz":
        return False  # the image reader says what is wrong with it
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = set(archive.files)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error):
        return False
    return "arr_0" not in names and bool(names & {"mu", "sigma"})


def load_statistics(path: str | Path) -> FeatureStatistics:
    """Read an .npz of FID statistics (``mu``, ``sigma``; see the module docstring), checked."""
    if not isinstance(path, str | os.PathLike):
        raise WrongType("path", path, "a path", "pass the statistics file's path (a str or pathlib.Path)")
    if isinstance(path, str) and not path:  # not the current folder, as Path("") would read it
        raise InvalidValue(
            "path is empty",
            "pass the statistics file's path (an unset variable or a blank line may have given '')",
        )
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise MissingFile(f"statistics file {path} {what}", WRITE_FIX)
    if numpy_file_kind(path) != "npz":
        raise InvalidValue(f"{path} is not an .npz archive of FID statistics", WRITE_FIX)
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [key for key in ("mu", "sigma") if key not in archive.files]
            if missing:
                raise InvalidValue(
                    f"{path} has no {' and no '.join(missing)} (it holds {archive.files}), so it is no FID "
                    "statistics file",
                    WRITE_FIX,
                )
            if any(holds_objects(path, key) for key in ("mu", "sigma")):
                raise InvalidValue(f"{path} holds Python objects (dtype object), not numbers", WRITE_FIX)
            mu, sigma = archive["mu"], archive["sigma"]
            features = str(archive["features"]) if "features" in archive.files else None
            num_images = int(archive["num_images"]) if "num_images" in archive.files else None
            size = tuple(int(s) for s in archive["image_size"]) if "image_size" in archive.files else None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as err:
        raise InvalidValue(f"{path} is truncated or corrupt ({err})", WRITE_FIX) from err
    try:
        return FeatureStatistics(
            mu.astype(np.float64), sigma.astype(np.float64), features, num_images,
            size,  # type: ignore[arg-type]  # (H, W) as save_statistics wrote it; its length is not checked
        )  # fmt: skip
    except ValueError as err:
        raise InvalidValue(f"{path}: {err}", WRITE_FIX) from err


def check_new_statistics_file(path: str | Path, overwrite: bool = False) -> Path:
    """Raise InvalidValue (a ValueError) unless ``path`` names an .npz that may be written (new, or replaced with
    ``overwrite``) in an existing folder; checked before any time is spent."""
    path = Path(path)
    if path.suffix != ".npz":
        raise InvalidValue(
            f"{{command:--save_stats}} {path} does not end in .npz",
            f"pass a name like {path.with_suffix('.npz')}",
        )
    if path.is_dir():
        raise InvalidValue(f"{{command:--save_stats}} {path} is a folder", "pass a file name ending in .npz")
    if path.exists() and not overwrite:
        raise InvalidValue(
            f"{{command:--save_stats}} {path} exists",
            "pass {command:--overwrite} to replace it, or another file name",
        )
    if not path.parent.is_dir():
        raise InvalidValue(
            f"{{command:--save_stats}} {path}: no folder {path.parent}",
            "create it first, or pass another path",
        )
    check_can_replace(path)  # an immutable file said as the file (CannotReplace), not as its writable folder
    return path


def save_statistics(path: str | Path, stats: FeatureStatistics) -> Path:
    """Write ``stats`` to ``path`` atomically (a temporary file in the same folder, renamed into place): a
    crash leaves the previous file or none, never a truncated one."""
    if not isinstance(path, str | os.PathLike):
        raise WrongType("path", path, "a file's path", "pass the .npz file to write the statistics into")
    if not isinstance(stats, FeatureStatistics):  # a str failed with an AttributeError naming nothing
        raise WrongType(
            "stats", stats, "FeatureStatistics",
            "pass the statistics to save: SampleQuality.real_statistics(), or load_statistics(path)",
        )  # fmt: skip
    path = Path(path)
    extra = {
        key: np.asarray(value)
        for key, value in [("features", stats.features), ("num_images", stats.num_images),
                           ("image_size", stats.image_size)]
        if value is not None
    }  # fmt: skip
    check_can_replace(path)  # an immutable file: said as the file, before the new one is written beside it
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with naming_a_full_disk(path), open(temporary, "xb") as file:  # a file object: np.savez adds no .npz
            # numpy's stub types savez's keyword arrays as its allow_pickle flag.
            np.savez(file, mu=stats.mu, sigma=stats.sigma, **extra)  # type: ignore[arg-type]
            file.flush()
            os.fsync(file.fileno())
        with naming_a_full_disk(path):
            os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
