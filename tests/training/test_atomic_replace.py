"""A file a save would replace that refuses to go (immutable, `chattr +i`; another user's in a sticky folder), in a
folder that takes new files: the line names the file and how to check it, not "make that folder writable" (the
new version was just written beside it); the file is as it was and no temporary file stays. A folder that refuses
is still said as the folder."""

import errno
import os
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import QUICK, tiny_run
from helpers.full_disk import immutable

from diffusion.errors import MAKE_WRITABLE, CannotWrite
from diffusion.training import atomic_writes
from diffusion.training.atomic_writes import (
    CannotReplace,
    FlaggedFolder,
    check_can_replace,
    check_replaceable,
    link_atomically,
    naming_a_refusing_folder,
    save_atomically,
    write_atomically,
)


def saved(folder: Path) -> tuple[Path, bytes]:
    path = folder / "last.ckpt"
    save_atomically({"step": 1, "weights": torch.arange(4.0)}, path)
    return path, path.read_bytes()


def refusing_replace(monkeypatch) -> None:
    def replace(source, target):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(atomic_writes.os, "replace", replace)


def replaced_by_each_writer(path: Path) -> list:
    return [
        lambda: save_atomically({"step": 2}, path),
        lambda: write_atomically(path, lambda into: into.write_bytes(b"new")),
        lambda: link_atomically(path.with_name("step=2.ckpt"), path),
    ]


def test_a_file_that_refuses_to_be_replaced_is_named_not_its_folder(tmp_path, monkeypatch):
    path, before = saved(tmp_path)
    (tmp_path / "step=2.ckpt").write_bytes(b"x")
    refusing_replace(monkeypatch)
    for write in replaced_by_each_writer(path):
        with pytest.raises(CannotReplace) as raised:
            write()
        assert str(raised.value) == (
            f"cannot replace last.ckpt in {tmp_path} (Operation not permitted): the folder takes new files, but "
            f"last.ckpt itself refuses to be replaced — check its attributes (lsattr {path}; chattr -i clears an "
            "immutable flag) and its owner, or move it away; it is as it was, and the files written there before "
            "are intact"
        )
        assert isinstance(raised.value, CannotWrite) and isinstance(raised.value, OSError)
        assert path.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step=2.ckpt"]


def test_a_folder_that_refuses_the_rename_is_still_said_as_the_folder(tmp_path, monkeypatch):
    path, before = saved(tmp_path)
    refusing_replace(monkeypatch)
    monkeypatch.setattr(atomic_writes.os, "access", lambda *args, **kwargs: False)
    with pytest.raises(CannotWrite) as raised:
        save_atomically({"step": 2}, path)
    assert not isinstance(raised.value, CannotReplace)
    assert str(raised.value) == (
        f"cannot write last.ckpt into {tmp_path} (Operation not permitted) — {MAKE_WRITABLE}"
    )
    assert path.read_bytes() == before


def test_a_real_immutable_file_is_named(tmp_path):
    path, before = saved(tmp_path)
    with immutable(path):
        with pytest.raises(
            CannotReplace, match=r"^cannot replace last\.ckpt in .* itself refuses to be replaced"
        ):
            save_atomically({"step": 2}, path)
        assert os.access(tmp_path, os.W_OK) and path.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_resume_whose_last_ckpt_is_immutable_is_refused_before_training(tmp_path, capsys):
    """The run trained to its end and then failed to save last.ckpt, blaming the writable folder: now refused at
    the start, naming the file."""
    tiny_run(tmp_path / "runs", *QUICK)
    last = tmp_path / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    check_replaceable(last)  # a plain file passes
    with immutable(last):
        with pytest.raises(SystemExit) as exited:
            tiny_run(tmp_path / "runs", *QUICK, "--ckpt_path", "last", "--max_steps", "6")
        assert exited.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"error: cannot replace last.ckpt in {last.parent} (it is immutable): the folder takes new files, but "
            f"last.ckpt itself refuses to be replaced — check its attributes (lsattr {last}; chattr -i clears an "
            "immutable flag) and its owner, or move it away; it is as it was, and the files written there before "
            "are intact"
        )
        assert sorted(p.name for p in last.parent.iterdir()) == [
            "last.ckpt",
            "step=4.ckpt",
        ]  # nothing trained


def test_a_flagged_folder_is_said_by_its_flag_and_another_by_its_mode(tmp_path, monkeypatch):
    """Round 11's V6: an immutable folder (`chattr +i`), whose mode bits let this user write, was said as "make that
    folder writable for this user"; it is said by its flag. A folder refusing for its mode bits still says that."""
    folder = tmp_path / "post_hoc_ema"
    folder.mkdir()
    with (
        immutable(folder),
        pytest.raises(FlaggedFolder) as raised,
        naming_a_refusing_folder(folder, "the resumed run's files"),
        tempfile.TemporaryFile(dir=folder),
    ):
        pass
    assert str(raised.value) == (
        f"cannot write the resumed run's files into {folder} (it is immutable) — check its attributes (lsattr -d "
        f"{folder}; chattr -i clears an immutable flag), or write to another folder; the files written there before "
        "are intact"
    )
    assert isinstance(raised.value, CannotWrite) and isinstance(raised.value, OSError)

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    with (
        pytest.raises(CannotWrite) as raised,
        naming_a_refusing_folder(folder, "the resumed run's files"),
        tempfile.TemporaryFile(dir=folder),
    ):
        pass
    assert str(raised.value) == (
        f"cannot write the resumed run's files into {folder} (Permission denied) — {MAKE_WRITABLE}"
    )


def test_a_file_a_command_replaces_is_said_as_the_file_when_immutable(tmp_path):
    """`check_can_replace` (sample --overwrite's): an immutable file in a folder that takes files is the file's
    refusal; a missing or plain file passes."""
    path = tmp_path / "grid.png"
    check_can_replace(path)
    path.write_bytes(b"png")
    check_can_replace(path)
    with (
        immutable(path),
        pytest.raises(CannotReplace, match=r"^cannot replace grid\.png in .* \(it is immutable\)"),
    ):
        check_can_replace(path)


@pytest.mark.parametrize("writer", ["save_atomically", "link_atomically", "write_atomically"])
def test_a_checkpoint_or_its_link_into_an_immutable_folder_is_said_by_its_flag(writer, tmp_path):
    """Round 18b's M10: a checkpoint save (or the last.ckpt link) into a folder flagged immutable said `(Operation not
    permitted) — make that folder writable for this user`; said by its flag, the file saved before as it was."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    step = folder / "step=2.ckpt"
    save_atomically({"step": 2}, step)
    before = step.read_bytes()
    write = {
        "save_atomically": lambda: save_atomically({"step": 4}, folder / "last.ckpt"),
        "link_atomically": lambda: link_atomically(step, folder / "last.ckpt"),
        # a run's previews (loss.png, the sample grids), as written under the run folder
        "write_atomically": lambda: write_atomically(
            folder / "last.ckpt", lambda into: into.write_bytes(b"png")
        ),
    }[writer]
    with immutable(folder), pytest.raises(FlaggedFolder) as refused:
        write()
    assert str(refused.value) == (
        f"cannot write last.ckpt into {folder} (it is immutable) — check its attributes (lsattr -d {folder}; chattr "
        "-i clears an immutable flag), or write to another folder; the files written there before are intact"
    )
    assert [p.name for p in folder.iterdir()] == ["step=2.ckpt"] and step.read_bytes() == before
