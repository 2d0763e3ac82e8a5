"""VectorDataModule: toy 2-D sets, the seeds' D-dim Gaussian and any (N, D) .npy file, standardized per feature.

Items, `sample_shape`, `normalization` and the split follow `diffusion.data.SplitDataModule`.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import torch
from torch.utils.data import TensorDataset

from diffusion.data.file_in_folder import check_path_argument
from diffusion.data.labels import load_labels
from diffusion.data.numpy_files import read_array
from diffusion.data.on_device import HeldSamples
from diffusion.data.prepared import open_prepared
from diffusion.data.split import IndexedDataset, SplitDataModule
from diffusion.data.split_options import DEFAULT_VAL_FRACTION
from diffusion.errors import (
    InvalidValue,
    OutOfRange,
    check_bool,
    check_real,
    check_whole_number,
    options_of,
)

VectorDatasetName = Literal["swiss_roll", "moons", "8gaussians", "gaussian", "npy", "streaming"]
Normalize = Literal["standardize", "minmax"]
WINSOR_QUANTILES = (0.01, 0.99)


class VectorDataModule(SplitDataModule):
    """Vectors of shape (D,), standardized per feature over the full dataset (``normalize``, ``feature_std``).

    Standardized data is not bounded, so sample it with ``clip_denoised`` false (``configs/toy2d.yaml``
    does): clipping the predicted x_0 to [-1, 1] would cut every feature at a third of its standard
    deviation. The sampler's other assumption, x_T close to N(0, I), still holds: at t = T the linear
    schedule leaves sqrt(alphas_cumprod) = 0.006 of the signal, 0.02 for a feature of std 3.

    Args:
        dataset: a toy 2-D set (``swiss_roll``, ``moons``, ``8gaussians``), ``gaussian`` (``dim``
            independent features with means evenly spaced in [-2, 2] and standard deviations in
            [0.5, 1.5]), ``npy`` (your own float array of shape (N, D) at ``path``) or ``streaming`` (a set
            `python -m diffusion.prepare` wrote at ``path``, in model units already: held where it fits, else
            streamed, with its own split, labels and normalization).
        path: a ``.npy`` file. Giving it selects ``npy`` whatever ``dataset`` says, so
            ``--data.path points.npy`` works on top of a config for a toy set.
        num_samples: samples generated for the synthetic sets (ignored for ``npy``).
        dim: feature count of ``gaussian`` (ignored otherwise).
        noise: standard deviation of Gaussian noise added to the 2-D toy sets, which are generated at
            unit scale (swiss roll divided by 10, moons as in scikit-learn, 8 gaussians on the unit circle).
        batch_size: per device (global = batch_size x devices x num_nodes x accumulate_grad_batches).
        val_fraction: share held out for validation; 0 disables validation.
        seed: seed of the generated data and of the train/val split.
        normalize: ``standardize`` (default) subtracts each feature's mean and divides by its standard
            deviation, both taken after clipping the feature to its 1st..99th percentiles (winsorizing), so a
            few far outliers neither shift nor squeeze the bulk. ``minmax`` maps each feature's range to
            [-1, 1], where one outlier 100x beyond the bulk squeezes it into 1% of the range.
        feature_std: the standard deviation of every feature in model units (``standardize`` only). Above 1
            it multiplies the signal-to-noise ratio of every timestep by ``feature_std ** 2``, so that detail a
            few percent of the data's spread wide (thin rings, small clusters) is still resolved at noise
            levels the schedule spends many steps on; 3 scored best on ``benchmarks/quality/vectors.py`` (1, 6 and 12
            blurred such detail more).
        labels: a ``.npy`` file of N integer classes 0..K-1, one per sample of the data at ``path`` (refused
            beside a generated toy set, whose points it says nothing of). Giving it trains a class-conditional model (``num_classes`` = K, linked into the network
            by the CLI); without it training is unconditional.
        cache_dir, max_cache_size: a streamed prepared set's local cache, as `ImageDataModule` takes them.
        on_device: hold the data on the training device and gather each training batch there
            (`diffusion.data.on_device`), where it fits; False reads it item by item in a DataLoader.
    """

    def __init__(
        self,
        dataset: VectorDatasetName = "swiss_roll",
        path: str | None = None,
        num_samples: int = 10000,
        dim: int = 16,
        noise: float = 0.05,
        batch_size: int = 256,
        num_workers: int = 0,
        val_fraction: float = DEFAULT_VAL_FRACTION,
        seed: int = 0,
        normalize: Normalize = "standardize",
        feature_std: float = 3.0,
        labels: str | None = None,
        on_device: bool = True,
        cache_dir: str | None = None,
        max_cache_size: str | None = None,
    ) -> None:
        check_bool("on_device", on_device)
        super().__init__(
            batch_size, num_workers, val_fraction, seed, on_device=on_device, cache_dir=cache_dir,
            max_cache_size=max_cache_size,
        )  # fmt: skip
        save = "save the array with np.save('{}.npy', array) and pass that file's path as a str"
        check_path_argument("path", path, "an (N, D) .npy file", save.format("points"), owner=type(self))
        check_path_argument(
            "labels", labels, "a .npy file of N class labels", save.format("labels"), owner=type(self)
        )
        if dataset not in get_args(VectorDatasetName):
            raise InvalidValue(
                f"unknown vector dataset {dataset!r}", f"choose one of {get_args(VectorDatasetName)}"
            )
        written = dataset  # the set asked for, where a path selects npy over it
        if path is not None and dataset != "streaming":
            dataset = "npy"
        elif dataset == "npy":
            raise InvalidValue(
                "dataset 'npy' needs a file", "set {--path} to an (N, D) .npy array", type(self)
            )
        if labels is not None and dataset not in (
            "npy",
            "streaming",
        ):  # the streamed set's refusal: _open_prepared
            raise InvalidValue(  # a conditional model trained on classes that say nothing of the points
                f"{{--labels}} {labels} gives classes of samples of your own data ({{--path}}), and dataset "
                f"{dataset!r} draws its points at random: the file's classes would say nothing of them",
                "pass {--path} with the (N, D) array the labels belong to, or leave {--labels} out",
                type(self),
            )
        with options_of(type(self)):  # a fraction reached sklearn, refused there by its own n_samples
            num_samples = check_whole_number("num_samples", num_samples, 2)
            dim = check_whole_number("dim", dim, 1)
            check_real("noise", noise), check_real("feature_std", feature_std)  # not True, nor text
        if not (math.isfinite(noise) and noise >= 0):  # NaN passed `< 0` and made every sample NaN
            raise OutOfRange("noise", noise, "a finite number >= 0", owner=type(self))
        if normalize not in get_args(Normalize):
            raise InvalidValue(f"unknown normalize {normalize!r}", f"choose one of {get_args(Normalize)}")
        if not (math.isfinite(feature_std) and feature_std > 0):
            raise OutOfRange("feature_std", feature_std, "a finite number > 0", owner=type(self))
        note = unused_options(dataset, written, path, num_samples=num_samples, dim=dim, noise=noise)
        if note:
            warnings.warn(note, stacklevel=2)
        self.dataset = dataset
        self.path = path
        self.num_samples = num_samples
        self.dim = dim
        self.noise = noise
        self.normalize, self.feature_std = normalize, feature_std
        self._labels_file = labels
        if dataset == "streaming":
            self._open_prepared(path, labels)
        self._check_streaming_options()
        if dataset == "streaming":
            return
        # Vector sets are small: load/generate now, since normalization must be known before setup.
        with options_of(type(self)):
            data = _load_npy(Path(path)) if dataset == "npy" else self._generate()  # type: ignore[arg-type]  # npy: checked
        self._shift, self._scale = feature_scaling(data, normalize, feature_std)
        self.data = torch.from_numpy(((data - self._shift) / self._scale).astype(np.float32))
        with options_of(type(self)):
            self.labels = None if labels is None else torch.from_numpy(load_labels(Path(labels), len(data)))

    def _open_prepared(self, path: str | None, labels: str | None) -> None:
        """A prepared set of vectors at `path` (`python -m diffusion.prepare`): already in model units, labelled
        or not, with its split and normalization."""
        if path is None:
            raise InvalidValue(
                "{--dataset} streaming needs the prepared set",
                "point {--path} at the folder or URL it is in",
                type(self),
            )
        if labels is not None:
            raise InvalidValue(
                "{--labels} does not apply to a prepared set (its labels were stored when it was prepared)",
                "leave {--labels} unset, or prepare the set again with them",
                type(self),
            )
        with options_of(type(self)):
            self.prepared = open_prepared(path, "{--path}")
        if self.prepared.kind != "vectors":
            raise InvalidValue(
                f"{{--path}} {path} holds prepared images, not vectors",
                f"train it with {{--class_path}} diffusion.data.ImageDataModule {{--dataset}} streaming "
                f"{{--root}} {path} and a UNet network (the image recipes, e.g. configs/digits.yaml, have both)",
                type(self),
            )
        self.dataset, self.path, self.labels = "streaming", path, None
        self._classes = self.prepared.class_names

    @property
    def num_classes(self) -> int | None:
        """K when trained on --data.labels (classes 0..K-1), else None (unconditional)."""
        if self.prepared is not None:
            return None if self._classes is None else len(self._classes)
        return None if self.labels is None else int(self.labels.max()) + 1

    @property
    def class_names(self) -> list[str] | None:
        if self.prepared is not None:
            return self._classes
        return None if self.labels is None else [str(i) for i in range(self.num_classes)]  # type: ignore[arg-type]

    @property
    def source_paths(self) -> list[tuple[str, str, str]]:
        """The files the data is read from, as (option, its value, the file read): `path` and `labels` (none for
        the generated sets). A prepare writes neither into nor over them (`diffusion.data.preparing`)."""
        named = [("path", self.path), ("labels", self._labels_file)]
        return [(name, str(value), str(value)) for name, value in named if value is not None]

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.prepared.sample_shape if self.prepared is not None else (self.data.shape[1],)

    @property
    def normalization(self) -> dict[str, list[float]]:
        if self.prepared is not None:
            return self.prepared.normalization
        return {"shift": self._shift.tolist(), "scale": self._scale.tolist()}

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None and self.prepared is not None:
            self._prepared_split(with_labels=self._classes is not None)
        if self.train_set is None:
            if self.labels is None:
                self._split(IndexedDataset(self.data))  # type: ignore[arg-type]  # a tensor indexes as a dataset
            else:
                self._split(IndexedDataset(TensorDataset(self.data, self.labels), with_labels=True))

    def _held_samples(self) -> HeldSamples:
        if self.prepared is not None:
            return self._prepared_held(with_labels=self._classes is not None, random_flip=False)
        return HeldSamples(self.data, self.labels, random_flip=False, uint8_images=False)

    def _generate(self) -> np.ndarray:
        from sklearn.datasets import make_moons, make_swiss_roll

        n, rng = self.num_samples, np.random.default_rng(self.seed)
        if self.dataset == "gaussian":
            mean, std = np.linspace(-2, 2, self.dim), np.linspace(0.5, 1.5, self.dim)
            return mean + std * rng.standard_normal((n, self.dim))
        if self.dataset == "swiss_roll":
            points = make_swiss_roll(n, noise=0.0, random_state=self.seed)[0][:, [0, 2]] / 10
        elif self.dataset == "moons":
            points = make_moons(n, noise=0.0, random_state=self.seed)[0]
        else:  # 8gaussians
            angles = rng.integers(0, 8, n) * (np.pi / 4)
            points = np.stack([np.cos(angles), np.sin(angles)], axis=1)
        return points + self.noise * rng.standard_normal(points.shape)


DEFAULTS = {"dataset": "swiss_roll", "num_samples": 10000, "dim": 16, "noise": 0.05}
GENERATED = ("swiss_roll", "moons", "8gaussians", "gaussian")  # the sets num_samples sizes


def unused_options(dataset: str, written: str, path: str | None, **given: float) -> str | None:
    """A note naming the options given (other than their defaults) that `dataset` does not use, or None: a set read
    from a file (`npy`, `streaming`) takes no name of another set, nor num_samples, dim or noise; a 2-D toy set takes
    no dim; `gaussian` takes no noise. `written`: the dataset asked for, where `path` chose `npy` over it; `given`:
    num_samples, dim and noise."""
    unused = []
    if written not in (dataset, DEFAULTS["dataset"]):
        unused.append(f"dataset={written!r}")
    users = {"num_samples": GENERATED, "dim": ("gaussian",), "noise": GENERATED[:3]}
    unused += [
        f"{name}={value}"
        for name, value in given.items()
        if value != DEFAULTS[name] and dataset not in users[name]
    ]
    if not unused:
        return None
    them = "them" if len(unused) > 1 else "it"
    if dataset == "npy":
        reason = f"path={path!r} selects dataset 'npy', whose data is read from that file"
        fix = f"leave {them} out" + (
            f", or leave path out to generate dataset {written!r}" if written != "npy" else ""
        )
    elif dataset == "streaming":
        reason, fix = f"dataset 'streaming' reads the prepared set at path={path!r}", f"leave {them} out"
    else:
        reason = f"dataset {dataset!r} does not take {them}"
        fix = f"leave {them} out (dim sizes only 'gaussian', noise only the 2-D toy sets)"
    listed = ", ".join(unused[:-1]) + (" and " if len(unused) > 1 else "") + unused[-1]
    return f"{listed} not used: {reason} — {fix}"


def feature_scaling(
    data: np.ndarray, normalize: Normalize, feature_std: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature (shift, scale) of (N, D) data, so that model units are (data - shift) / scale."""
    if normalize == "minmax":
        low, high = data.min(axis=0), data.max(axis=0)
        shift, scale = (high + low) / 2, (high - low) / 2
    else:
        low, high = np.quantile(data, WINSOR_QUANTILES, axis=0)
        clipped = np.clip(data, low, high)
        shift, scale = clipped.mean(axis=0), clipped.std(axis=0)
        # A feature constant on its central 98% but not beyond: its full spread, not a division by zero.
        scale = np.where(scale > 0, scale, data.std(axis=0)) / feature_std
    scale[scale == 0] = 1.0  # a constant feature maps to 0 rather than dividing by zero
    return shift, scale


def _load_npy(path: Path) -> np.ndarray:
    """Load an (N, D) float array (.npy, or an .npz's arr_0) as float64, with errors that say what is wrong and
    how to fix it."""
    save = "save your (N, D) array with np.save(path, array)"
    fix = (
        f"pass an (N, D) array of numbers: {save}, as float or int "
        "(a .csv: np.save(path, np.loadtxt(csv, delimiter=',')))"
    )
    array, _ = read_array(path, "{--path}", fix)
    if not np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.complexfloating):
        raise InvalidValue(
            f"{{--path}} {path} has dtype {array.dtype}, not real numbers",
            f"{save}, as float or int: array.astype(np.float32)",
        )
    if array.ndim != 2:
        raise InvalidValue(
            f"{{--path}} {path} has shape {array.shape}, expected (N, D)",
            "reshape it, e.g. array.reshape(len(array), -1) for images or array[:, None] for scalars",
        )
    if array.shape[0] < 2 or array.shape[1] < 1:
        raise InvalidValue(
            f"{{--path}} {path} has shape {array.shape}, too small", "save N >= 2 samples of D >= 1 features"
        )
    data = np.asarray(array, dtype=np.float64)
    with np.errstate(over="ignore"):  # values beyond float32 range become inf: reported just below
        bad_rows = ~np.isfinite(data.astype(np.float32)).all(axis=1)
    if bad_rows.any():
        raise InvalidValue(
            f"{{--path}} {path} has {int(bad_rows.sum())} rows with NaN/inf values (or values too large for "
            f"float32), first at row {int(bad_rows.argmax())}",
            "drop or fix them",
        )
    # Refused rather than warned about: standardized, such data is all zeros, and the model could only learn
    # to return that one point, which needs no training. A constant feature beside others that vary is data
    # (a fixed coordinate): it maps to 0 and trains (`feature_scaling`).
    if (data == data[0]).all():
        raise InvalidValue(
            f"{{--path}} {path}: its {len(data)} rows are all the same point (zero variance in every feature), "
            "so there is nothing to learn",
            "pass samples that differ (check that the array was filled)",
        )
    return data
