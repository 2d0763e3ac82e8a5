"""A prepared set's chunk of the right size with damaged bytes: refused in one line naming the chunk and the fix, the
first time a process reads it (its SHA-256 in prepared.json), held or streamed, with or without loading processes;
a set prepared before the checksums (format 1) is read as before, and a chunk of it litdata cannot decode is named."""

import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch

from diffusion.cli.prepare import main as prepare
from diffusion.data import ImageDataModule
from diffusion.data.prepared import MANIFEST, open_prepared, sha256
from diffusion.data.streaming import StreamLoader
from diffusion.errors import UserError

DAMAGED = (
    "chunk {}/train/chunk-1-0.bin is damaged (its bytes are not the ones prepared: the checksum differs)"
)


@pytest.fixture(scope="module")
def digits_set(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "digits"
    prepare(["--out", str(out), "--num_workers", "2"])
    return out


def copy_of(root: Path, to: Path, format_1: bool = False, damaged: bool = False) -> Path:
    shutil.copytree(root, to)
    if format_1:  # as a prepare before the checksums wrote it
        body = json.loads((to / MANIFEST).read_text())
        body = {k: v for k, v in body.items() if k not in ("sha256", "chunk_crc32")} | {"format": 1}
        text = json.dumps(body, indent=1, sort_keys=True)
        (to / MANIFEST).write_text(
            json.dumps({**body, "sha256": sha256(text.encode())}, indent=1, sort_keys=True)
        )
    if damaged:  # the tester's damage: 100 zero bytes at offset 4000, the size unchanged
        with open(to / "train" / "chunk-1-0.bin", "r+b") as chunk:
            chunk.seek(4000)
            chunk.write(bytes(100))
    return to


def batches(root: Path, on_device: bool, num_workers: int = 0) -> list:
    data = ImageDataModule(
        "streaming", root=str(root), batch_size=32, on_device=on_device, num_workers=num_workers
    )
    return list(data.training_batches())


@pytest.mark.parametrize(("on_device", "workers"), [(True, 0), (False, 0), (False, 2)])
def test_a_chunk_with_damaged_bytes_is_named_with_the_fix(digits_set, tmp_path, on_device, workers):
    root = copy_of(digits_set, tmp_path / "damaged", damaged=True)
    with pytest.raises(UserError) as refused:
        batches(root, on_device, workers)
    assert str(refused.value) == (
        f"{DAMAGED.format(root)} — prepare the set again: python -m diffusion.prepare ... --out {root} --overwrite"
    )


def test_a_set_prepared_before_the_checksums_is_read_as_before_and_a_chunk_it_cannot_decode_is_named(
    digits_set, tmp_path
):
    sound = copy_of(digits_set, tmp_path / "format1", format_1=True)
    for on_device in (True, False):
        read = batches(sound, on_device)
        assert [b.index.tolist() for b in read] == [b.index.tolist() for b in batches(digits_set, on_device)]
        assert all(torch.equal(a.x, b.x) for a, b in zip(read, batches(digits_set, on_device), strict=True))
    damaged = copy_of(digits_set, tmp_path / "format1_damaged", format_1=True, damaged=True)
    for on_device in (True, False):
        with pytest.raises(UserError, match=r"chunk .*/train/chunk-1-0\.bin cannot be decoded \(") as refused:
            batches(damaged, on_device)
        assert "the prepared set is damaged — prepare the set again" in str(refused.value)


def test_a_stream_that_meets_no_damage_leaves_no_folder_behind(digits_set):
    """Its loading processes' refusals go into a folder made by the first one: a run killed with SIGKILL (no
    finalizer runs) left an empty diffusion-stream-* folder in the temporary folder each time."""
    loader = StreamLoader(open_prepared(str(digits_set)), 8, num_workers=2, seed=3)
    assert len(list(itertools.islice(loader, 3))) == 3
    assert not Path(loader.stream.errors).exists()
