"""`python -m diffusion.prepare`'s user errors: a data module's check names the option as the user gave it (a flag,
or a config file's key), `--print_config` prints only a prepare that would run, an --out that is, holds or lies
inside the data, or holds files of the user's, is refused whatever the flags (nothing of theirs is ever removed),
and a disk that fills while litdata writes the chunks is one line naming the folder, whatever the number of writing
processes, with nothing left behind (the prepare's other refusals: test_prepared_sets.py)."""

from pathlib import Path

import numpy as np
import pytest
from helpers.full_disk import on_a_small_disk
from helpers.user_errors import error_line, in_a_config_file
from PIL import Image

from diffusion.cli.prepare import main as prepare
from diffusion.data import VectorDataModule
from diffusion.data.prepared import not_prepared
from diffusion.data.preparing import PREPARE_ON_ANOTHER_DISK
from diffusion.data.preparing import prepare as prepare_in_python
from diffusion.data.staging import clear
from diffusion.errors import said

REPO = Path(__file__).resolve().parents[2]


def refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        prepare(argv)
    assert exit_info.value.code == 2
    return error_line(capsys.readouterr().err)


def test_a_data_modules_range_check_names_the_flag_or_the_files_key(tmp_path, capsys):
    out = str(tmp_path / "set")
    assert refused(capsys, ["--data.image_size", "6", "--out", out]) == (
        "error: --data.image_size 6 is out of range (must be >= 8) — pass --data.image_size 8 or more"
    )
    config = tmp_path / "prepare.yaml"
    config.write_text(
        "data:\n  class_path: diffusion.data.ImageDataModule\n  init_args:\n    image_size: 6\n"
    )
    assert refused(capsys, ["--config", str(config), "--out", out]) == (
        f"error: {config}: data.image_size 6 is out of range (must be >= 8) — pass --data.image_size 8 or more"
    )
    assert not Path(out).exists()


def test_a_vector_data_modules_check_names_the_flag(tmp_path, capsys):
    """The union of --data's two classes reported a check of the second one as a bug (its traceback, exit 1)."""
    vectors = ["--data.class_path", "diffusion.data.VectorDataModule", "--out", str(tmp_path / "set")]
    assert refused(
        capsys, [*vectors, "--data.init_args.dataset", "gaussian", "--data.init_args.dim", "0"]
    ) == ("error: --data.dim 0 is out of range (must be a whole number >= 1) — pass a whole number >= 1")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(10, 2)))
    np.save(tmp_path / "y.npy", np.full(10, 2**40))
    files = [
        "--data.init_args.path",
        str(tmp_path / "x.npy"),
        "--data.init_args.labels",
        str(tmp_path / "y.npy"),
    ]
    assert refused(capsys, [*vectors, *files]).startswith(
        f"error: --data.labels {tmp_path / 'y.npy'} holds the label 1099511627776: classes are numbered 0..K-1"
    )


def test_a_check_after_the_parse_names_the_config_files_key(tmp_path, capsys):
    (tmp_path / "a_file").write_text("the user's")
    config = in_a_config_file(["--out", str(tmp_path / "a_file" / "set")], tmp_path)
    assert refused(capsys, config).startswith(f"error: {tmp_path / 'run.yaml'}: out {tmp_path / 'a_file'}")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--data.dataset", "folder", "--data.root", "{tmp}/nope", "--data.image_size", "8"],
         "image folder {tmp}/nope does not exist"),
        (["--data.image_size", "6"], "--data.image_size 6 is out of range"),
        (["--out", "{tmp}/unfinished", "--num_workers", "1"],
         "--out {tmp}/unfinished already holds data (an unfinished prepare, 1 files)"),
        (["--out", "{tmp}/taken", "--overwrite"], "--out {tmp}/taken holds files that are not a prepared set"),
    ],
    ids=["missing_images", "out_of_range", "out_holds_data", "out_holds_other_files"],
)  # fmt: skip
def test_print_config_refuses_what_prepare_refuses(flags, expected, tmp_path, capsys):
    """Printed once the data is read and --out checked: no config of a prepare that would stop (it printed, exit 0)."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("the user's")
    (tmp_path / "unfinished" / "train").mkdir(parents=True)
    (tmp_path / "unfinished" / "train" / "chunk-0-0.bin").write_bytes(b"a chunk")
    flags = [flag.format(tmp=tmp_path) for flag in flags]
    out = [] if "--out" in flags else ["--out", str(tmp_path / "set")]
    line = refused(capsys, [*flags, *out, "--print_config"])
    assert line.startswith(f"error: {expected.format(tmp=tmp_path)}"), line
    assert not (tmp_path / "set").exists()
    assert (tmp_path / "taken" / "mine.txt").read_text() == "the user's"


FOLDER = ["--data.dataset", "folder", "--data.image_size", "8", "--num_workers", "1"]
APART = "choose an --out that neither is, holds nor lies inside the data"


def image_folder(folder: Path, broken: bool = False) -> Path:
    folder.mkdir(parents=True)
    for i in range(4):
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(folder / f"{i}.png")
    if broken:
        (folder / "broken.png").write_bytes(b"not an image")
    return folder


def contents(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize(
    ("out", "relation"), [("myimgs", "is"), ("myimgs/set", "lies inside"), (".", "holds")]
)
def test_an_out_that_is_holds_or_lies_inside_the_data_is_refused_whatever_the_flags(
    out, relation, tmp_path, capsys, monkeypatch
):
    """--overwrite of the image folder itself deleted the user's images (then failed reading them)."""
    monkeypatch.chdir(tmp_path)
    images = contents(image_folder(tmp_path / "myimgs"))
    for overwrite in ([], ["--overwrite"]):
        assert refused(capsys, [*FOLDER, "--data.root", "myimgs", "--out", out, *overwrite]) == (
            f"error: --out {out} {relation} the data it would prepare (--data.root myimgs) — {APART}, e.g. "
            "--out myimgs_prepared"
        )
    assert contents(tmp_path / "myimgs") == images and not (tmp_path / "myimgs" / "set").exists()


def test_an_out_that_holds_a_vector_file_is_refused_in_python_too(tmp_path):
    np.save(tmp_path / "points.npy", np.random.default_rng(0).normal(size=(20, 2)))
    data = VectorDataModule(path=str(tmp_path / "points.npy"))
    with pytest.raises(ValueError, match=f"--out {tmp_path} holds the data it would prepare \\(path "):
        prepare_in_python(data, str(tmp_path), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["points.npy"]


def test_an_out_of_other_files_is_refused_even_with_overwrite_naming_a_few(tmp_path, capsys):
    """Called "an unfinished prepare" before, and --overwrite replaced it whole (a.txt, photos/cat.jpg lost)."""
    mine = tmp_path / "mine"
    (mine / "photos").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "c.txt", "d.txt", "photos/cat.jpg"):
        (mine / name).write_text(name)
    before = contents(mine)
    for overwrite in ([], ["--overwrite"]):
        assert refused(capsys, ["--out", str(mine), "--num_workers", "1", *overwrite]) == (
            f"error: --out {mine} holds files that are not a prepared set (a.txt, b.txt, c.txt, d.txt, ...) — "
            "choose another --out, or empty it yourself"
        )
    assert contents(mine) == before
    (mine / "train").mkdir()  # beside a prepare's own files too
    (mine / "train" / "chunk-0-0.bin").write_bytes(b"a chunk")
    (mine / "train" / "notes.txt").write_text("the user's")
    for name in ("a.txt", "b.txt", "c.txt", "d.txt", "photos/cat.jpg"):
        (mine / name).unlink()
    line = refused(capsys, ["--out", str(mine), "--num_workers", "1", "--overwrite"])
    assert line.startswith(
        f"error: --out {mine} holds files that are not a prepared set (photos/, train/notes.txt)"
    )
    clear(str(mine))  # what a prepare replaces: its own files alone
    assert contents(mine) == {"train/notes.txt": b"the user's"} and (mine / "photos").is_dir()


def test_in_object_storage_the_files_no_prepare_writes_are_named_from_the_listing():
    listed = {"prepared.json": 1, "train/chunk-0-0.bin": 2, "val/index.json": 3, "train/1.index.json": 4}
    assert not_prepared("s3://bucket/set", listed) == []
    mine = {"a.txt": 1, "photos/cat.jpg": 2, "photos/dog.jpg": 3, "train/notes/x.txt": 4, "val/a.bin": 5}
    assert not_prepared("s3://bucket/set", {**listed, **mine}) == [
        "a.txt",
        "photos/",
        "train/notes/",
        "val/a.bin",
    ]


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_an_empty_out_is_refused(overwrite, tmp_path, capsys, monkeypatch):
    """`--out ""` was the current folder: "an unfinished prepare", and with --overwrite a bug's traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("the user's")
    assert refused(capsys, ["--out", "", *overwrite]) == (
        "error: --out '' names no folder — pass the folder (or s3://, gs://, az:// URL) to write the prepared set into"
    )
    assert contents(tmp_path) == {"mine.txt": b"the user's"}


def test_a_failed_prepare_removes_what_it_wrote_and_the_folders_it_made_only(tmp_path, capsys):
    """An --out that was there before stays (it was removed whole), and a new one goes with the folders made above."""
    folder = image_folder(tmp_path / "images", broken=True)
    there = tmp_path / "there"
    there.mkdir()
    for out in (there, tmp_path / "new" / "set"):
        assert "broken.png" in refused(capsys, [*FOLDER, "--data.root", str(folder), "--out", str(out)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "there"] and not any(there.iterdir())


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers", [1, 2])
def test_on_a_real_full_disk_the_prepare_is_one_line_naming_the_folder_and_leaves_nothing(workers, tmp_path):
    """A 64 KiB tmpfs (a mount namespace of its own: `unshare -rm`) cannot hold the digits' chunks. litdata passes
    a worker's OSError on as text (a bug line before); with one writing process it also never returned (the
    worker's exit waited for its remover process)."""
    disk = tmp_path / "disk"
    prepare_command = f"{{python}} -m diffusion.prepare --out {disk}/set --num_workers {workers}"
    result = on_a_small_disk(disk, "64k", f"{prepare_command}; echo exit $?; ls -A {disk}", tmp_path)
    assert error_line(result.stderr) == (
        f"error: no space left on the disk of {disk}/set/train while saving the prepared set's chunks — "
        + said(PREPARE_ON_ANOTHER_DISK)
    )
    assert result.stdout.split() == ["exit", "2"], result.stdout  # and the disk is empty: nothing left behind
