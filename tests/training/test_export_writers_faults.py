"""The export writers called from Python (`write_export`, `save_pipeline`) on a full disk or into a folder that
refuses writes: one line naming the folder (DiskFull, FlaggedFolder, CannotReplace), and nothing partial left: no
truncated weights file, no config.json without its weights (or a 0-byte model_index.json), an export already in
the folder as it was, no staging folder beside it (round 17's J9: a bare OSError / PermissionError and the partial
files; the export command staged its files, its Python writers did not). Faked full disks (helpers/full_disk.py's
`full_open`) at the weights' file, a real one (a tmpfs: `on_a_small_disk`), and `chattr +i` (skipped where refused).
"""

import errno
import os
import re
from pathlib import Path

import pytest
import torch
from helpers.full_disk import full_open, immutable, on_a_small_disk

from diffusion.errors import CannotReplace, DiskFull, FlaggedFolder
from diffusion.models import UNet
from diffusion.training import atomic_writes, exported
from diffusion.training.exported import write_export
from diffusion.training.module import DiffusionModule

REPO = Path(__file__).resolve().parents[2]
INIT_ARGS = {"in_channels": 1, "channels": 8, "channel_mult": [1, 2], "num_res_blocks": 1}
NETWORK = {"class_path": "diffusion.models.UNet", "init_args": INIT_ARGS}
FULL = (
    "free space on that disk, or write the export into another folder; an export already there is as it was"
)
FLAGGED = (
    "check its attributes (lsattr -d {}; chattr -i clears an immutable flag), or write to another folder"
)


def tiny_module(seed: int = 0) -> DiffusionModule:
    """A tiny image model that maps to a DDPMPipeline too; `seed` draws its weights (two seeds: two exports)."""
    torch.manual_seed(seed)
    return DiffusionModule(
        UNet(**INIT_ARGS), sample_shape=(1, 8, 8), num_timesteps=10, beta_schedule="cosine",
        normalization={"shift": [0.5], "scale": [0.5]},
    )  # fmt: skip


def contents(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones too), by its path relative to it, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("earlier", [False, True], ids=["empty folder", "over an export"])
@pytest.mark.parametrize("room", [0, 1000], ids=["opening", "mid-file"])
def test_write_export_on_a_full_disk_names_the_folder_and_leaves_nothing_partial(
    room, earlier, tmp_path, monkeypatch
):
    folder = tmp_path / "exp"
    folder.mkdir()
    if earlier:
        write_export(tiny_module(1), NETWORK, folder, "ema")
    before = contents(folder)
    monkeypatch.setattr(exported, "open", full_open(room), raising=False)  # the weights' file fills the disk
    with pytest.raises(DiskFull) as full:
        write_export(tiny_module(), NETWORK, folder, "raw")
    assert str(full.value) == f"no space left on the disk of {folder} while saving the export — {FULL}"
    assert contents(folder) == before  # no truncated model.safetensors; an export there as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]  # no staging folder beside it


@pytest.mark.parametrize("earlier", [False, True], ids=["new folder", "over a pipeline"])
def test_save_pipeline_on_a_full_disk_names_the_folder_and_leaves_nothing_partial(
    earlier, tmp_path, monkeypatch
):
    pytest.importorskip("diffusers")  # an optional extra: pip install -e '.[dev]'
    from diffusion.cli import to_diffusers

    folder = tmp_path / "pipe"
    if earlier:
        to_diffusers.save_pipeline(tiny_module(1), folder)
    before = contents(folder) if earlier else None
    monkeypatch.setattr(to_diffusers, "open", full_open(1000), raising=False)  # the weights fill the disk
    with pytest.raises(DiskFull) as full:
        to_diffusers.save_pipeline(tiny_module(), folder)
    assert str(full.value) == f"no space left on the disk of {folder} while saving the pipeline — {FULL}"
    if earlier:
        assert contents(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["pipe"] if earlier else []
    )  # a new folder goes again


SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from training.test_export_writers_faults import NETWORK, tiny_module
from diffusion.training.exported import write_export
from diffusion.cli.to_diffusers import save_pipeline
disk = Path(sys.argv[1])
(disk / "exp").mkdir()
for write in (lambda: write_export(tiny_module(), NETWORK, disk / "exp", "ema"),
              lambda: save_pipeline(tiny_module(), disk / "pipe")):
    try:
        write()
    except OSError as error:
        print(type(error).__name__, error)
"""


def test_the_writers_on_a_real_full_disk_name_the_folder_and_leave_nothing(tmp_path):
    """A 16 KiB tmpfs: room for the JSON files, not for the weights. Both left a partial export (a truncated
    model.safetensors, a 0-byte model_index.json) and a bare `OSError: [Errno 28] No space left on device`."""
    pytest.importorskip("diffusers")
    script = tmp_path / "writers.py"
    script.write_text(SCRIPT.format(tests=str(REPO / "tests")))
    disk = tmp_path / "disk"
    command = f"{{python}} {script} {disk}; ls -A {disk} {disk}/exp"
    result = on_a_small_disk(disk, "16k", command, REPO, timeout=300)
    assert result.stdout.splitlines() == [
        f"DiskFull no space left on the disk of {disk / 'exp'} while saving the export — {FULL}",
        f"DiskFull no space left on the disk of {disk / 'pipe'} while saving the pipeline — {FULL}",
        f"{disk}:",
        "exp",  # made by the test; nothing in it, and no pipe
        "",
        f"{disk}/exp:",
    ], result.stdout + result.stderr[-3000:]


def test_write_export_into_an_immutable_folder_is_named_and_leaves_the_export_there(tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    write_export(tiny_module(1), NETWORK, folder, "ema")
    before = contents(folder)
    with immutable(folder), pytest.raises(FlaggedFolder) as refused:
        write_export(tiny_module(), NETWORK, folder, "raw")
    assert str(refused.value) == (
        f"cannot write the export into {folder} (it is immutable) — {FLAGGED.format(folder)}; the files written "
        "there before are intact"
    )
    assert contents(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]


def test_write_export_over_an_immutable_config_json_replaces_neither_file(tmp_path):
    """The weights were replaced, then config.json refused: an export whose checksum no longer matched."""
    folder = tmp_path / "exp"
    folder.mkdir()
    write_export(tiny_module(1), NETWORK, folder, "ema")
    before = contents(folder)
    with immutable(folder / "config.json"), pytest.raises(CannotReplace) as refused:
        write_export(tiny_module(), NETWORK, folder, "raw")
    assert str(refused.value).startswith(
        f"cannot replace config.json in {folder} (it is immutable): the folder takes new files"
    )
    assert contents(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]


def test_save_pipeline_into_a_new_folder_of_an_immutable_one_names_that_one(tmp_path):
    pytest.importorskip("diffusers")
    from diffusion.cli.to_diffusers import save_pipeline

    folder = tmp_path / "imm"
    folder.mkdir()
    with immutable(folder), pytest.raises(FlaggedFolder) as refused:
        save_pipeline(tiny_module(), folder / "new" / "p")
    assert str(refused.value) == (
        f"cannot write new/p into {folder} (it is immutable) — {FLAGGED.format(folder)}; the files written there "
        "before are intact"
    )
    assert list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["imm"]


def test_files_that_cannot_be_put_back_are_said_where_they_are(tmp_path, monkeypatch):
    """The last move failing, and the moves back too: one line naming where the earlier export's files are."""
    folder = tmp_path / "exp"
    folder.mkdir()
    write_export(tiny_module(1), NETWORK, folder, "ema")
    before = contents(folder)
    renames = []

    def rename(source, target):
        renames.append(source)
        if len(renames) >= 4:  # set aside: 2, moved in: config.json, then model.safetensors refused
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        return os.replace(source, target)

    monkeypatch.setattr(atomic_writes.os, "rename", rename)
    with pytest.raises(atomic_writes.CannotPutBack) as refused:
        write_export(tiny_module(), NETWORK, folder, "raw")
    monkeypatch.undo()
    line = str(refused.value)
    aside = re.fullmatch(
        rf"cannot write the export into {re.escape(str(folder))}, nor put back the files it replaced \(Permission "
        rf"denied\) — they are in (\S+): move them back into {re.escape(str(folder))}, or write the export again "
        r"into a new folder",
        line,
    )
    assert aside, line
    assert contents(Path(aside[1])) == before  # the earlier export, whole, where the line says


def test_write_export_where_a_folder_holds_the_name_of_its_file_keeps_that_folder(tmp_path):
    # config.json a folder of the user's: it was set aside with the files replaced and removed with them, without a
    # word (tester round 22b, noted)
    folder = tmp_path / "exp"
    (folder / "config.json").mkdir(parents=True)
    (folder / "config.json" / "mine.txt").write_text("keep")
    with pytest.raises(ValueError) as refused:
        write_export(tiny_module(), NETWORK, folder, "raw")
    assert str(refused.value) == (
        f"{folder / 'config.json'} is a folder, where the file config.json of the export goes — move that folder "
        "away (it is as it was), write the export again into a new folder"
    )
    assert contents(folder) == {"config.json/mine.txt": b"keep"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]
