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
from typing import Any, get_args

import numpy as np
import torch

from diffusion.data.numpy_files import PICKLED, holds_objects, is_torch_archive, numpy_file_kind
from diffusion.errors import (
    InvalidValue,
    MissingFile,
    WrongType,
    check_can_replace,
    check_folder_exists,
    naming_a_refusing_folder,
)
from diffusion.metrics.features import Features

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
        # FID would give a number to a sigma that is no covariance (an edited or foreign file), even a perfect 0
        check_covariance("sigma", torch.as_tensor(np.asarray(sigma, dtype=np.float64)))

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
    kind = numpy_file_kind(path)
    if kind == "pickle":
        raise InvalidValue(f"{path} {PICKLED} FID statistics (an .npz of mu and sigma)", WRITE_FIX)
    if kind != "npz":
        raise InvalidValue(f"{path} is not an .npz archive of FID statistics", WRITE_FIX)
    if is_torch_archive(path):  # a zip too: its hundreds of members were listed as the keys it holds
        raise InvalidValue(
            f"{path} is a PyTorch checkpoint (torch.save), not FID statistics",
            f"pass the .npz of mu and sigma that evaluate wrote, or {WRITE_FIX}",
        )
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = archive.files
            missing = [key for key in ("mu", "sigma") if key not in names]
            if missing:
                listed = names if len(names) <= 6 else [*names[:5], f"... ({len(names)} in all)"]
                raise InvalidValue(
                    f"{path} has no {' and no '.join(missing)} (it holds {listed}), so it is no FID "
                    "statistics file",
                    WRITE_FIX,
                )
            read = {key: read_key(path, archive, key) for key in STATISTICS_KEYS if key in names}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as err:
        raise InvalidValue(f"{path} is truncated or corrupt ({err})", WRITE_FIX) from err
    try:
        return FeatureStatistics(**read)
    except InvalidValue as err:  # a sigma that is no covariance (an edited or foreign file)
        raise InvalidValue(f"{path}: {err.problem}", WRITE_FIX) from err
    except ValueError as err:
        raise InvalidValue(f"{path}: {err}", WRITE_FIX) from err


ROUNDING = 1e-5  # of a covariance's norm: how far below zero its eigenvalues may come out of rounding alone
TINY = 1e-300  # the least shift: an all-zero covariance (features that never vary) is one


def check_covariance(name: str, sigma: torch.Tensor) -> None:
    """Refuse (InvalidValue) a finite (D, D) `sigma` that is no covariance: not symmetric, or with a negative
    eigenvalue, each beyond rounding (ROUNDING of its Frobenius norm, which bounds every eigenvalue; a singular
    covariance's zero eigenvalues come out a rounding below zero). The formula would give such a matrix a number,
    even 0 (a perfect score) for sigma1 = -I against I. A Cholesky factorization of sigma shifted by the tolerance
    decides it: a fraction of the cost of the eigenvalues the formula computes."""
    fix = f"pass {name} as a covariance: symmetric and positive semi-definite (e.g. torch.cov(features.T))"
    tolerance = ROUNDING * float(torch.linalg.matrix_norm(sigma))
    asymmetry = float((sigma - sigma.T).abs().max())
    if asymmetry > tolerance:
        raise InvalidValue(
            f"{name} is not symmetric (entries differ from their mirror by up to {asymmetry:.3g})", fix
        )
    identity = torch.eye(len(sigma), dtype=sigma.dtype, device=sigma.device)
    if int(torch.linalg.cholesky_ex(sigma + max(tolerance, TINY) * identity).info) != 0:
        smallest = float(torch.linalg.eigvalsh(sigma)[0])
        raise InvalidValue(
            f"{name} is not a covariance: it has a negative eigenvalue ({smallest:.3g}), not positive "
            "semi-definite",
            fix,
        )


# What each key of a statistics file must hold, as save_statistics writes it.
STATISTICS_KEYS = {
    "mu": "an array of numbers",
    "sigma": "an array of numbers",
    "features": f"one of {' or '.join(map(repr, get_args(Features)))}",
    "num_images": "a whole number >= 1",
    "image_size": "(height, width), two whole numbers >= 1",
}


def read_key(path: Path, archive: Any, key: str) -> Any:
    """The value of `key` in the statistics file `path`'s open archive, checked against STATISTICS_KEYS: a damaged
    one is said as the file and the key (int('abc') and iterating a 0-d array named neither)."""
    if holds_objects(path, key):  # numpy reads those only by unpickling them
        raise InvalidValue(f"{path}: {key} holds Python objects (dtype object), not numbers", WRITE_FIX)
    array = archive[key]
    kind = array.dtype.kind
    if key in ("mu", "sigma"):
        ok = kind in "iuf"
        value = array.astype(np.float64) if ok else None
    elif key == "features":
        value = str(array) if kind == "U" and array.ndim == 0 else None
        ok = value in get_args(Features)
    elif key == "num_images":
        ok = kind in "iu" and array.ndim == 0 and int(array) >= 1
        value = int(array) if ok else None
    else:
        ok = kind in "iu" and array.shape == (2,) and bool((array >= 1).all())
        value = (int(array[0]), int(array[1])) if ok else None
    if not ok:
        shown = repr(array.item()) if array.ndim == 0 else f"<array of shape {array.shape}, {array.dtype}>"
        raise InvalidValue(f"{path}: {key}={shown} is not {STATISTICS_KEYS[key]}", WRITE_FIX)
    return value


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
    if path.is_dir():  # the rename into place failed naming its temporary file
        raise InvalidValue(
            f"path {path} is a folder, not a file", f"pass the .npz file to write, e.g. {path / 'stats.npz'}"
        )
    check_folder_exists(path, "path")  # the write said the OS's error naming its temporary file
    extra = {
        key: np.asarray(value)
        for key, value in [("features", stats.features), ("num_images", stats.num_images),
                           ("image_size", stats.image_size)]
        if value is not None
    }  # fmt: skip
    check_can_replace(path)  # an immutable file: said as the file, before the new one is written beside it
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        # A folder flagged immutable is said by its flag (FlaggedFolder), as every other writer says it; a file
        # object: np.savez adds no .npz
        with naming_a_refusing_folder(path.parent, path.name), open(temporary, "xb") as file:
            # numpy's stub types savez's keyword arrays as its allow_pickle flag.
            np.savez(file, mu=stats.mu, sigma=stats.sigma, **extra)  # type: ignore[arg-type]
            file.flush()
            os.fsync(file.fileno())
        with naming_a_refusing_folder(path.parent, path.name):
            os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
