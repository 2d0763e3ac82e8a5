"""`python -m diffusion.prepare`'s user errors: a data module's check names the option as the user gave it (a flag,
or a config file's key), `--print_config` prints only a prepare that would run, and a disk that fills while
litdata writes the chunks is one line naming the folder, whatever the number of writing processes, with nothing
left behind (the prepare's other refusals: test_prepared_sets.py)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.user_errors import error_line, in_a_config_file

from diffusion.cli.prepare import main as prepare
from diffusion.data.preparing import PREPARE_ON_ANOTHER_DISK
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
        (["--out", "{tmp}/taken", "--num_workers", "1"], "--out {tmp}/taken already holds data"),
    ],
    ids=["missing_images", "out_of_range", "out_holds_data"],
)  # fmt: skip
def test_print_config_refuses_what_prepare_refuses(flags, expected, tmp_path, capsys):
    """Printed once the data is read and --out checked: no config of a prepare that would stop (it printed, exit 0)."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("the user's")
    flags = [flag.format(tmp=tmp_path) for flag in flags]
    out = [] if "--out" in flags else ["--out", str(tmp_path / "set")]
    line = refused(capsys, [*flags, *out, "--print_config"])
    assert line.startswith(f"error: {expected.format(tmp=tmp_path)}"), line
    assert not (tmp_path / "set").exists()
    assert (tmp_path / "taken" / "mine.txt").read_text() == "the user's"


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers", [1, 2])
def test_on_a_real_full_disk_the_prepare_is_one_line_naming_the_folder_and_leaves_nothing(workers, tmp_path):
    """A 64 KiB tmpfs (a mount namespace of its own: `unshare -rm`) cannot hold the digits' chunks. litdata passes
    a worker's OSError on as text (a bug line before); with one writing process it also never returned (the
    worker's exit waited for its remover process)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces here: {probe.stderr.decode().strip()}")
    disk = tmp_path / "disk"
    disk.mkdir()
    prepare_command = f"{sys.executable} -m diffusion.prepare --out {disk}/set --num_workers {workers}"
    command = f"mount -t tmpfs -o size=64k tmpfs {disk} && {prepare_command}; echo exit $?; ls -A {disk}"
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", command], capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert error_line(result.stderr) == (
        f"error: no space left on the disk of {disk}/set/train while saving the prepared set's chunks — "
        + said(PREPARE_ON_ANOTHER_DISK)
    )
    assert result.stdout.split() == ["exit", "2"], result.stdout  # and the disk is empty: nothing left behind
