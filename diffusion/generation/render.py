"""Model units -> data units -> pictures and files: the one place samples are turned into something to see.

Inside, samples are torch tensors in the model's units: (N, C, H, W) images in [-1, 1] or (N, D) vectors.
`normalization` ({"shift": [...], "scale": [...]}, from the data module, stored in every checkpoint) maps
them to data units: data = model * scale + shift, per channel or per feature. Numpy NHWC appears only in
`samples.npz`, the layout image evaluators (guided-diffusion's, EDM's) read. Samples of a class-conditional
model come with their labels (N,): `samples.npz` then holds them as `arr_1` (guided-diffusion's format) and
grids show one row per class.

Images may also arrive as uint8 (N, C, H, W) in 0..255 (`compact`): what ranks gather when they sample
together, a quarter of float32's bytes. `write_samples` and `save_preview` take either form.

The normalization given is checked in `diffusion.generation.normalization` (`check_normalization`, re-exported
here for its callers).

A grid of images in pixel units (float in [0, 1], uint8) is drawn by `diffusion.generation.image_grid`
(`save_image_grid`, `rows_by_class`), which `save_preview` uses and this module passes on to its deep path.

Samples holding NaN or infinity (a model whose weights diverged) are refused where they would become pixels or
file values (`check_finite`: in `to_uint8`, and in `SamplesWriter` for vectors), never drawn as black.
"""

import contextlib
import math
import os
import shutil
import zipfile
from pathlib import Path
from types import TracebackType
from typing import IO

import numpy as np
import torch
from matplotlib.figure import Figure

from diffusion.core.guidance import NO_LABEL
from diffusion.errors import (
    InvalidValue,
    OutOfRange,
    WrongType,
    check_can_replace,
    check_whole_number,
    naming_a_full_disk,
    naming_a_refusing_folder,
)
from diffusion.generation.arguments import checked_labels
from diffusion.generation.image_grid import rows_by_class, save_image_grid
from diffusion.generation.normalization import check_normalization as check_normalization
from diffusion.generation.normalization import check_samples_and_normalization

SAMPLES, GRID = "samples.npz", "grid.png"
MAX_SCATTER = 100_000  # vectors drawn in grid.png: a scatter of more shows no more
LABEL_CHUNK = 1 << 20
GB = 1e9


def denormalize(x: torch.Tensor, normalization: dict) -> torch.Tensor:
    """Map a batch from model units back to data units: (B, C, H, W) per channel, (B, D) per feature."""
    check_samples_and_normalization(x, normalization)
    check_normalization(normalization)
    if x.ndim < 2:
        one = "; one sample is x[None]" if x.ndim == 1 else ""
        raise InvalidValue(
            f"x has shape {tuple(x.shape)}, not a batch (B, C, H, W) of images or (B, D) of vectors",
            f"pass what generate returns{one}",
        )
    shift = torch.as_tensor(normalization["shift"], dtype=x.dtype, device=x.device)
    scale = torch.as_tensor(normalization["scale"], dtype=x.dtype, device=x.device)
    if shift.numel() != x.shape[1] or scale.numel() != x.shape[1]:
        raise InvalidValue(
            f"normalization has {shift.numel()} shift and {scale.numel()} scale values, and x has "
            f"{x.shape[1]} (its channels or features: shape {tuple(x.shape)})",
            "pass the normalization of the model that drew x (module.normalization): one shift and one scale "
            "per channel",
        )
    view = (1, -1) + (1,) * (x.ndim - 2)
    return x * scale.view(view) + shift.view(view)


class NonFiniteSamples(InvalidValue):
    """Samples holding NaN or infinity (`check_finite`): a model whose weights diverged, or whose activations
    overflowed. `count` of the `total` samples hold such a value."""

    def __init__(self, count: int, total: int) -> None:
        super().__init__(
            f"{count} of the {total} samples hold values that are not finite (NaN or infinity), which have no "
            "pixels or data values",
            "the model's weights produce samples that are not finite: sample its other weights "
            "(load_checkpoint(path, weights='ema' or 'raw')) or an earlier checkpoint, and check the training's "
            "loss for divergence",
        )
        self.count, self.total = count, total


def check_finite(samples: torch.Tensor) -> None:
    """Raise NonFiniteSamples unless every value of `samples` (N, ...) is finite: NaN would otherwise become black
    pixels (clamped, then rounded) or NaN rows of samples.npz without a word. One reduction and one read of its
    flag; the samples are counted only for the refusal. Integer samples (uint8 images) are finite."""
    if not samples.is_floating_point() or bool(torch.isfinite(samples).all()):
        return
    count = int((~torch.isfinite(samples.detach())).flatten(1).any(1).sum()) if samples.ndim > 1 else 1
    raise NonFiniteSamples(count, len(samples) if samples.ndim else 1)


def to_uint8(x: torch.Tensor, normalization: dict) -> torch.Tensor:
    """(N, C, H, W) images in model units -> uint8 (N, C, H, W) in 0..255, on x's device. Samples holding NaN or
    infinity are refused (NonFiniteSamples, an InvalidValue), not turned into black pixels."""
    check_samples_and_normalization(x, normalization)
    if x.ndim != 4:
        one = "; one image (C, H, W) is x[None]" if x.ndim == 3 else ""
        raise InvalidValue(
            f"x has shape {tuple(x.shape)}, not (N, C, H, W) images",
            f"pass a batch of images as generate returns them{one}",
        )
    if x.is_meta:  # its values, which become the pixels, are nowhere: say so, not torch's failed read
        raise InvalidValue(
            "x is a tensor on the meta device, whose values cannot be read", "pass samples that hold values"
        )
    check_finite(x)
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
    # Fixed margins that hold the axes' labels: tight_layout measuring each label's text took a third of the
    # render (0.13-0.18 -> 0.08-0.11 s on a 2-core EPYC), at every validation of a vector run.
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.07, top=0.97)
    ax = fig.subplots()
    second = lambda a: a[:, 1 % a.shape[1]]  # noqa: E731  (1-D data: plot the feature against itself)
    if reference is not None:
        ax.scatter(reference[:, 0], second(reference), s=2, alpha=0.3, c="tab:gray", label="data")
    colour = {"c": "tab:blue"} if labels is None else {"c": np.asarray(labels), "cmap": "tab10"}
    ax.scatter(points[:, 0], second(points), s=2, alpha=0.6, label="samples", **colour)
    ax.set_aspect("equal", adjustable="datalim")
    if reference is not None:
        ax.legend(loc="upper right", markerscale=4)
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


def samples_file_bytes(num_samples: int, sample_shape: tuple[int, ...], conditional: bool) -> int:
    """The bytes of a samples.npz of `num_samples` samples of `sample_shape` ((C, H, W) images, uint8; (D,)
    vectors, float32), with int64 labels when `conditional`."""
    per_sample = math.prod(sample_shape) * (1 if len(sample_shape) == 3 else 4) + (8 if conditional else 0)
    return num_samples * per_sample + 4096  # + the zip's and the .npy headers, and the grid


class SamplesWriter:
    """OUT/samples.npz and OUT/grid.png written as the samples are made, a chunk at a time: memory holds a chunk
    and the grid's samples, never all of them. Both files are written in OUT/samples.partial/ and moved into OUT
    by `finish` only once every sample is in (grid.png first, samples.npz last), so a stopped run leaves no file
    that looks complete: leaving the `with` block with an error removes the partial folder.

    `labels`: sample i has label labels[i % len(labels)] (`class_labels` repeat with the number of classes, so
    the labels of the first num_classes samples stand for all).
    """

    def __init__(
        self,
        out_dir: str | Path,
        num_samples: int,
        sample_shape: tuple[int, ...],
        normalization: dict,
        labels: torch.Tensor | None = None,
        grid_size: int = 64,
    ) -> None:
        if not isinstance(out_dir, str | os.PathLike):  # Path(5) said TypeError of os.fspath
            raise WrongType("out_dir", out_dir, "a folder's path", "pass out_dir as a str or a Path")
        grid_fix = "pass how many samples grid.png shows, >= 1"  # 0: torch.cat's error; 2.5: a slice's
        grid_size = check_whole_number("grid_size", grid_size, 1, grid_fix)
        self.out_dir, self.num_samples, self.normalization = Path(out_dir), num_samples, normalization
        self.images = len(sample_shape) == 3
        self.labels = None if labels is None else torch.as_tensor(labels).cpu().long()
        classes = 1 if self.labels is None else len(self.labels.unique())
        several_classes = self.labels is not None and classes > 1
        self.per_class = max(1, round(grid_size / classes)) if several_classes else None
        # The grid's samples: the first of them (enough for `per_class` of each class); vectors: a scatter of
        # the first MAX_SCATTER.
        self.grid_count = (
            self.per_class * len(self.labels)
            if self.per_class is not None and self.labels is not None
            else grid_size
        )
        if not self.images:
            self.grid_count = MAX_SCATTER
        self.grid_samples: list[torch.Tensor] = []
        self.written = 0
        self.partial = self.out_dir / "samples.partial"
        # The nearest folder that existed: those below it are made for OUT, and removed again on an error.
        self.existed = next(p for p in [self.out_dir, *self.out_dir.absolute().parents] if p.exists())
        # `samples.npz/out`: mkdir said NotADirectoryError of the partial folder; a folder named samples.npz in
        # OUT, the OS's IsADirectoryError of the last move, after grid.png had been moved in
        if not self.existed.is_dir():
            raise InvalidValue(
                f"out_dir={str(out_dir)!r}: {self.existed} is a file, not a folder",
                "pass a folder's path (the folders missing are made)",
            )
        taken = next(
            (self.out_dir / name for name in (SAMPLES, GRID) if (self.out_dir / name).is_dir()), None
        )
        if taken is not None:
            raise InvalidValue(
                f"out_dir={str(out_dir)!r}: {taken} is a folder, where the file {taken.name} goes",
                "move that folder away, or pass another out_dir; nothing was written",
            )
        for name in (GRID, SAMPLES):  # one flagged immutable: refused now, not after grid.png was replaced
            check_can_replace(self.out_dir / name)
        shutil.rmtree(self.partial, ignore_errors=True)  # a killed run's
        # A folder that refuses (flagged immutable too) said of the folder that existed, which refused
        inside = self.out_dir.absolute().relative_to(self.existed.absolute()) / SAMPLES
        with naming_a_refusing_folder(self.existed, str(inside)):
            self.partial.mkdir(parents=True)
        self.archive = zipfile.ZipFile(self.partial / SAMPLES, "w", zipfile.ZIP_STORED, allowZip64=True)
        in_file = (*sample_shape[1:], sample_shape[0]) if self.images else sample_shape  # images NHWC
        shape = (num_samples, *in_file)
        self.entry = self._open_array("arr_0", np.dtype(np.uint8 if self.images else np.float32), shape)

    def _open_array(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> IO[bytes]:
        """An .npy entry of the archive, its header written, to which the array's bytes are then written in order
        (the layout np.savez writes; zipfile records each entry's CRC-32, which np.load checks)."""
        entry = self.archive.open(f"{name}.npy", "w", force_zip64=True)
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(entry, header)
        return entry

    def __enter__(self) -> "SamplesWriter":
        return self

    def __exit__(
        self,
        error_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if error_type is not None:
            with contextlib.suppress(Exception):  # the error that ended the block is the one to report
                self.entry.close()
                self.archive.close()
            shutil.rmtree(self.partial, ignore_errors=True)
            # The folders made for OUT, if they are empty:
            for folder in [self.out_dir, *self.out_dir.absolute().parents]:
                if folder.absolute() == self.existed.absolute() or any(folder.iterdir()):
                    break
                folder.rmdir()

    def write(self, samples: torch.Tensor) -> None:
        """The next samples in index order: model units, or images already uint8 (`compact`). Samples holding NaN
        or infinity are refused (NonFiniteSamples), images and vectors alike, before any of them is written."""
        if self.written + len(samples) > self.num_samples:
            raise ValueError(f"{self.written + len(samples)} samples written to a file of {self.num_samples}")
        if self.images:
            samples = compact(samples, self.normalization).cpu()
            array = samples.permute(0, 2, 3, 1).numpy()
        else:
            check_finite(samples)  # images are checked in `compact`, as they are turned into pixels
            samples = samples.detach().float().cpu()
            array = denormalize(samples, self.normalization).numpy().astype(np.float32)
        with naming_a_full_disk(self.out_dir / SAMPLES):  # the partial folder goes in __exit__
            self.entry.write(np.ascontiguousarray(array).tobytes())
            assert self.archive.fp is not None  # open until __exit__
            self.archive.fp.flush()  # on disk as it comes, not in a buffer
        kept = sum(len(batch) for batch in self.grid_samples)
        if kept < self.grid_count:
            self.grid_samples.append(samples[: self.grid_count - kept])
        self.written += len(samples)

    def finish(self) -> Path:
        """Add the labels, draw the grid, and move both files into OUT; returns OUT/samples.npz."""
        if self.written != self.num_samples:
            raise ValueError(f"{self.written} samples written to a file of {self.num_samples}")
        with naming_a_full_disk(self.out_dir / SAMPLES):
            return self._finish()

    def _finish(self) -> Path:
        self.entry.close()
        if self.labels is not None:
            entry = self._open_array("arr_1", np.dtype(np.int64), (self.num_samples,))
            for start in range(0, self.num_samples, LABEL_CHUNK):
                indices = torch.arange(start, min(start + LABEL_CHUNK, self.num_samples))
                entry.write(self.labels[indices % len(self.labels)].numpy().tobytes())
            entry.close()
        self.archive.close()
        with open(self.partial / SAMPLES, "rb+") as file:
            os.fsync(file.fileno())
        self._draw_grid(self.partial / GRID)
        for name in (GRID, SAMPLES):  # samples.npz last: its presence says the run finished
            os.replace(self.partial / name, self.out_dir / name)
        self.partial.rmdir()
        return self.out_dir / SAMPLES

    def _draw_grid(self, path: Path) -> None:
        samples = torch.cat(self.grid_samples)
        labels = None if self.labels is None else self.labels[torch.arange(len(samples)) % len(self.labels)]
        if self.images and self.per_class is not None:
            save_preview(samples, self.normalization, path, labels, self.per_class)
        elif self.images:
            save_preview(samples, self.normalization, path)
        else:
            points = denormalize(samples, self.normalization).numpy()
            save_scatter(points, path, labels=None if labels is None else labels.numpy())


def write_samples(
    samples: torch.Tensor,
    normalization: dict,
    out_dir: str | Path,
    grid_size: int = 64,
    labels: torch.Tensor | None = None,
) -> Path:
    """Write out_dir/samples.npz (`arr_0`: uint8 N x H x W x C images, or float32 N x D vectors in data
    units; with `labels`, `arr_1`: int64 N labels) and out_dir/grid.png (the first `grid_size` images, or with
    labels of several classes about grid_size of them in one row per class; a scatter of the vectors); return
    the npz. `samples` are in model units, or images already uint8 (`compact`). Samples made a chunk at a time
    are written with `SamplesWriter`. `labels`: one int class per sample (NO_LABEL, -1, for none), never cycled
    when too few."""
    # SamplesWriter repeats its labels (`class_labels`): here 3 labels for 8 samples were cycled, 0.7 stored as 0
    if labels is not None:
        checked = checked_labels(None, labels, len(samples))
        assert checked is not None  # labels were given
        if len(checked) and int(checked.min()) < NO_LABEL:
            raise OutOfRange(
                "labels", int(checked.min()), f">= {NO_LABEL} (class indices; {NO_LABEL} for no class)",
                "pass one int class per sample, as generate's labels",
            )  # fmt: skip
        labels = checked
    sample_shape = tuple(samples.shape[1:])
    with SamplesWriter(out_dir, len(samples), sample_shape, normalization, labels, grid_size) as writer:
        writer.write(samples)
        return writer.finish()
