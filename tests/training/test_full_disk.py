"""A full disk at any point of a save is one line naming the folder (exit status 2), and leaves the file saved
before byte for byte, with no temporary file beside it.

Faked (helpers/full_disk.py: writes refused with ENOSPC after some bytes, as a real disk refuses them) at each point
of the writers: opening the file, its first bytes, the middle, the fsync, the rename; and once on a real full disk,
a 64 KiB tmpfs in a mount namespace of its own (`unshare -rm`, skipped where user namespaces are off), where torch's
zip writer raises its own RuntimeError ("unexpected pos") for the OSError it was given.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import QUICK, VALIDATING_EVERY_2, tiny_run, two_cpu_ranks_on_vectors
from helpers.full_disk import full_open, immutable, no_space, on_a_small_disk

from diffusion.errors import FREE_SPACE, CannotWrite, DiskFull, naming_a_full_disk
from diffusion.generation.render import SamplesWriter
from diffusion.training import atomic_writes
from diffusion.training.atomic_writes import save_atomically, write_atomically

REPO = Path(__file__).resolve().parents[2]
# atomic_writes.RUN_ON_ANOTHER_DISK as a command says it: its placeholders turned into train.py's flags
RUN_ON_ANOTHER_DISK = (
    "free space there, or put the run on another disk (--trainer.logger.init_args.save_dir DIR, or "
    "--trainer.default_root_dir DIR without a logger); any checkpoint saved before is intact"
)


def saved_before(folder: Path) -> tuple[Path, bytes]:
    path = folder / "last.ckpt"
    save_atomically({"step": 1, "weights": torch.arange(10.0)}, path)
    return path, path.read_bytes()


def assert_intact(path: Path, before: bytes) -> None:
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left


@pytest.mark.parametrize("room", [0, 1, 1000], ids=["opening", "first byte", "mid-file"])
def test_a_checkpoint_save_on_a_full_disk_names_the_folder_and_leaves_the_last_one(
    room, tmp_path, monkeypatch
):
    path, before = saved_before(tmp_path)
    monkeypatch.setattr(atomic_writes, "open", full_open(room), raising=False)
    with pytest.raises(DiskFull) as raised:
        save_atomically({"step": 2, "weights": torch.randn(5000)}, path, "free space")
    assert str(raised.value) == f"no space left on the disk of {tmp_path} while saving last.ckpt — free space"
    assert_intact(path, before)


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_full_disk_at_the_fsync_or_the_rename_is_named_the_same(failing, tmp_path, monkeypatch):
    path, before = saved_before(tmp_path)

    def refused(*args, **kwargs):
        raise no_space()

    monkeypatch.setattr(os, failing, refused)
    with pytest.raises(DiskFull, match=f"disk of {tmp_path} while saving last.ckpt"):
        save_atomically({"step": 2}, path)
    monkeypatch.undo()
    assert_intact(path, before)


def test_other_errors_pass_as_they_are(tmp_path, monkeypatch):
    def refused(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", refused)
    with pytest.raises(OSError) as raised:
        save_atomically({"step": 2}, tmp_path / "last.ckpt")
    assert not isinstance(raised.value, DiskFull) and raised.value.errno == errno.EIO


def test_an_image_written_on_a_full_disk_leaves_the_one_before(tmp_path):
    path = tmp_path / "latest.png"
    path.write_bytes(b"the grid before")

    def half_a_png(into: Path) -> None:
        into.write_bytes(b"\x89PNG")
        raise no_space(into)

    with pytest.raises(DiskFull, match=f"disk of {tmp_path} while saving latest.png"):
        write_atomically(path, half_a_png)
    assert_intact(path, b"the grid before")


def test_samples_written_on_a_full_disk_leave_no_partial_folder(tmp_path, monkeypatch):
    out = tmp_path / "samples"
    writer = SamplesWriter(out, 8, (1, 4, 4), {"shift": [0.5], "scale": [0.5]})
    with pytest.raises(DiskFull, match=f"disk of {out} while saving samples.npz"), writer:
        monkeypatch.setattr(writer.entry, "write", lambda data: (_ for _ in ()).throw(no_space()))
        writer.write(torch.zeros(8, 1, 4, 4))
    assert not out.exists()


def test_naming_a_full_disk_knows_a_quota_too(tmp_path):
    with pytest.raises(DiskFull), naming_a_full_disk(tmp_path / "x"):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")


def test_a_run_whose_disk_fills_at_a_checkpoint_ends_in_one_line_and_keeps_the_one_before(tmp_path, capsys):
    """last.ckpt of step 2 stays as it was when the save of step 4 finds the disk full; exit status 2."""
    run = tmp_path / "runs" / "digits" / "version_0"
    reference = tmp_path / "last_of_step_2.ckpt"
    full = {"class_path": "helpers.full_disk.FullDiskAt", "init_args": {
        "step": 3, "watch": str(run / "checkpoints" / "last.ckpt"), "reference": str(reference)}}  # fmt: skip
    try:
        with pytest.raises(SystemExit) as exited:
            tiny_run(
                tmp_path / "runs", *QUICK, *VALIDATING_EVERY_2, "--trainer.callbacks=" + json.dumps([full])
            )
    finally:
        if hasattr(atomic_writes, "open"):
            del atomic_writes.open
    error = capsys.readouterr().err
    assert exited.value.code == 2, error[-3000:]
    lines = [line for line in error.splitlines() if line.startswith("error:")]
    assert lines == [
        f"error: no space left on the disk of {run / 'checkpoints'} while saving step=4.ckpt — "
        + RUN_ON_ANOTHER_DISK
    ], error[-3000:]
    assert "Traceback" not in error
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == reference.read_bytes()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt", "step=2.ckpt"]


REAL_FULL_DISK = """
import shutil, sys, torch
from pathlib import Path
from diffusion.cli.flag_names import flag_text
from diffusion.errors import DiskFull
from diffusion.training.atomic_writes import save_atomically, write_atomically
from diffusion.generation.render import save_preview
from diffusion.errors import naming_a_full_disk
from diffusion.models import MLP
from diffusion.training.exported import write_export
from diffusion.training.module import DiffusionModule
disk = Path(sys.argv[1])
module = DiffusionModule(MLP(in_channels=2, hidden_dim=128, num_blocks=2), sample_shape=(2,))
network = {"class_path": "diffusion.models.MLP", "init_args": {"in_channels": 2, "hidden_dim": 128, "num_blocks": 2}}
def export():  # as the export command writes one: safetensors' own writer said a full disk as a SafetensorError
    (disk / "export").mkdir()
    try:
        with naming_a_full_disk(disk / "the export"):
            write_export(module, network, disk / "export", "raw")
    finally:
        shutil.rmtree(disk / "export")
save_atomically({"w": torch.zeros(10)}, disk / "last.ckpt")
for name, write in [
    ("last.ckpt", lambda: save_atomically({"w": torch.randn(40000)}, disk / "last.ckpt")),
    ("grid.png", lambda: write_atomically(disk / "grid.png", lambda into: save_preview(
        torch.rand(64, 3, 64, 64) * 2 - 1, {"shift": [0.5] * 3, "scale": [0.5] * 3}, into))),
    ("the export", export),
]:
    try:
        write()
        print(name, "written")
    except DiskFull as error:
        print(error.said(flag_text))  # as a command says it
print(sorted(p.name for p in disk.iterdir()), torch.load(disk / "last.ckpt")["w"].abs().sum().item())
"""


def test_on_a_real_full_disk_torchs_own_error_is_named_as_a_full_disk(tmp_path):
    script = tmp_path / "fill.py"
    script.write_text(textwrap.dedent(REAL_FULL_DISK))
    disk = tmp_path / "disk"
    result = on_a_small_disk(disk, "64k", f"exec {{python}} {script} {disk}", REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        f"no space left on the disk of {disk} while saving last.ckpt — {FREE_SPACE}",
        f"no space left on the disk of {disk} while saving grid.png — {RUN_ON_ANOTHER_DISK}",
        f"no space left on the disk of {disk} while saving the export — {FREE_SPACE}",
        "['last.ckpt'] 0.0",
    ], result.stdout + result.stderr[-3000:]


def test_a_full_disk_in_a_write_of_lightnings_is_named_too(tmp_path, capsys):
    hparams = tmp_path / "runs" / "digits" / "version_0" / "hparams.yaml"
    full = {"class_path": "helpers.full_disk.FullDiskOutsideTheProject", "init_args": {"path": str(hparams)}}
    with pytest.raises(SystemExit) as exited:
        tiny_run(tmp_path / "runs", "--trainer.callbacks=" + json.dumps([full]))
    error = capsys.readouterr().err
    assert exited.value.code == 2, error[-3000:]
    assert error.strip().splitlines()[-1] == (
        f"error: no space left on the disk of {hparams.parent} while saving hparams.yaml — "
        + RUN_ON_ANOTHER_DISK
    ), error[-3000:]


def test_under_ddp_a_full_disk_at_a_checkpoint_ends_the_job_in_one_line(tmp_path):
    """Two gloo ranks under train.py's own launcher (rank 0 starts rank 1): rank 0's save of step 4 finds the disk
    full. The job ends with status 2 and rank 0's one line, no rank prints a traceback or stays behind, and the
    checkpoint of step 2 is intact."""
    run = tmp_path / "runs" / "toy2d" / "version_0"
    reference = tmp_path / "last_of_step_2.ckpt"
    full = {"class_path": "helpers.full_disk.FullDiskAt", "init_args": {
        "step": 3, "watch": str(run / "checkpoints" / "last.ckpt"), "reference": str(reference)}}  # fmt: skip
    environment = {
        k: v for k, v in os.environ.items() if k not in ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE")
    }
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO / "tests"), environment.get("PYTHONPATH")])
    )
    environment["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, str(REPO / "train.py"), *two_cpu_ranks_on_vectors(max_steps=8, val_check_interval=2),
               "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
               "--trainer.callbacks=" + json.dumps([full])]  # fmt: skip
    result = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert [line for line in output.splitlines() if line.startswith("error:")] == [
        f"error: no space left on the disk of {run / 'checkpoints'} while saving step=4.ckpt — {RUN_ON_ANOTHER_DISK}"
    ], output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == reference.read_bytes()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt", "step=2.ckpt"]


@pytest.mark.parametrize("refusing", ["checkpoints", "run", "samples"])
def test_a_resumed_run_whose_folder_refuses_writes_is_refused_before_training(refusing, tmp_path, capsys):
    """Its checkpoints, sample grids (post-hoc EMA snapshots alike) or the run folder's lock would fail only after
    training, the steps lost: refused at start, one line naming the folder, nothing written."""
    tiny_run(tmp_path / "runs", *QUICK)
    run = tmp_path / "runs" / "digits" / "version_0"
    folder = run if refusing == "run" else run / refusing
    assert folder.is_dir()
    before = (run / "checkpoints" / "last.ckpt").read_bytes()
    with immutable(folder), pytest.raises(SystemExit) as exited:
        tiny_run(tmp_path / "runs", *QUICK, "--ckpt_path", "last", "--max_steps", "6")
    error = capsys.readouterr().err
    assert exited.value.code == 2, error[-3000:]
    # V6: an immutable folder, whose mode bits let this user (root) write, is said by its flag: not "make it writable"
    assert error.strip().splitlines()[-1] == (
        f"error: cannot write the resumed run's files into {folder} (it is immutable) — check its attributes "
        f"(lsattr -d {folder}; chattr -i clears an immutable flag), or write to another folder; the files written "
        "there before are intact"
    ), error[-3000:]
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == before


def test_a_checkpoint_folder_that_refuses_a_save_is_named_and_keeps_the_one_before(tmp_path, monkeypatch):
    """A folder that turns read-only while the run trains: the save is one line naming it, no traceback."""
    path, before = saved_before(tmp_path)
    refused = OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(
        atomic_writes, "open", lambda *args, **kwargs: (_ for _ in ()).throw(refused), raising=False
    )
    with pytest.raises(
        CannotWrite, match=f"cannot write last.ckpt into {tmp_path} \\(Read-only file system\\)"
    ):
        save_atomically({"w": torch.zeros(3)}, path, atomic_writes.RUN_ON_ANOTHER_DISK)
    assert_intact(path, before)


class FlaggedAt(L.Callback):
    """At optimizer step `step`, between two checkpoint saves, `folder` (the run's checkpoints/) is made immutable
    (`chattr +i`), after its last.ckpt was copied to `reference`, for the test to compare; the test clears the flag."""

    def __init__(self, step: int, folder: str, reference: str) -> None:
        self.step, self.folder, self.reference = step, folder, reference

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch, index: int
    ) -> None:
        if trainer.global_step == self.step and not Path(self.reference).exists():
            shutil.copyfile(Path(self.folder) / "last.ckpt", self.reference)
            subprocess.run(["chattr", "+i", self.folder], check=True)


@pytest.mark.parametrize("when", ["before the run", "between saves"])
def test_an_immutable_checkpoint_folder_is_said_by_its_flag_and_keeps_the_checkpoints_before(
    when, tmp_path, capsys
):
    """Round 18b's M10: train.py's save into a checkpoints/ folder flagged immutable (`chattr +i`; root, whose mode
    bits allow the write, is refused too) said `(Operation not permitted) — make that folder writable for this
    user`, which would not help: said by its flag, as the export writers say it. Flagged before the run (its first
    save fails) or between two saves (the checkpoints saved before stay as they were)."""
    with immutable(tmp_path):  # skipped where the flag cannot be set
        pass
    checkpoints = tmp_path / "runs" / "digits" / "v" / "checkpoints"
    reference = tmp_path / "last_of_step_2.ckpt"
    flagged = {"class_path": "test_full_disk.FlaggedAt", "init_args": {
        "step": 3, "folder": str(checkpoints), "reference": str(reference)}}  # fmt: skip
    if when == "before the run":
        checkpoints.mkdir(parents=True)
        subprocess.run(["chattr", "+i", str(checkpoints)], check=True)
    extra = ["--trainer.callbacks=" + json.dumps([flagged])] if when == "between saves" else []
    args = [*QUICK, *VALIDATING_EVERY_2, "--trainer.logger.init_args.version", "v", *extra]
    try:
        with pytest.raises(SystemExit) as exited:
            tiny_run(tmp_path / "runs", *args)
    finally:
        if checkpoints.is_dir():
            subprocess.run(["chattr", "-i", str(checkpoints)], check=True)
    error = capsys.readouterr().err
    assert exited.value.code == 2, error[-3000:]
    name = "step=2.ckpt" if when == "before the run" else "step=4.ckpt"
    assert [line for line in error.splitlines() if line.startswith("error:")] == [
        f"error: cannot write {name} into {checkpoints} (it is immutable) — check its attributes (lsattr -d "
        f"{checkpoints}; chattr -i clears an immutable flag), or write to another folder; the files written there "
        "before are intact"
    ], error[-3000:]
    assert "Traceback" not in error
    if when == "before the run":
        assert list(checkpoints.iterdir()) == []
    else:
        assert (checkpoints / "last.ckpt").read_bytes() == reference.read_bytes()
        assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step=2.ckpt"]


def test_a_diffusers_export_onto_a_real_full_disk_is_one_line_naming_the_folder(digits_checkpoint, tmp_path):
    """diffusers' save_pretrained wrote the weights with safetensors' own writer, whose SafetensorError names no
    errno (a bug's traceback); the export writes them by Python, as it does the safetensors format's."""
    pytest.importorskip("diffusers")  # an optional extra: pip install -e '.[dev]'
    disk = tmp_path / "disk"
    export = f"{{python}} -m diffusion.export --ckpt {digits_checkpoint} --format diffusers --out {disk}/expd"
    # 16 KiB: room for the three JSON files (a 4 KiB page each), not for the weights
    result = on_a_small_disk(disk, "16k", f"{export}; echo exit $?; ls -A {disk}", REPO, timeout=300)
    assert result.stdout.splitlines() == ["exit 2"], result.stdout + result.stderr[-3000:]  # and nothing left
    assert result.stderr.splitlines()[-1] == (
        f"error: no space left on the disk of {disk / 'expd'} while saving the export — free space there, or pass "
        "another --out"
    ), result.stderr[-3000:]


@pytest.mark.parametrize("name", ["samples.npz", "grid.png"])
def test_sample_over_a_file_that_refuses_writes_is_refused_before_sampling(
    name, digits_checkpoint, tmp_path, capsys
):
    """Round 4's G1: with --overwrite, an immutable samples.npz failed after sampling, the grid already replaced by
    the new one, and the line said the files before were intact. Round 11's V6: said as the file, not its folder
    (which takes files)."""
    from diffusion.cli import sample

    out = tmp_path / "out"

    def args(num_samples: int) -> list[str]:
        return ["--ckpt", str(digits_checkpoint), "--num_samples", str(num_samples), "--steps", "2", "--sampler",
                "ddim", "--out", str(out), "--device", "cpu"]  # fmt: skip

    sample.main(args(2))
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    capsys.readouterr()
    with immutable(out / name), pytest.raises(SystemExit) as exited:
        sample.main([*args(4), "--overwrite"])
    error = capsys.readouterr().err
    assert exited.value.code == 2, error[-3000:]
    assert error.strip().splitlines()[-1] == (
        f"error: cannot replace {name} in {out} (it is immutable): the folder takes new files, but {name} itself "
        f"refuses to be replaced — check its attributes (lsattr {out / name}; chattr -i clears an immutable flag) "
        "and its owner, or move it away; it is as it was, and the files written there before are intact"
    ), error[-3000:]
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
