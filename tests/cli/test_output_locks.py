"""Two exports into one --out folder, two phemas into one --out checkpoint, or two evaluates into one --save_stats
file, at once: the second is refused at once
(before it reads anything), naming the running one (pid, host, start), with exit status 2, and the first writes its
output whole (both said "wrote ...", and one's output was the other's). The lock lies beside the output (an export
folder, what users copy and load, never holds it) and goes with its holder, even one killed by SIGKILL."""

import json
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_run, warm
from helpers.user_errors import error_line

from diffusion.cli import evaluate, export, phema
from diffusion.training.loading import load_checkpoint

# A command whose writing waits, once it has begun, for the file `release` (its --out held meanwhile): argv[1] is
# the folder of the signals, argv[2] the module that writes ("export", "phema", "evaluate_quality"), argv[3] the
# function it writes with, argv[4] the command's module (whose main runs).
WAITING = (
    "import importlib, sys, time\n"
    "from pathlib import Path\n"
    "writer = importlib.import_module('diffusion.cli.' + sys.argv[2])\n"
    "writing = getattr(writer, sys.argv[3])\n"
    "def waiting(*args, **kwargs):\n"
    "    Path(sys.argv[1], 'writing').touch()\n"
    "    while not Path(sys.argv[1], 'release').exists():\n"
    "        time.sleep(0.05)\n"
    "    return writing(*args, **kwargs)\n"
    "setattr(writer, sys.argv[3], waiting)\n"
    "importlib.import_module('diffusion.cli.' + sys.argv[4]).main(sys.argv[5:])\n"
)


def waiting_command(module: str, writer: str, argv: list[str], signals: Path, command: str | None = None):
    signals.mkdir()
    first = warm.popen(
        [sys.executable, "-c", WAITING, str(signals), module, writer, command or module, *argv],
        stderr=-1, stdout=-1, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (signals / "writing").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
        time.sleep(0.05)
    return first


def refused_naming(main, argv: list[str], first, capsys, flag: str = "--out") -> str:
    started = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert time.monotonic() - started < 10  # at once: before its checkpoint or run is read
    assert exited.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert (
        f" (pid {first.pid} on host {socket.gethostname()}, started {time.strftime('%Y-%m-%d ')}" in line
    ), line
    assert line.endswith(f") — wait for it to finish, or pass another {flag}"), line
    return line


def finished(first, signals: Path) -> str:
    (signals / "release").touch()
    output, error = first.communicate(timeout=120)
    assert first.returncode == 0, error[-3000:]
    return output


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_second_export_into_an_out_being_written_is_refused_naming_the_first(
    overwrite, digits_checkpoint, tmp_path, capsys
):
    out = tmp_path / "new" / "exQ"
    ema = ["--ckpt", str(digits_checkpoint), "--format", "safetensors", "--out", str(out)]
    first = waiting_command("export", "write_export", ema, tmp_path / "signals")
    try:
        line = refused_naming(export.main, [*ema, "--weights", "raw", *overwrite], first, capsys)
        assert line.startswith(f"error: --out {out} is being written by another export (pid "), line
    finally:
        output = finished(first, tmp_path / "signals")
    assert output.startswith(f"wrote the ema weights of {digits_checkpoint} to {out}"), output
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no lock in it
    assert sorted(p.name for p in out.parent.iterdir()) == ["exQ"]  # nor beside it (.exQ.lock), nor staging
    assert json.loads((out / "config.json").read_text())["weights"] == "ema"  # the first's, whole
    # Finished, it holds the folder no more: the next export is refused only as before, for the files there
    with pytest.raises(SystemExit):
        export.main([*ema, "--weights", "raw"])
    assert "is not empty" in error_line(capsys.readouterr().err)
    export.main([*ema, "--weights", "raw", "--overwrite"])
    assert json.loads((out / "config.json").read_text())["weights"] == "raw"


def test_an_export_holds_its_lock_in_out_where_the_parent_cannot_be_written(
    digits_checkpoint, tmp_path, monkeypatch
):
    """A mount point's --out (or a user's folder in a shared one): the lock goes in it, and one left by a killed
    export neither makes --out count as not empty nor stops the export from loading."""
    out = tmp_path / "mounted"
    out.mkdir()
    (out / export.EXPORT_LOCK).write_text("12345 elsewhere 2026-01-01 00:00:00\n")  # a killed export's
    monkeypatch.setattr(export.os, "access", lambda path, mode: Path(path) != tmp_path)
    assert export.export_lock(out) == out.resolve() / export.EXPORT_LOCK
    export.main(["--ckpt", str(digits_checkpoint), "--format", "safetensors", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    (out / export.EXPORT_LOCK).write_text("12345 elsewhere 2026-01-01 00:00:00\n")
    assert load_checkpoint(out).sample_shape == (1, 8, 8)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    save_dir = tmp_path_factory.mktemp("runs")
    tiny_run(save_dir, "--ema.post_hoc", "true", "--ema.snapshot_every", "2")
    return save_dir / "digits" / "version_0"


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_second_phema_into_an_out_being_written_is_refused_naming_the_first(
    overwrite, run, tmp_path, capsys
):
    out = tmp_path / "new" / "phQ.ckpt"
    argv = ["--run", str(run), "--out", str(out)]
    first = waiting_command("phema", "save_atomically", [*argv, "--sigma_rel", "0.05"], tmp_path / "signals")
    try:
        line = refused_naming(phema.main, [*argv, "--sigma_rel", "0.1", *overwrite], first, capsys)
        assert line.startswith(f"error: --out {out} is being written by another phema (pid "), line
    finally:
        output = finished(first, tmp_path / "signals")
    assert output.startswith(f"wrote {out}: the EMA of sigma_rel 0.05"), output
    assert sorted(p.name for p in out.parent.iterdir()) == ["phQ.ckpt"]  # no .phQ.ckpt.lock left
    written = torch.load(out, map_location="cpu", weights_only=True)
    assert written["post_hoc_ema"]["sigma_rel"] == 0.05  # the first's


def test_a_phema_killed_while_writing_does_not_block_the_next(run, tmp_path, capsys):
    out = tmp_path / "phQ.ckpt"
    argv = ["--run", str(run), "--out", str(out), "--sigma_rel", "0.05"]
    first = waiting_command("phema", "save_atomically", argv, tmp_path / "signals")
    first.kill()
    first.wait(timeout=30)
    assert phema.phema_lock(str(out)).exists()  # left by the killed phema, locked by no one
    assert phema.main(argv) == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["phQ.ckpt", "signals"]


def test_a_refused_phema_leaves_no_folder_it_made(run, tmp_path, capsys):
    """The lock's folder is made before the checks: a phema refused after it (here its --run) takes it away."""
    with pytest.raises(SystemExit) as exited:
        phema.main(
            [
                "--run",
                str(tmp_path / "missing"),
                "--sigma_rel",
                "0.05",
                "--out",
                str(tmp_path / "a" / "x.ckpt"),
            ]
        )
    assert exited.value.code == 2, capsys.readouterr().err[-3000:]
    assert sorted(tmp_path.iterdir()) == []


def test_a_second_evaluate_saving_statistics_into_one_file_is_refused_naming_the_first(tmp_path, capsys):
    """Round 13's Z2: two `evaluate --save_stats` into one new file at once both said "wrote", and it held one."""
    out = tmp_path / "new" / "stX.npz"
    out.parent.mkdir()  # evaluate writes into a folder that exists
    samples = tmp_path / "samples.npz"
    np.savez(samples, np.zeros((16, 8, 8, 1), np.uint8))
    argv = ["--features", "pixels", "--save_stats", str(out)]
    first = waiting_command(
        "evaluate_quality",
        "save_statistics",
        [*argv, "--reference", "digits"],
        tmp_path / "signals",
        "evaluate",
    )
    try:
        line = refused_naming(
            evaluate.main, [*argv, "--reference", str(samples)], first, capsys, flag="--save_stats"
        )
        assert line.startswith(f"error: --save_stats {out} is being written by another evaluate (pid "), line
    finally:
        output = finished(first, tmp_path / "signals")
    assert "wrote the FID statistics of digits" in output, output
    assert sorted(p.name for p in out.parent.iterdir()) == ["stX.npz"]  # no .stX.npz.lock left
    assert int(np.load(out)["num_images"]) == 1797  # the first's: the digits
