"""One job at a time trains a run folder: a second one started on it (a resume started twice) is refused in one
line naming the folder and the job training it, before it does any work; once the first has ended, the folder is
free again (a resume trains on), and a job killed with SIGKILL leaves it free as well (the kernel drops the lock).
"""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import QUICK, TINY_UNET, VALIDATING_EVERY_2, tiny_run, warm

from diffusion.cli.train import main
from diffusion.errors import FREE_SPACE
from diffusion.training.run_folders import TRAINING_LOCK, RunFolderInUse, training_in

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def files_of(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def held_run(save_dir: Path, started: Path, release: Path) -> subprocess.Popen:
    """A tiny train.py run, held at step 2 (its checkpoint of step 2 saved) until `release` exists."""
    hold = {"class_path": "helpers.holding.WaitAt",
            "init_args": {"step": 2, "started": str(started), "release": str(release)}}  # fmt: skip
    environment = {
        k: v for k, v in os.environ.items() if k not in ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE")
    }
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), environment.get("PYTHONPATH")]))
    command = [sys.executable, str(REPO / "train.py"), *TINY_UNET, *QUICK, *VALIDATING_EVERY_2,
               "--trainer.logger.init_args.save_dir", str(save_dir), "--trainer.callbacks=" + json.dumps([hold])]  # fmt: skip
    return warm.popen(
        command, cwd=save_dir.parent, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"the held run never reached step 2:\n{process.communicate()[0][-4000:]}")
        time.sleep(0.1)


@pytest.mark.multiprocess
def test_a_second_job_on_a_run_being_trained_is_refused_and_a_resume_after_it_trains_on(tmp_path, capsys):
    runs, started, release = tmp_path / "runs", tmp_path / "started", tmp_path / "release"
    first = held_run(runs, started, release)
    try:
        wait_for(started, first)
        (run,) = (runs / "digits").iterdir()
        before = files_of(run)
        with pytest.raises(SystemExit) as exited:
            main([*TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", str(runs), "--ckpt_path", "last",
                  "--max_steps", "6"])  # fmt: skip
        error = capsys.readouterr().err
        assert files_of(run) == before  # it did nothing there
    finally:
        release.touch()
        output = first.communicate(timeout=120)[0]
    assert exited.value.code == 2, error[-3000:]
    # a resume's folder is its checkpoint's: the way round is a new run from its weights, not another version
    assert re.fullmatch(
        rf"error: {re.escape(str(run))} is being trained by another job \(pid {first.pid} on host "
        rf"{re.escape(socket.gethostname())}\) — wait for it to end, or start a new run from that checkpoint's "
        rf"weights: --model.init_from {re.escape(str(run))}/checkpoints/\S+\.ckpt in place of --ckpt_path",
        error.strip().splitlines()[-1],
    ), error[-3000:]
    assert first.returncode == 0, output[-4000:]
    assert not (run / TRAINING_LOCK).exists()
    resumed = tiny_run(runs, "--ckpt_path", "last", "--max_steps", "6")
    assert resumed.trainer.global_step == 6


def test_the_lock_is_the_kernels_and_goes_with_a_killed_process(tmp_path):
    """flock's lock belongs to the open file: a holder killed with SIGKILL leaves the folder free at once."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'123 elsewhere'); print('held', flush=True); time.sleep(60)",
         str(tmp_path / TRAINING_LOCK)], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunFolderInUse) as refused, training_in(tmp_path):
            pass
        assert (refused.value.folder, refused.value.pid, refused.value.host) == (tmp_path, "123", "elsewhere")
        assert str(refused.value).endswith(
            "— wait for it to end, or pass logger.init_args.version NEW for a new run"
        )
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with training_in(tmp_path):
        assert (tmp_path / TRAINING_LOCK).read_text() == f"{os.getpid()} {socket.gethostname()}\n"
    assert not (tmp_path / TRAINING_LOCK).exists()


def test_a_lock_file_removed_while_a_job_waited_on_it_is_not_trusted(tmp_path, monkeypatch):
    """A job that opened the lock file just before its holder removed it locks a file no one else will open: it
    must lock the one under the name instead."""
    import fcntl

    locked = []
    flock = fcntl.flock

    def flock_after_the_holder_left(descriptor: int, operation: int) -> None:
        if not locked:  # the holder removes its file between this job's open and its lock
            os.unlink(tmp_path / TRAINING_LOCK)
        locked.append(os.fstat(descriptor).st_ino)
        flock(descriptor, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_the_holder_left)
    with training_in(tmp_path):
        assert os.stat(tmp_path / TRAINING_LOCK).st_ino == locked[-1] and len(locked) == 2


def test_a_new_run_does_not_write_over_another_runs_checkpoints(tmp_path, capsys):
    """A run version named again, or --checkpoint.dirpath into another run, replaced that run's last.ckpt (an
    outside round lost a 400-step run so): refused, the run as it was; resuming it stays the way on. The refusal
    offers the fixes of what led there (it told a user who gave no version to leave the version out)."""
    tiny_run(tmp_path / "runs", *QUICK)
    checkpoints = tmp_path / "runs" / "digits" / "version_0" / "checkpoints"
    before = {path.name: path.read_bytes() for path in checkpoints.iterdir()}
    refused = (
        f"error: {checkpoints} holds another run's checkpoints (last.ckpt, step=4.ckpt), which this new run "
        "would write over"
    )
    resume = f"resume that run with --ckpt_path {checkpoints / 'last.ckpt'}"
    for again, said in (
        (["--trainer.logger.init_args.version", "0"],
         f" (--trainer.logger.init_args.version 0 names that run's folder) — {resume}, or leave out "
         "--trainer.logger.init_args.version for a new run folder"),
        (["--checkpoint.dirpath", str(checkpoints)],
         f" — {resume}, or pass a new, empty folder as --checkpoint.dirpath (or leave it out: the run folder's "
         "checkpoints/)"),
    ):  # fmt: skip
        save_dir = tmp_path / ("runs" if "version" in again[0] else "elsewhere")
        with pytest.raises(SystemExit) as exited:
            tiny_run(save_dir, *QUICK, *again)
        assert exited.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == refused + said
    assert {path.name: path.read_bytes() for path in checkpoints.iterdir()} == before


def test_a_run_without_a_logger_started_again_in_its_folder_is_told_where_it_writes(tmp_path, capsys):
    """--trainer.logger false writes straight into default_root_dir (the current folder): a second such run
    there is refused, naming that folder and fixes that work without a logger (no version_N, no `last`)."""
    folder = tmp_path / "here"
    flags = [*TINY_UNET, *QUICK, "--trainer.logger", "false", "--trainer.default_root_dir", str(folder)]
    main(flags)
    with pytest.raises(SystemExit) as exited:
        main(flags)
    assert exited.value.code == 2
    checkpoints = folder / "checkpoints"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {checkpoints} holds another run's checkpoints (last.ckpt, step=4.ckpt), which this new run would "
        "write over: without a logger (--trainer.logger false) a run writes its checkpoints/, config.yaml, "
        f"samples/ and loss.png straight into --trainer.default_root_dir, here {folder} — resume that run with "
        f"--ckpt_path {checkpoints / 'last.ckpt'} from the same folder (--ckpt_path last needs a logger: it finds "
        "runs by its name), or start the new one in a new, empty folder: cd into one, or pass "
        "--trainer.default_root_dir NEW"
    )
    assert {p.name for p in folder.iterdir()} >= {"checkpoints", "config.yaml", "samples", "loss.png"}


def test_a_lock_file_the_disk_has_no_room_for_is_said_as_a_full_disk(tmp_path):
    """Round 19b's Q5/Q6, on a real full disk (a tmpfs, helpers.full_disk.on_a_small_disk): the run folder's lock
    (train.py's first write) ended in "this is a bug" with an OSError traceback and left an empty version_0; a
    command's lock beside its --out was said with the folder and the file swapped ("the disk of DISK/the lock file
    .st.npz.lock of --save_stats DISK while saving st.npz")."""
    from helpers.full_disk import on_a_small_disk

    disk = tmp_path / "disk"
    train = "{python} " + shlex.join(
        [str(REPO / "train.py"), *TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", f"{disk}/runs"]
    )
    evaluate = (
        f"{{python}} -m diffusion.evaluate --reference digits --features pixels --save_stats {disk}/s/st.npz"
    )
    command = (
        f"mkdir {disk}/runs {disk}/s && dd if=/dev/zero of={disk}/filler bs=1k count=256 2>/dev/null; "
        f"{train}; echo exit $?; ls {disk}/runs; {evaluate}; echo exit $?"
    )
    ran = on_a_small_disk(disk, "64k", command, tmp_path)
    assert ran.stdout.splitlines() == ["exit 2", "exit 2"], (
        ran.stdout + ran.stderr[-3000:]
    )  # no version_0 listed
    lines = [line for line in ran.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [
        f"error: no space left on the disk of {disk}/runs/digits/version_0 while saving {TRAINING_LOCK} — free "
        "space there, or put the run on another disk (--trainer.logger.init_args.save_dir DIR, or "
        "--trainer.default_root_dir DIR without a logger); any checkpoint saved before is intact",
        f"error: no space left on the disk of {disk}/s while saving the lock file .st.npz.lock of --save_stats "
        f"{disk}/s/st.npz — {FREE_SPACE}",
    ], ran.stderr[-3000:]


def test_a_resume_whose_checkpoint_another_job_saved_anew_before_the_lock_is_refused(
    tmp_path, capsys, monkeypatch
):
    # A job stopped by Ctrl+C saves last.ckpt as it ends; a second job started meanwhile had chosen the older
    # last.ckpt, took the freed lock and trained from it, its saves replacing the newer ones (tester round 23a)
    from diffusion.cli import training_run

    runs = tmp_path / "runs"
    tiny_run(runs)
    (last,) = runs.glob("digits/version_0/checkpoints/last.ckpt")
    locking = training_run.training_in

    def saved_meanwhile(folder, resuming=None):
        os.utime(last, ns=(time.time_ns(), time.time_ns()))  # the other job's save, as it ended
        return locking(folder, resuming)

    monkeypatch.setattr(training_run, "training_in", saved_meanwhile)
    with pytest.raises(SystemExit) as exited:
        main([*TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", str(runs), "--ckpt_path", "last",
              "--max_steps", "6"])  # fmt: skip
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --ckpt_path last: another job saved {last} after this one chose last.ckpt to resume from (it ended "
        "as this one started) — run the command again: it resumes from the newest checkpoint"
    )
    monkeypatch.setattr(training_run, "training_in", locking)
    assert tiny_run(runs, "--ckpt_path", "last", "--max_steps", "6").trainer.global_step == 6
