"""Writing a prepared set (`diffusion.data.prepared`) from a DataModule: what `python -m diffusion.prepare` does.

The DataModule reads its source as training would (a folder's images resized, cropped and converted as the folder
loader does; a torchvision set downloaded; an array standardized), without augmentation; its train/validation split
becomes the set's two parts. Each part is shuffled with `seed` before litdata cuts it into chunks, so a chunk holds
samples from all over the source (litdata shuffles chunks and the samples within them, never across them), and
written by `litdata.optimize` in `num_workers` processes with its progress bar. The same source, seed and worker
count give the same chunks, byte for byte. `prepared.json` is written last: a prepare stopped on the way leaves a set
that training refuses and that a new prepare replaces only when asked to (`overwrite`): a finished set in a folder is
kept until the new one, staged beside it, is finished (`diffusion.data.staging`: the lock, the staging, the swap).
Here: the samples as stored (`SampleWriter`, `encoded_sample`), `--out` checked (`named_out`,
`check_apart_from_the_data`), and the set written (`prepare`, `write_set`, `write_parts`).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import multiprocessing.util
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from diffusion.core.guidance import NO_LABEL
from diffusion.data.images import ImageDataModule
from diffusion.data.optimizing import PREPARE_ON_ANOTHER_DISK, in_a_process_group_of_its_own
from diffusion.data.prepared import (
    INDEX,
    MANIFEST,
    NO_LABEL_STORED,
    RAW_UP_TO,
    REPLACED,
    STAGING,
    Encoding,
    PreparedSet,
    is_url,
    joined,
    listing,
    litdata,
    not_prepared,
    read_bytes,
    sha256,
    store_named,
    write_bytes,
)
from diffusion.data.staging import clear, swap_in, writing_alone
from diffusion.data.vectors import VectorDataModule
from diffusion.errors import (
    DiskFull,
    InvalidValue,
    OutOfRange,
    UserError,
    WrongType,
    check_bool,
    check_choice,
    check_whole_number,
    is_disk_full,
)

# --overwrite of a finished set in a folder: the old set is kept until the new one is finished, so the disk holds both
KEPT_ON_ANOTHER_DISK = "free space there (until the new set is finished, the disk holds it and the set it replaces), or pass another {command:--out}; what this prepare wrote is removed, the prepared set there before is kept"
# --overwrite of an unfinished prepare's files, or of a set in object storage: those went first
REPLACED_ON_ANOTHER_DISK = "free space there, or pass another {command:--out}; what this prepare wrote is removed, and so are the files {command:--overwrite} replaced"
SHOWN = 4  # the user's files a refused --out names
CHUNK_BYTES = "64MB"  # litdata's default size: a few hundred MB of cache per loading process


def pixels(x: torch.Tensor) -> np.ndarray:
    """Model units in [-1, 1] back to the uint8 pixels they were made from (`to_model_units`' inverse, exact)."""
    return (x * 0.5 + 0.5).mul(255).round().clamp(0, 255).to(torch.uint8).numpy()


class SampleWriter:
    """litdata.optimize's function, run in its worker processes: entry (position, source index) -> stored item.

    A user's mistake met in a worker (a corrupt image) is pickled into the folder `errors` before litdata stops the
    prepare, so that the main process raises that very error, naming the file, not litdata's report of a worker."""

    def __init__(self, source: Dataset, kind: str, encoding: str, labelled: bool, errors: str) -> None:
        self.source, self.kind, self.encoding, self.labelled = source, kind, encoding, labelled
        self.errors = errors
        self._worker: int | None = None  # the process whose exit is seen to (`_end_helper_processes`)

    def __call__(self, entry: tuple[int, int]) -> dict[str, Any]:
        if self._worker != os.getpid():  # the first item in this worker process
            self._worker = os.getpid()
            # Before the worker's exit joins its children (`_exit_function` runs finalizers of priority >= 0
            # first): a litdata worker that failed (a full disk, a corrupt image) leaves its remover process waiting
            # on a queue nobody closes, and its exit would wait for it for ever (it did with --num_workers 1).
            multiprocessing.util.Finalize(None, _end_helper_processes, exitpriority=100)
        try:
            return self._item(*entry)
        except (ValueError, OSError, UserError) as err:
            Path(self.errors, f"{os.getpid()}.pickle").write_bytes(pickle.dumps(err))
            raise

    def _item(self, position: int, index: int) -> dict[str, Any]:
        item = self.source[index]  # Batch(x, index, label) in model units
        if self.kind == "images":
            sample = encoded_sample(pixels(item.x), self.encoding)
        else:
            sample = item.x.numpy().astype(np.float32)
        label = int(item.label) if self.labelled and int(item.label) != NO_LABEL else NO_LABEL_STORED
        return {"index": position, "sample": sample, "label": label}


def _end_helper_processes() -> None:
    """Terminate the processes a litdata worker started and left running (none after a prepare that succeeded)."""
    for helper in multiprocessing.active_children():
        helper.terminate()


def unaugmented_parts(datamodule: Any) -> dict[str, Subset]:
    """The DataModule's training and validation splits as subsets of its full dataset without random flips."""
    datamodule.prepare_data()
    datamodule.setup("fit")
    unaugmented = getattr(datamodule, "unaugmented_train_set", None)
    train = unaugmented() if unaugmented is not None else datamodule.train_set
    parts = {"train": train}
    if datamodule.val_set is not None:
        parts["val"] = Subset(train.dataset, list(datamodule.val_set.indices))
    return parts


def prepare(
    datamodule: Any,
    out: str,
    encoding: Encoding = "auto",
    seed: int = 0,
    num_workers: int | None = None,
    overwrite: bool = False,
    source: str = "",
    checked: Callable[[], None] = lambda: None,
) -> PreparedSet:
    """Write `datamodule`'s data as a prepared set at `out` (a folder or an object-storage URL). `checked` is
    called once everything is checked and the data read, before anything is written (the command's
    `--print_config`, which prints what would run)."""
    check_prepare_arguments(datamodule, encoding, seed, num_workers, overwrite)
    litdata()  # installed: said before anything is read
    shape = tuple(datamodule.sample_shape)
    kind: Literal["images", "vectors"] = "images" if len(shape) == 3 else "vectors"
    if encoding == "auto":
        encoding = "raw" if kind == "vectors" or shape[-1] <= RAW_UP_TO else "png"
    if kind == "vectors" and encoding != "raw":
        raise InvalidValue(
            f"{{command:--encoding}} {encoding} is for images; vectors are stored as they are",
            "leave it unset",
        )
    out = named_out(out)
    check_apart_from_the_data(out, getattr(datamodule, "source_paths", []))
    made = [] if is_url(out) else [p for p in (Path(out), *Path(out).absolute().parents) if not p.exists()]
    try:
        with writing_alone(out):  # refused at once while another prepare writes there
            return write_set(
                datamodule, out, (kind, encoding), seed, num_workers, overwrite, source, checked, made
            )
    finally:  # the folders it made, left empty by a refusal or a failure (or --print_config)
        for folder in made:
            with contextlib.suppress(OSError):  # one that holds something stays
                folder.rmdir()


SEED_LIMIT = 2**64  # torch.Generator takes seeds below it (a negative one modulo 2**64: another seed's order)


def check_prepare_arguments(
    datamodule: Any, encoding: Any, seed: Any, num_workers: Any, overwrite: Any
) -> None:
    """Refuse, naming the argument, what the command's parser refuses of its flags: a data module not of this
    project's kinds (a name ended in an AttributeError), an encoding not among `Encoding`'s ("webp" stored JPEG and
    recorded "webp"), a seed that is no whole number in [0, 2**64), a num_workers below 1 (litdata's traceback)
    and an overwrite that is no bool ("yes" was taken as True)."""
    if not isinstance(datamodule, ImageDataModule | VectorDataModule):
        raise WrongType(
            "datamodule", datamodule, "an ImageDataModule or a VectorDataModule",
            "build the data module first, e.g. prepare(ImageDataModule(\"digits\"), out)",
        )  # fmt: skip
    check_choice("encoding", encoding, Encoding)
    fix = f"pass a seed from 0 to {SEED_LIMIT - 1}: the order the samples are stored in"
    if not 0 <= check_whole_number("seed", seed, fix=fix) < SEED_LIMIT:
        raise OutOfRange("seed", seed, "a whole number in [0, 2**64 - 1]", fix)
    if num_workers is not None:
        check_whole_number(
            "num_workers", num_workers, 1, "pass the number of processes to write with, or None for up to 8"
        )
    check_bool("overwrite", overwrite)


def write_set(
    datamodule: Any,
    out: str,
    stored: tuple[Literal["images", "vectors"], Literal["raw", "png", "jpeg"]],
    seed: int,
    num_workers: int | None,
    overwrite: bool,
    source: str,
    checked: Callable[[], None],
    made: list[Path],
) -> PreparedSet:
    """`prepare`'s writing, once `out` is checked and its lock held: `stored` (kind, encoding); `made`, the folders
    of `out` that were not there before it."""
    lit = litdata()
    kind, encoding = stored
    shape = tuple(datamodule.sample_shape)
    there = listing(out) if is_url(out) else None  # a store's: one listing; a folder's: looked at first
    others = not_prepared(out, there)
    if others:  # the user's own files: never replaced, whatever the flags
        shown = ", ".join(others[:SHOWN]) + (", ..." if len(others) > SHOWN else "")
        raise InvalidValue(
            f"{{command:--out}} {out} holds files that are not a prepared set ({shown})",
            "choose another {command:--out}, or empty it yourself",
        )
    there = listing(out) if there is None else there
    if there and not overwrite:
        finished = "a prepared set" if MANIFEST in there else "an unfinished prepare"
        raise InvalidValue(
            f"{{command:--out}} {out} already holds data ({finished}, {len(there)} files)",
            "pass {command:--overwrite} to replace it, or choose another {command:--out}",
        )
    parts = unaugmented_parts(datamodule)
    labelled = datamodule.class_names is not None
    checked()
    # A finished set in a folder stays until the new one, written beside it (on the same disk), is finished; an
    # unfinished prepare's files (and a store's set: no renames there) go first. Never a mix of old and new chunks.
    keeping = MANIFEST in there and not is_url(out)
    written = joined(out, STAGING) if keeping else out
    for leftover in (STAGING, REPLACED) if keeping else ("",):  # a stopped prepare's files
        clear(joined(out, leftover) if leftover else out)
    fix = KEPT_ON_ANOTHER_DISK if keeping else REPLACED_ON_ANOTHER_DISK if there else PREPARE_ON_ANOTHER_DISK
    workers = num_workers or max(1, min(os.cpu_count() or 1, 8))
    try:
        with tempfile.TemporaryDirectory() as errors:
            counts = write_parts(lit, parts, written, (kind, encoding, labelled), seed, workers, errors)
        # Imports litdata, which writing the set did.
        from diffusion.data.checked_chunks import chunk_checksums

        prepared = PreparedSet(
            root=out, kind=kind, sample_shape=shape, normalization=datamodule.normalization,
            class_names=datamodule.class_names if labelled else None, counts=counts, encoding=encoding,
            random_flip=bool(getattr(datamodule, "random_flip", False)), source=source, seed=seed,
            index_sha256={part: sha256(read_bytes(written, f"{part}/{INDEX}") or b"") for part in counts},
            chunk_crc32={part: chunk_checksums(written, part) for part in counts},
        )  # fmt: skip
        try:
            write_bytes(written, MANIFEST, prepared.to_json())  # last: the set is finished
        except OSError as error:
            if is_disk_full(error):
                raise DiskFull(Path(written), MANIFEST, fix) from error
            raise
        if keeping:
            swap_in(out, written)
    except BaseException as error:
        clear(
            written
        )  # what this prepare wrote, and the folders it made (training would refuse the set anyway)
        for folder in [Path(written)] if keeping else made:
            with contextlib.suppress(OSError):  # one that holds something else stays
                folder.rmdir()
        if isinstance(error, DiskFull):  # said of --out's folders, with what became of the set there before
            folder = Path(out, Path(error.folder).relative_to(written)) if keeping else error.folder
            raise DiskFull(folder, error.name, fix) from error
        raise
    return prepared


def named_out(out: Any) -> str:
    """`out` as text, refused where it names no folder (`""` would be the current one) or no bucket (`s3://`)."""
    if isinstance(out, os.PathLike):
        out = os.fspath(out)
    if not isinstance(out, str):
        raise WrongType(
            "out", out, "a folder's path or a URL", "pass where to write the prepared set, as a str"
        )
    if not out.strip():
        raise InvalidValue(
            f"{{command:--out}} {out!r} names no folder",
            "pass the folder (or s3://, gs://, az:// URL) to write the prepared set into",
        )
    return store_named(out, "{command:--out}")  # before the store is asked


def check_apart_from_the_data(out: str, sources: list[tuple[str, str, str]]) -> None:
    """Refuse an `out` that is, lies inside or holds what the data is read from: `sources`, the data module's
    `source_paths` ((option, its value, the file or folder read)): a prepare replaces what its folder holds, and
    writes its chunks among the user's data where it lies inside it."""
    if is_url(out):
        return
    target = Path(out).resolve()
    for name, value, path in sources:
        if is_url(str(path)):
            continue
        data = Path(path).expanduser().resolve()
        relation = (
            "is" if target == data else "lies inside" if data in target.parents else "holds"
            if target in data.parents else None
        )  # fmt: skip
        if relation is None:
            continue
        at = "" if Path(path) == Path(value) else f", at {path}"
        given = Path(path) if Path(path).name not in ("", ".", "..") else data
        beside: Path | None = None  # none where the data is the whole file system
        if at:  # a folder under the option's (a torchvision set's under --data.root): another one there
            beside = Path(value, "prepared")
        elif given.name:
            beside = given.with_name(f"{given.stem if data.is_file() else given.name}_prepared")
        raise InvalidValue(
            f"{{command:--out}} {out} {relation} the data it would prepare "
            f"({{LightningDataModule:--{name}}} {value}{at})",
            "choose an {command:--out} that neither is, holds nor lies inside the data"
            + (f", e.g. {{command:--out}} {beside}" if beside else ""),
        )


def write_parts(
    lit: Any,
    parts: dict[str, Subset],
    out: str,
    stored: tuple[str, str, bool],
    seed: int,
    workers: int,
    errors: str,
) -> dict[str, int]:
    """Each part shuffled and written by litdata.optimize under out/<part>; returns the samples per part.
    `stored`: (kind, encoding, labelled) of `SampleWriter`."""
    counts = {}
    for part, subset in parts.items():
        order = torch.randperm(len(subset), generator=torch.Generator().manual_seed(seed)).tolist()
        inputs = [(position, int(subset.indices[i])) for position, i in enumerate(order)]
        print(
            f"prepare: {part}, {len(inputs):,} samples into {joined(out, part)}", file=sys.stderr, flush=True
        )
        optimize = {
            "fn": SampleWriter(subset.dataset, *stored, errors),
            "inputs": inputs,
            "output_dir": joined(out, part),
            "chunk_bytes": CHUNK_BYTES,
            "num_workers": min(workers, len(inputs)),
            "keep_data_ordered": True,
            "start_method": "fork",
            "verbose": sys.stderr.isatty(),  # its progress bar, where someone watches
        }
        in_a_process_group_of_its_own(lit.optimize, optimize, errors)
        counts[part] = len(inputs)
    return counts


def encoded_sample(sample: np.ndarray, encoding: str) -> np.ndarray | bytes:
    """uint8 (C, H, W) pixels as stored: themselves ("raw") or PNG / JPEG bytes."""
    if encoding == "raw":
        return np.ascontiguousarray(sample)
    from PIL import Image

    pixels = sample[0] if sample.shape[0] == 1 else sample.transpose(1, 2, 0)  # (H, W) or (H, W, C)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG" if encoding == "png" else "JPEG", quality=95)
    return buffer.getvalue()
