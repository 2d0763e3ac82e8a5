"""`python -m diffusion.export --overwrite` replaces an earlier export whole or not at all: a file of it that cannot
be replaced (`chattr +i`), or a move refused half-way, leaves every file of the earlier export as it was (it left a
new config.json beside the old weights, which then failed their checksum), and the line says so truly."""

import errno
import os
from pathlib import Path

import pytest
from helpers.full_disk import immutable
from helpers.user_errors import error_line

from diffusion.cli import export
from diffusion.errors import MAKE_WRITABLE, writes
from diffusion.training import atomic_writes
from diffusion.training.atomic_writes import CannotReplace
from diffusion.training.loading import load_checkpoint


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        export.main(argv)
    assert exit_info.value.code == 2
    return error_line(capsys.readouterr().err)


@pytest.fixture
def earlier(digits_checkpoint, tmp_path) -> tuple[list[str], Path]:
    """An export of the EMA weights, and the command line that exports the raw ones over it."""
    out = tmp_path / "export"
    base = ["--ckpt", str(digits_checkpoint), "--format", "safetensors", "--out", str(out)]
    export.main(base)
    return [*base, "--weights", "raw", "--overwrite"], out


def test_an_export_whose_weights_cannot_be_replaced_is_left_whole(earlier, tmp_path, capsys):
    argv, out = earlier
    before = files(out)
    weights = out / "model.safetensors"
    with immutable(weights):
        line = refused(capsys, argv)
    assert files(out) == before
    # The folder takes new files: the file is said (T9: "make that folder writable" pointed at the wrong thing).
    assert line == f"error: {replacing(out / 'model.safetensors', 'it is immutable')}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no staging folder left
    load_checkpoint(out)  # its checksum holds: the earlier export loads


def replacing(path: Path, reason: str) -> str:
    refusal = CannotReplace(path, reason)
    return f"{refusal.problem} — {refusal.fix}"


@pytest.mark.parametrize("folder_takes_files", [True, False])
def test_a_file_that_refuses_to_be_opened_is_said_as_the_file_where_its_folder_takes_files(
    earlier, tmp_path, capsys, monkeypatch, folder_takes_files
):
    """Where the attributes cannot be read (another OS, a file system without them), the probe's refusal says the
    file when its folder takes new files, and the folder when it does not; nothing moves either way."""
    argv, out = earlier
    before = files(out)
    real_open, real_access = open, os.access

    def refusing(path, mode="r", *args, **kwargs):
        if Path(path) == out / "config.json" and mode == "r+b":
            raise PermissionError(1, "Operation not permitted", str(path))
        return real_open(path, mode, *args, **kwargs)

    # Where the probe opens it: check_can_replace, in diffusion.errors.writes (atomic_writes' before)
    for module in (atomic_writes, writes):
        monkeypatch.setattr(module, "open", refusing, raising=False)
    monkeypatch.setattr(os, "access", lambda path, mode: folder_takes_files and real_access(path, mode))
    line = refused(capsys, argv)
    if folder_takes_files:
        assert line == f"error: {replacing(out / 'config.json', 'Operation not permitted')}"
    else:
        assert (
            line == f"error: cannot write config.json into {out} (Operation not permitted) — {MAKE_WRITABLE}"
        )
    assert files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_move_refused_half_way_puts_the_earlier_export_back(earlier, tmp_path, capsys, monkeypatch):
    """The probe passes, then the move of model.safetensors (after config.json's) is refused."""
    argv, out = earlier
    before = files(out)
    real_rename = os.rename

    def refusing(source, target):
        if Path(target) == out / "model.safetensors" and Path(source).parent.name.endswith(".tmp"):  # new one
            raise PermissionError(1, "Operation not permitted", str(target))
        return real_rename(source, target)

    for name in ("rename", "replace"):  # either way of moving a file
        monkeypatch.setattr(os, name, refusing)
    line = refused(capsys, argv)
    assert line == f"error: cannot write the export into {out} (Operation not permitted) — {MAKE_WRITABLE}"
    assert files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    load_checkpoint(out)


def test_overwrite_into_a_folder_without_the_files_leaves_no_folder_it_made_when_refused(
    digits_checkpoint, tmp_path, capsys, monkeypatch
):
    """A diffusers-style subfolder made by the moves goes with them; here the first move of a new export fails."""
    out = tmp_path / "export"
    real_rename = os.rename

    def refusing(source, target):
        if Path(target).parent == out:
            raise PermissionError(1, "Operation not permitted", str(target))
        return real_rename(source, target)

    for name in ("rename", "replace"):
        monkeypatch.setattr(os, name, refusing)
    argv = ["--ckpt", str(digits_checkpoint), "--format", "safetensors", "--out", str(out)]
    assert "cannot write the export into" in refused(capsys, argv)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_export_over_one_of_the_other_format_replaces_it_whole(earlier, tmp_path):
    """A diffusers pipeline left beside a new safetensors export was what the folder loaded as (the old weights)."""
    argv, out = earlier
    (out / "model_index.json").write_text("{}")
    for folder in ("unet", "scheduler"):
        (out / folder).mkdir()
        (out / folder / "config.json").write_text("{}")
    export.main(argv)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # nothing set aside is left
    load_checkpoint(out)


def test_an_out_before_a_config_file_that_names_another_is_refused_and_neither_is_touched(
    earlier, tmp_path, capsys
):
    """Round 7's M1: `--out new --config f.yaml` with `out: old` in f.yaml wrote over old (the last value wins)."""
    argv, out = earlier
    before = files(out)
    config = tmp_path / "f.yaml"
    config.write_text(f"out: {out}\n")
    new = tmp_path / "new"
    line = refused(
        capsys, [*argv[:4], "--weights", "raw", "--out", str(new), "--config", str(config), "--overwrite"]
    )
    assert line.startswith(f"error: --out {new} is replaced by {config}: out {out}, which comes after it"), (
        line
    )
    assert files(out) == before and not new.exists()


@pytest.fixture
def mounted(tmp_path, monkeypatch):
    """`tmp_path/export` as a mount point: its own filesystem (os.stat's st_dev), and a rename across it and its
    parent fails with EXDEV ("Invalid cross-device link"), as the kernel refuses one."""
    out = tmp_path / "export"
    real_stat, real_rename = os.stat, os.rename

    def on_mount(path) -> bool:
        path = Path(os.path.abspath(path))
        return path == out or out in path.parents

    def stat(path, *args, **kwargs):
        result = real_stat(path, *args, **kwargs)
        if isinstance(path, int) or not on_mount(path):
            return result
        fields = list(result)
        fields[2] += 1  # st_dev
        return os.stat_result(fields)

    def rename(source, target, *args, **kwargs):
        if on_mount(source) != on_mount(target):
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(source), None, str(target))
        return real_rename(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    for name in ("rename", "replace"):
        monkeypatch.setattr(os, name, rename)
    out.mkdir()
    return out


def test_an_export_into_a_mount_point_is_staged_where_it_can_move_in(digits_checkpoint, mounted, tmp_path):
    """Staged next to --out, the files could not be renamed into it (EXDEV); an --overwrite's set-aside neither."""
    argv = ["--ckpt", str(digits_checkpoint), "--format", "safetensors", "--out", str(mounted)]
    export.main(argv)
    export.main([*argv, "--weights", "raw", "--overwrite"])
    assert sorted(p.name for p in mounted.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # nothing staged or set aside is left
    assert load_checkpoint(mounted, weights="raw") is not None


def test_an_export_into_a_mount_point_refused_half_way_puts_the_earlier_one_back(
    digits_checkpoint, mounted, tmp_path, capsys, monkeypatch
):
    argv = ["--ckpt", str(digits_checkpoint), "--format", "safetensors", "--out", str(mounted)]
    export.main(argv)
    before = files(mounted)
    moving = os.rename

    def refusing(source, target):
        if Path(target) == mounted / "model.safetensors" and Path(source).parent.name.endswith(".tmp"):
            raise PermissionError(1, "Operation not permitted", str(target))
        return moving(source, target)

    for name in ("rename", "replace"):
        monkeypatch.setattr(os, name, refusing)
    line = refused(capsys, [*argv, "--weights", "raw", "--overwrite"])
    assert (
        line == f"error: cannot write the export into {mounted} (Operation not permitted) — {MAKE_WRITABLE}"
    )
    assert files(mounted) == before  # all or nothing
    assert sorted(p.name for p in mounted.iterdir()) == ["config.json", "model.safetensors"]  # nothing staged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    load_checkpoint(mounted)
