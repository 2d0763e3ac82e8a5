"""`python -m diffusion.prepare --overwrite` onto a finished prepared set: the new set is written beside the old one
(OUT/prepare.partial/, on the same disk) and replaces it only once finished, so a prepare that fails on the way
(a full disk, a corrupt image, a rename refused) leaves the old set as it was and says so; one that finishes leaves
no trace of the old set or of its own staging."""

import re
from pathlib import Path

import pytest
from helpers.full_disk import on_a_small_disk
from helpers.user_errors import error_line

from diffusion.cli.prepare import main as prepare
from diffusion.data import preparing
from diffusion.data.prepared import open_prepared
from diffusion.data.preparing import KEPT_ON_ANOTHER_DISK
from diffusion.data.staging import KEPT_WHERE_REFUSED
from diffusion.errors import said

TOY2D = [
    "--data.class_path", "diffusion.data.VectorDataModule", "--data.init_args.dataset", "moons",
    "--data.init_args.val_fraction", "0.05",
]  # fmt: skip


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def prepare_line(out: Path, samples: int, *flags: str) -> str:
    args = [*TOY2D, "--data.init_args.num_samples", str(samples), "--out", str(out), "--num_workers", "1"]
    return " ".join([*args, *flags])


@pytest.mark.multiprocess
def test_an_overwrite_that_fills_the_disk_keeps_the_old_set_and_says_so(tmp_path):
    """A 200 kB tmpfs holds a set of 1,000 2-D vectors but not one of 40,000 (320 kB): the old set was removed
    before the new one was written, and the line said "nothing else touched"."""
    disk = tmp_path / "disk"
    command = (
        f"{{python}} -m diffusion.prepare {prepare_line(disk / 'set', 1000)} && "
        f"cp -r {disk}/set {tmp_path}/before && "
        f"{{python}} -m diffusion.prepare {prepare_line(disk / 'set', 40000, '--overwrite')}; echo exit $?; "
        f"cp -r {disk}/set {tmp_path}/after"
    )
    result = on_a_small_disk(disk, "200k", command, tmp_path)
    assert result.stdout.split() == ["exit", "2"], result.stdout + result.stderr[-3000:]
    assert error_line(result.stderr) == (
        f"error: no space left on the disk of {disk}/set/train while saving the prepared set's chunks — "
        + said(KEPT_ON_ANOTHER_DISK)
    )
    assert files(tmp_path / "after") == files(tmp_path / "before")  # no staging folder left either
    assert open_prepared(str(tmp_path / "after")).counts == {"train": 950, "val": 50}


def test_an_overwrite_that_finishes_replaces_the_set_and_leaves_nothing_of_the_old_one(tmp_path, capsys):
    out = tmp_path / "set"
    prepare([*prepare_line(out, 100).split()])
    prepare([*prepare_line(out, 200, "--overwrite").split()])
    assert open_prepared(str(out)).counts == {"train": 190, "val": 10}
    assert sorted(p.name for p in out.iterdir()) == ["prepared.json", "train", "val"]
    assert not re.search(r"prepare\.(partial|replaced)", " ".join(files(out)))


def test_a_rename_refused_while_replacing_puts_the_old_set_back_and_says_so(tmp_path, capsys, monkeypatch):
    """The swap's renames: the second move of the new set refused (an immutable file or folder would refuse it)."""
    out = tmp_path / "set"
    prepare([*prepare_line(out, 100).split()])
    before = files(out)
    renames, real_rename = [], Path.rename

    def refusing(self, target):
        renames.append(self)
        if self.parent.name == "prepare.partial" and self.name == "val":
            raise PermissionError(1, "Operation not permitted", str(self))
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", refusing)
    with pytest.raises(SystemExit) as exited:
        prepare([*prepare_line(out, 200, "--overwrite").split()])
    assert exited.value.code == 2
    assert error_line(capsys.readouterr().err) == (
        f"error: cannot write the prepared set into {out} (Operation not permitted) — {said(KEPT_WHERE_REFUSED)}"
    )
    assert files(out) == before and sorted(p.name for p in out.iterdir()) == ["prepared.json", "train", "val"]
    assert any(p.parent.name == "prepare.partial" for p in renames)  # the refusal came from the swap


def test_what_a_stopped_overwrite_left_beside_the_set_is_a_prepares_and_goes_with_the_next(tmp_path):
    """OUT/prepare.partial/ (and prepare.replaced/) of a prepare killed on the way: not the user's files, so not
    a reason to refuse the folder, and cleared by the next --overwrite."""
    out = tmp_path / "set"
    prepare([*prepare_line(out, 100).split()])
    for folder in ("prepare.partial", "prepare.replaced"):
        (out / folder / "train").mkdir(parents=True)
        (out / folder / "train" / "chunk-0-0.bin").write_bytes(b"stopped")
    assert preparing.not_prepared(str(out)) == []
    prepare([*prepare_line(out, 200, "--overwrite").split()])
    assert sorted(p.name for p in out.iterdir()) == ["prepared.json", "train", "val"]


@pytest.mark.multiprocess
def test_an_out_under_home_is_prepared_there(tmp_path, monkeypatch):
    """`out: ~/set` in a config file (J8's kind): prepared into the home folder, not a folder named ~."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    prepare(prepare_line(Path("~/set"), 100).split())
    assert open_prepared(str(tmp_path / "home" / "set")).counts["train"] > 0 and not (tmp_path / "~").exists()
