"""A run's folders are the run's: export's --out refuses a run's post-hoc EMA snapshots and sample grids as it
refuses its checkpoints (with and without --overwrite: it mixed an export among the snapshots, and "not empty —
pass --overwrite to replace an export there" was said where no export was); a folder holding no export is said
so; phema's --out refuses a file among the snapshots; phema's --run of a folder of runs (runs/<name>) or of one
of a run's folders names the run folder to pass (round 14's P2, P5)."""

import re
import shutil
from pathlib import Path

import pytest
from helpers.user_errors import run_in_process

from diffusion.cli import export, phema
from diffusion.training.run_folders import part_of_a_run, runs_in

SNAPSHOTS = ("step=000000002-sigma_rel=0.05.pt", "step=000000004-sigma_rel=0.1.pt")


def snapshots_in(folder: Path) -> None:
    """Files named as a run's snapshots (what the checks look at: their names; nothing reads them)."""
    folder.mkdir(parents=True)
    for name in SNAPSHOTS:
        (folder / name).write_bytes(b"a snapshot")


@pytest.fixture
def home(tmp_path, user) -> Path:
    """A copy of the user's digits run with post-hoc EMA snapshots beside its checkpoints and sample grids, a
    second run (version_2) with snapshots, and a folder of the user's files."""
    shutil.copytree(user / "runs" / "digits" / "version_0", tmp_path / "runs" / "digits" / "version_0")
    run = tmp_path / "runs" / "digits" / "version_0"
    snapshots_in(run / "post_hoc_ema")
    (run / "samples").mkdir(exist_ok=True)
    (run / "samples" / "latest.png").write_bytes(b"a grid")
    snapshots_in(tmp_path / "runs" / "digits" / "version_2" / "post_hoc_ema")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    return tmp_path


RUN = "{home}/runs/digits/version_0"
EXPORT_CASES = {
    "out_a_snapshots_folder": (
        [f"{RUN}/post_hoc_ema"],
        r"^error: --out \S*version_0/post_hoc_ema holds a run's post-hoc EMA snapshots, and an export is a folder of "
        r"its own — pass a new folder, e.g. --out \S*version_0/post_hoc_ema_export$",
    ),
    "out_a_sample_grids_folder": (
        [f"{RUN}/samples"],
        r"^error: --out \S*version_0/samples holds a run's sample grids, and an export is a folder of its own",
    ),
    "out_a_run_with_snapshots_only": (
        ["{home}/runs/digits/version_2"],
        r"^error: --out \S*version_2 holds a run \(its post_hoc_ema folder\), and an export is a folder of its own",
    ),
}  # fmt: skip


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["", "overwrite"])
@pytest.mark.parametrize(("out", "expected"), EXPORT_CASES.values(), ids=EXPORT_CASES.keys())
def test_export_refuses_a_runs_folder_as_out(out, expected, overwrite, home, capsys):
    ckpt = home / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    args = ["--ckpt", str(ckpt), "--format", "safetensors", "--out", out[0].format(home=home), *overwrite]
    assert re.search(expected, run_in_process(export.main, args, home, capsys))


def test_export_says_a_folder_of_no_export_holds_none(home, capsys):
    """The line said "pass --overwrite to replace an export there" of the user's own files."""
    ckpt = home / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    args = ["--ckpt", str(ckpt), "--format", "safetensors", "--out", str(home / "mine")]
    assert re.search(
        r"^error: --out \S*mine is not empty, and holds no export \(notes.txt\) — pass a new --out \(--overwrite "
        r"writes the export among those files\)$",
        run_in_process(export.main, args, home, capsys),
    )


PHEMA_CASES = {
    "out_among_the_snapshots": (
        ["--run", RUN, "--sigma_rel", "0.1", "--out", f"{RUN}/post_hoc_ema/phema.ckpt", "--overwrite"],
        r"^error: --out \S*/post_hoc_ema/phema.ckpt is in a run's post-hoc EMA folder, among its snapshots, where a "
        r"checkpoint is taken for one \(python -m diffusion.export refuses it\) — write it beside the run's folders, "
        r"e.g. --out \S*version_0/phema.ckpt$",
    ),
    "run_a_folder_of_runs": (
        ["--run", "{home}/runs/digits", "--sigma_rel", "0.1", "--out", "{home}/p.ckpt"],
        r"^error: --run \S*runs/digits is a folder of runs, and its runs version_0, version_2 hold post-hoc EMA "
        r"snapshots — pass one of them, e.g. --run \S*runs/digits/version_2 \(the newest\)$",
    ),
    "run_its_snapshots_folder": (
        ["--run", f"{RUN}/post_hoc_ema", "--sigma_rel", "0.1", "--out", "{home}/p.ckpt"],
        r"^error: --run \S*version_0/post_hoc_ema is the folder of a run's post-hoc EMA snapshots, not the run's "
        r"folder — pass --run \S*runs/digits/version_0$",
    ),
    "run_its_checkpoints_folder": (
        ["--run", f"{RUN}/checkpoints", "--sigma_rel", "0.1", "--out", "{home}/p.ckpt"],
        r"^error: --run \S*version_0/checkpoints is the folder of a run's checkpoints, not the run's folder — pass "
        r"--run \S*runs/digits/version_0$",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("flags", "expected"), PHEMA_CASES.values(), ids=PHEMA_CASES.keys())
def test_phema_names_the_run_folder(flags, expected, home, capsys):
    args = [flag.format(home=home) for flag in flags]
    assert re.search(expected, run_in_process(phema.main, args, home, capsys))


def test_what_a_folder_is_of_a_run(home):
    runs = home / "runs" / "digits"
    assert part_of_a_run(runs / "version_0" / "checkpoints") == "a run's checkpoints"
    assert part_of_a_run(runs / "version_0") == "a run (its checkpoints folder)"
    assert part_of_a_run(runs) is None and part_of_a_run(home / "mine") is None
    (home / "samples").mkdir()  # a user's samples folder (sample's default --out) is no run's
    assert part_of_a_run(home / "samples") is None
    assert runs_in(runs) == [runs / "version_0", runs / "version_2"]
