"""Writing a prepared set (`diffusion.data.prepared`) from a DataModule: what `python -m diffusion.prepare` does.

The DataModule reads its source as training would (a folder's images resized, cropped and converted as the folder
loader does; a torchvision set downloaded; an array standardized), without augmentation; its train/validation split
becomes the set's two parts. Each part is shuffled with `seed` before litdata cuts it into chunks, so a chunk holds
samples from all over the source (litdata shuffles chunks and the samples within them, never across them), and
written by `litdata.optimize` in `num_workers` processes with its progress bar. The same source, seed and worker
count give the same chunks, byte for byte. `prepared.json` is written last: a prepare stopped on the way leaves a set
that training refuses and that a new prepare replaces only when asked to (`overwrite`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from diffusion.core.guidance import NO_LABEL
from diffusion.data.prepared import (
    INDEX,
    MANIFEST,
    NO_LABEL_STORED,
    RAW_UP_TO,
    Encoding,
    PreparedSet,
    clear,
    encoded_sample,
    joined,
    listing,
    litdata,
    read_bytes,
    sha256,
    write_bytes,
)
from diffusion.errors import UserError

CHUNK_BYTES = "64MB"  # litdata's default size: a few hundred MB of cache per loading process


def pixels(x: torch.Tensor) -> np.ndarray:
    """Model units in [-1, 1] back to the uint8 pixels they were made from (`to_model_units`' inverse, exact)."""
    return (x * 0.5 + 0.5).mul(255).round().clamp(0, 255).to(torch.uint8).numpy()


class SampleWriter:
    """litdata.optimize's function, run in its worker processes: entry (position, source index) -> stored item."""

    def __init__(self, source: Dataset, kind: str, encoding: str, labelled: bool) -> None:
        self.source, self.kind, self.encoding, self.labelled = source, kind, encoding, labelled

    def __call__(self, entry: tuple[int, int]) -> dict[str, Any]:
        position, index = entry
        item = self.source[index]  # Batch(x, index, label) in model units
        if self.kind == "images":
            sample = encoded_sample(pixels(item.x), self.encoding)
        else:
            sample = item.x.numpy().astype(np.float32)
        label = int(item.label) if self.labelled and int(item.label) != NO_LABEL else NO_LABEL_STORED
        return {"index": position, "sample": sample, "label": label}


def unaugmented_parts(datamodule: Any) -> dict[str, Subset]:
    """The DataModule's training and validation splits as subsets of its full dataset without random flips."""
    datamodule.prepare_data()
    datamodule.setup("fit")
    train = (
        datamodule.unaugmented_train_set()
        if hasattr(datamodule, "unaugmented_train_set")
        else datamodule.train_set
    )
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
) -> PreparedSet:
    """Write `datamodule`'s data as a prepared set at `out` (a folder or an object-storage URL)."""
    lit = litdata()
    shape = tuple(datamodule.sample_shape)
    kind = "images" if len(shape) == 3 else "vectors"
    if encoding == "auto":
        encoding = "raw" if kind == "vectors" or shape[-1] <= RAW_UP_TO else "png"
    if kind == "vectors" and encoding != "raw":
        raise UserError(
            f"--encoding {encoding} is for images; vectors are stored as they are", "leave --encoding unset"
        )
    there = listing(out)
    if there and not overwrite:
        finished = "a prepared set" if MANIFEST in there else "an unfinished prepare"
        raise UserError(
            f"--out {out} already holds data ({finished}, {len(there)} files)",
            "pass --overwrite to replace it, or choose another --out",
        )
    parts = unaugmented_parts(datamodule)
    labelled = datamodule.class_names is not None
    if there:
        clear(out)  # never a mix of old and new chunks
    workers = num_workers or max(1, min(os.cpu_count() or 1, 8))
    counts, index_sha256 = {}, {}
    for part, subset in parts.items():
        order = torch.randperm(len(subset), generator=torch.Generator().manual_seed(seed)).tolist()
        inputs = [(position, int(subset.indices[i])) for position, i in enumerate(order)]
        print(
            f"prepare: {part}, {len(inputs):,} samples into {joined(out, part)}", file=sys.stderr, flush=True
        )
        lit.optimize(
            fn=SampleWriter(subset.dataset, kind, encoding, labelled),
            inputs=inputs,
            output_dir=joined(out, part),
            chunk_bytes=CHUNK_BYTES,
            num_workers=min(workers, len(inputs)),
            keep_data_ordered=True,
            start_method="fork",
        )
        counts[part] = len(inputs)
        index_sha256[part] = sha256(read_bytes(out, f"{part}/{INDEX}") or b"")
    prepared = PreparedSet(
        root=out,
        kind=kind,
        sample_shape=shape,
        normalization=datamodule.normalization,
        class_names=datamodule.class_names if labelled else None,
        counts=counts,
        encoding=encoding,
        random_flip=bool(getattr(datamodule, "random_flip", False)),
        source=source,
        seed=seed,
        index_sha256=index_sha256,
    )
    write_bytes(out, MANIFEST, prepared.to_json())
    return prepared
