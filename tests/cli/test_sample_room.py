"""The disk-room refusal of `python -m diffusion.sample` says both sizes in a unit that tells them apart (bytes, kB,
MB, GB), and says that the files --overwrite replaces free no room: the new ones are written beside them."""

from collections import namedtuple

import pytest
from helpers.user_errors import run_in_process

from diffusion.cli import sample

ARGS = ["--seed", "7", "--sampler", "ddim", "--steps", "2", "--device", "cpu"]
Usage = namedtuple("Usage", "total used free")
NEEDED = 500 * 8 * 8 + 4096  # 500 digits of 8x8x1 uint8, and the headers


def refused(digits_checkpoint, tmp_path, capsys, monkeypatch, free: int, *extra: str) -> str:
    monkeypatch.setattr(sample.shutil, "disk_usage", lambda path: Usage(free, 0, free))
    args = ["--ckpt", str(digits_checkpoint), "--out", str(tmp_path / "out"), "--num_samples", "500", *ARGS]
    return run_in_process(sample.main, [*args, *extra], tmp_path / "none", capsys)


@pytest.mark.parametrize(
    ("free", "sizes"),
    [
        (16_000, "the samples would take 36.1 kB and --out {out} has 16.0 kB free —"),
        (900, "the samples would take 36.1 kB and --out {out} has 900 bytes free —"),
        (
            NEEDED - 40,
            f"the samples would take {NEEDED:,} bytes and --out {{out}} has {NEEDED - 40:,} bytes free —",
        ),
    ],
    ids=["kB", "bytes", "rounded alike"],
)
def test_small_sizes_are_said_in_units_that_tell_them_apart(
    free, sizes, digits_checkpoint, tmp_path, capsys, monkeypatch
):
    line = refused(digits_checkpoint, tmp_path, capsys, monkeypatch, free)
    assert f"error: --num_samples 500: {sizes.format(out=tmp_path / 'out')}" in line, line


def test_the_files_overwrite_replaces_are_said_to_stay_until_the_new_ones_are_complete(
    digits_checkpoint, tmp_path, capsys, monkeypatch
):
    sample.main(
        ["--ckpt", str(digits_checkpoint), "--out", str(tmp_path / "out"), "--num_samples", "2", *ARGS]
    )
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    size = sum(len(contents) for contents in before.values())
    line = refused(digits_checkpoint, tmp_path, capsys, monkeypatch, 16_000, "--overwrite")
    assert (
        f"has 16.0 kB free (the samples.npz and grid.png it replaces, {size:,} bytes, stay until the new samples "
        "are complete) — sample fewer (--num_samples)"
    ) in line, line
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
