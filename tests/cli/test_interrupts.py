"""Interrupts: SIGINT (Ctrl+C) and SIGTERM stop every command the same way, with one line on stderr, exit status
130 / 143, no traceback and no file that looks finished.

Each command runs in a subprocess of its own (signal handlers are per process) and the signal arrives while it
works: a wrapper sends it to the process from inside the step before the command writes its output, so the
moment is the same on every run (no sleeping, no racing on printed lines). Training's own path (save the step
reached, then exit 130 / 143) is training/test_preemption.py's.
"""

import signal
import sys
from pathlib import Path

import pytest
from helpers import tiny_run, warm
from helpers.user_errors import error_line, snapshot

# Replaces `module.function` by one that signals this process first, then runs the command's main.
WRAPPER = """
import importlib, os, signal, sys
module_name, function_name, signal_name, *argv = sys.argv[1:]
module = importlib.import_module(module_name)
work = getattr(module, function_name)
def interrupted_work(*args, **kwargs):
    os.kill(os.getpid(), getattr(signal, signal_name))
    return work(*args, **kwargs)
setattr(module, function_name, interrupted_work)
command = importlib.import_module(module_name.rsplit(".", 1)[0] + "." + {commands})
command.main(argv)
"""


def run_interrupted(command: str, step: str, signal_name: str, argv: list[str], cwd: Path):
    """Run `diffusion.cli.<command>`'s main on argv with SIGINT/SIGTERM sent when `step` (a name the command's
    module calls while it works) is called; return the finished process."""
    module, _, function = step.rpartition(".")
    script = WRAPPER.format(commands=repr(command))
    return warm.run(
        [sys.executable, "-c", script, module, function, signal_name, *argv],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def check_stopped(process, signal_name: str) -> None:
    assert process.returncode == 128 + getattr(signal, signal_name), process.stderr[-3000:]
    line = error_line(process.stderr)
    assert line.startswith(f"error: stopped by {signal_name} — "), line


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_sample_stopped_while_sampling_writes_nothing(signal_name, digits_checkpoint, tmp_path):
    out = tmp_path / "out"
    argv = [
        "--ckpt",
        str(digits_checkpoint),
        "--num_samples",
        "4",
        "--sampler",
        "ddim",
        "--steps",
        "3",
        "--out",
        str(out),
    ]
    process = run_interrupted(
        "sample", "diffusion.cli.sample.generate_in_chunks", signal_name, argv, tmp_path
    )
    check_stopped(process, signal_name)
    assert not (out / "samples.npz").exists() and not (out / "grid.png").exists()


def test_evaluate_stopped_before_its_statistics_are_saved_writes_none(user, tmp_path):
    stats = tmp_path / "stats.npz"
    argv = [
        "--reference",
        str(user / "samples" / "samples.npz"),
        "--save_stats",
        str(stats),
        "--features",
        "pixels",
    ]
    before = snapshot(user)
    step = "diffusion.cli.evaluate_quality.save_statistics"
    check_stopped(run_interrupted("evaluate", step, "SIGINT", argv, tmp_path), "SIGINT")
    assert not stats.exists() and snapshot(user) == before


def test_bits_per_dim_stopped_while_scoring_prints_no_result(digits_checkpoint, tmp_path):
    argv = ["--nll", "--ckpt", str(digits_checkpoint), "--num_images", "2"]
    process = run_interrupted("evaluate", "diffusion.cli.evaluate_nll.image_bounds", "SIGINT", argv, tmp_path)
    check_stopped(process, "SIGINT")
    assert "bits/dim" not in process.stdout


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_export_stopped_while_writing_leaves_no_export(signal_name, digits_checkpoint, tmp_path):
    out = tmp_path / "export"
    argv = ["--ckpt", str(digits_checkpoint), "--format", "safetensors", "--out", str(out)]
    process = run_interrupted("export", "diffusion.cli.export.write_export", signal_name, argv, tmp_path)
    check_stopped(process, signal_name)
    assert not out.exists() or not any(out.iterdir())
    assert [path.name for path in tmp_path.iterdir()] in (["export"], [])  # no staging folder left behind


def test_phema_stopped_before_writing_leaves_no_checkpoint(tmp_path, phema_run):
    out = tmp_path / "phema.ckpt"
    argv = ["--run", str(phema_run), "--sigma_rel", "0.1", "--out", str(out)]
    process = run_interrupted("phema", "diffusion.cli.phema.save_atomically", "SIGINT", argv, tmp_path)
    check_stopped(process, "SIGINT")
    assert not out.exists()


@pytest.fixture(scope="module")
def phema_run(tmp_path_factory) -> Path:
    save_dir = tmp_path_factory.mktemp("runs")
    tiny_run(save_dir, "--ema.post_hoc", "true", "--ema.snapshot_every", "2")
    return save_dir / "digits" / "version_0"
