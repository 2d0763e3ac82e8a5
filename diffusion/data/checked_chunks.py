"""A prepared set's chunk checksums: the CRC-32 of each chunk computed once it is written (`chunk_checksums`, which
`prepare` writes into prepared.json), and checked the first time a process reads the chunk (`checked_stream`:
litdata's `StreamingDataset` over one part of the set, `CheckedStream`). A chunk of the right size with damaged bytes
would otherwise fail deep in litdata's decoding, or worse, decode into wrong samples without a word.

One CRC-32 pass over the chunk file per chunk per process (loading processes hold copies of their own), about
2 GB/s: 0.15 s for an epoch of 300 MB on one CPU core, 1.5 us a 3 kB image, far below a training step's time. A set
prepared before the checksums (format 1) is read as it was, a chunk litdata cannot decode named with the fix.

Imports litdata: imported only where a prepared set is read or written (`diffusion.data.prepared.litdata()` first).
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any

from litdata import StreamingDataset
from litdata.streaming.sampler import ChunkedIndex
from torch.utils.data import get_worker_info

from diffusion.data.prepared import INDEX, PreparedSet, is_url, joined, prepare_again, read_bytes
from diffusion.errors import InvalidValue

# What litdata's decoding of damaged bytes raises (numpy's reshape, an offset past the end, a pickle cut short).
DECODE_ERRORS = (ValueError, KeyError, IndexError, TypeError, EOFError, struct.error, pickle.UnpicklingError)


def file_crc32(path: str) -> str:
    """The CRC-32 of a file, as 8 hex digits: damage found at twice SHA-256's speed (not a guard against forgery)."""
    crc = 0
    with open(path, "rb") as file:
        while block := file.read(1 << 22):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def chunk_checksums(root: str, part: str) -> dict[str, str]:
    """The CRC-32 of each chunk of `part` as written (read back once: from object storage, one chunk at a time)."""
    index = json.loads(read_bytes(root, f"{part}/{INDEX}") or b"{}")
    names = [chunk["filename"] for chunk in index.get("chunks", [])]
    if is_url(root):
        return {name: f"{zlib.crc32(read_bytes(root, f'{part}/{name}') or b''):08x}" for name in names}
    return {name: file_crc32(str(Path(root, part, name))) for name in names}


def checked_stream(prepared: PreparedSet, part: str, **options: Any) -> Any:
    """litdata's StreamingDataset of `part` (`options` its own), each chunk checked against its checksum the first
    time a process reads it."""
    root = joined(prepared.root, part)
    checksums = prepared.chunk_crc32.get(part, {})
    return CheckedStream(root, root, checksums, prepare_again(prepared.root), **options)


class CheckedStream(StreamingDataset):
    """A `StreamingDataset` of `input_dir` (a prepared set's part) whose chunks are checked against `chunk_crc32`
    (chunk file name -> CRC-32; empty for a set prepared without them). `shown`: the part as said to the user."""

    def __init__(
        self, input_dir: str, shown: str, chunk_crc32: dict[str, str], fix: str, **kwargs: Any
    ) -> None:
        super().__init__(input_dir, **kwargs)
        self.shown, self.chunk_crc32, self.fix = shown, dict(chunk_crc32), fix
        self._checked: set[int] = set()  # chunks checked in this process
        # Where a loading process leaves its refusal (`StreamLoader` raises it): a DataLoader passes on a worker's
        # error as a RuntimeError holding its traceback's text.
        self.errors: str | None = None

    def __getitem__(self, index: Any) -> Any:
        try:
            return self._item(index)
        except InvalidValue as error:
            if self.errors is not None and get_worker_info() is not None:
                Path(self.errors).mkdir(mode=0o700, exist_ok=True)
                Path(self.errors, f"{os.getpid()}.pickle").write_bytes(pickle.dumps(error))
            raise

    def _item(self, index: Any) -> Any:
        chunk = self._chunk_of(index)
        if chunk is not None and self.input_dir.url is None:
            self._check(chunk)  # a folder's: before its bytes are decoded
        try:
            item = super().__getitem__(index)
        except DECODE_ERRORS as error:
            chunk = self._chunk_of(index) if chunk is None else chunk
            if chunk is None or isinstance(error, InvalidValue):
                raise
            if self._check(chunk, again=True):  # damaged bytes are said as such; the bytes prepared: a bug
                raise
            name = self._file_of(chunk)[1]
            raise InvalidValue(
                f"chunk {self.shown}/{name} cannot be decoded ({type(error).__name__}: {error}): "
                "the prepared set is damaged",
                self.fix,
            ) from error
        chunk = self._chunk_of(index) if chunk is None else chunk
        if chunk is not None:
            self._check(chunk)  # object storage's: once litdata has downloaded it whole for this item
        return item

    def _chunk_of(self, index: Any) -> int | None:
        if isinstance(index, ChunkedIndex):
            return index.chunk_index
        if isinstance(index, int) and self.cache is not None:
            return ChunkedIndex(*self.cache._get_chunk_index_from_index(index)).chunk_index
        return None

    def _file_of(self, chunk: int) -> tuple[str, str]:
        """(the chunk's local file, litdata's copy of a remote one; its name in the set)."""
        assert self.cache is not None  # an item was read
        path = self.cache._reader.config[ChunkedIndex(index=0, chunk_index=chunk)][0]  # litdata's own lookup
        return path, os.path.basename(path)

    def _check(self, chunk: int, again: bool = False) -> bool:
        """Refuse chunk `chunk` where its bytes are not the ones prepared; whether they were found to be those.
        Nothing checked for a set without checksums, or a chunk not on this disk yet (litdata downloads it for the
        item: checked once it is)."""
        if not self.chunk_crc32 or self.cache is None or (chunk in self._checked and not again):
            return chunk in self._checked
        path, name = self._file_of(chunk)
        expected = self.chunk_crc32.get(name)
        if expected is None or not os.path.isfile(path):
            return False
        self._checked.add(chunk)
        if file_crc32(path) != expected:
            raise InvalidValue(
                f"chunk {self.shown}/{name} is damaged (its bytes are not the ones prepared: the checksum differs)",
                self.fix,
            )
        return True
