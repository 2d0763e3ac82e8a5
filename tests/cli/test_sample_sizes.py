"""Any --num_samples: a count whose samples cannot fit on the disk is refused before any work, in one line with the
size it would need; samples are written as they are made, a chunk at a time (memory holds a chunk, not the count),
into OUT/samples.partial/, and moved into OUT only once all are in, so a stopped run leaves no file that looks
complete."""

import re
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
from helpers.user_errors import run_in_process

from diffusion.cli import sample
from diffusion.generation import ranks, render

ARGS = ["--seed", "7", "--sampler", "ddim", "--steps", "2", "--device", "cpu"]
Usage = namedtuple("Usage", "total used free")


def never_loaded(*args, **kwargs):
    raise AssertionError("the checkpoint was loaded: the size is checked before any work")


@pytest.mark.parametrize(
    ("count", "free", "expected"),
    [
        ("10000000000", 41e9, r"--num_samples 10000000000: the samples would take 640\.0 GB and --out .* has 41\.0 GB "
         r"free — sample fewer \(--num_samples\), or write to a disk with room \(--out\)"),
        ("50000", 1e6, r"--num_samples 50000: the samples would take 3\.2 MB and --out .* has 1\.0 MB free"),
    ],
)  # fmt: skip
def test_a_count_that_cannot_fit_on_the_disk_is_refused_up_front_with_its_size(
    count, free, expected, digits_checkpoint, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(render.shutil, "disk_usage", lambda path: Usage(free, 0, free))
    monkeypatch.setattr(sample, "load_checkpoint", never_loaded)
    out = tmp_path / "out"
    args = ["--ckpt", str(digits_checkpoint), "--out", str(out), "--num_samples", count, *ARGS]
    assert re.search(expected, run_in_process(sample.main, args, tmp_path / "none", capsys))
    assert not out.exists()


def test_samples_are_written_a_chunk_at_a_time_and_equal_one_chunks(digits_checkpoint, tmp_path, monkeypatch):
    whole = sample.main(["--ckpt", str(digits_checkpoint), "--out", str(tmp_path / "whole"), "--num_samples", "5",
                         "--batch_size", "2", *ARGS])  # fmt: skip
    written = []
    write = render.SamplesWriter.write

    def recording(self, samples):
        written.append(len(samples))
        assert not (self.out_dir / "samples.npz").exists()  # nothing looks finished before the end
        write(self, samples)

    monkeypatch.setattr(render.SamplesWriter, "write", recording)
    monkeypatch.setattr(ranks, "CHUNK_BYTES", 2 * 8 * 8)  # two 8x8 uint8 images a chunk
    chunked = sample.main(["--ckpt", str(digits_checkpoint), "--out", str(tmp_path / "chunked"), "--num_samples",
                           "5", "--batch_size", "2", *ARGS])  # fmt: skip
    assert written == [2, 2, 1]
    np.testing.assert_array_equal(np.load(chunked)["arr_0"], np.load(whole)["arr_0"])
    assert (tmp_path / "chunked" / "grid.png").read_bytes() == (tmp_path / "whole" / "grid.png").read_bytes()
    assert sorted(path.name for path in (tmp_path / "chunked").iterdir()) == ["grid.png", "samples.npz"]


def test_a_stopped_run_leaves_no_file_that_looks_complete(digits_checkpoint, tmp_path, monkeypatch):
    write = render.SamplesWriter.write

    def stopped_after_the_first_chunk(self, samples):
        if self.written:
            raise KeyboardInterrupt
        write(self, samples)
        assert (self.partial / "samples.npz").stat().st_size > 2 * 8 * 8  # the first chunk is on disk

    monkeypatch.setattr(render.SamplesWriter, "write", stopped_after_the_first_chunk)
    monkeypatch.setattr(ranks, "CHUNK_BYTES", 2 * 8 * 8)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stopped:  # Ctrl-C: one line and exit 130 (tests/cli/test_interrupts.py)
        sample.main(["--ckpt", str(digits_checkpoint), "--out", str(out), "--num_samples", "5", "--batch_size",
                     "2", *ARGS])  # fmt: skip
    assert stopped.value.code == 130
    assert not out.exists()  # made for this run, and removed with what it held


def test_a_killed_runs_partial_folder_is_replaced(digits_checkpoint, tmp_path):
    (tmp_path / "samples.partial").mkdir()
    (tmp_path / "samples.partial" / "samples.npz").write_bytes(b"half a file")
    path = sample.main(
        ["--ckpt", str(digits_checkpoint), "--out", str(tmp_path), "--num_samples", "2", *ARGS]
    )
    assert np.load(path)["arr_0"].shape == (2, 8, 8, 1)
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["grid.png", "samples.npz"]
