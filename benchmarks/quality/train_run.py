"""The benchmarks' runs: train a recipe as a user would (`python train.py ...` in a subprocess, its output in a log
file), find a finished run to reuse, and keep a results file's earlier run below the new one. Shared by
quality.py, quality_conditional.py and the other benchmarks that train."""

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from diffusion.training.run_folders import latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import TINY_MLP, TINY_UNET  # noqa: E402, F401 (the tiny networks --quick shares with the tests)

# No validation (and so no sample grids) in --quick: 20 steps never reach val_check_interval.
QUICK = ["--max_steps", "20", "--model.warmup_steps", "1", "--trainer.enable_progress_bar", "false"]


@dataclass
class Recipe:
    name: str
    config_args: list[str]
    tiny_args: list[str]
    train_limit_s: float  # target wall time of `python train.py ...`
    num_samples: int  # samples per sampler (full mode)
    few_step: bool = False  # also measure the few-step samplers


def run_training(command: list[str], log_path: Path, label: str) -> float:
    """Run `command` (a train.py command line) from the repo root; return its wall time in seconds.

    The log keeps the whole output; a failed run stops the benchmark with the log's last 30 lines.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{label}] training: {' '.join(command[1:])}  (log: {log_path})", flush=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        code = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"[{label}] training failed with exit code {code}:\n{tail}")
    return seconds


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "reused"
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def train(recipe: Recipe, runs_dir: Path, quick: bool, log_dir: Path) -> tuple[Path, float]:
    """`python train.py ...` in a subprocess; returns (last.ckpt, wall seconds)."""
    command = [
        sys.executable,
        "train.py",
        *recipe.config_args,
        "--trainer.logger.init_args.save_dir",
        str(runs_dir),
    ]
    if quick:
        command += [*recipe.tiny_args, *QUICK]
    seconds = run_training(command, log_dir / f"train_{recipe.name}.log", recipe.name)
    print(f"[{recipe.name}] trained in {fmt_time(seconds)}", flush=True)
    return latest_checkpoint(runs_dir, recipe.name), seconds


def find_checkpoint(reuse: Path, name: str) -> Path:
    """A run folder (…/version_N) or a save dir holding <name>/version_N (the newest is taken)."""
    direct = reuse / "checkpoints" / "last.ckpt"
    return direct if direct.is_file() else latest_checkpoint(reuse, name)


EARLIER = "\n## The run before, kept for comparison\n\n"


def earlier_run(table_path: Path, quick: bool) -> str:
    """The previous run's table (its own earlier one dropped), to follow the new one: a recipe changed between
    the two (digits at 16x16 until 2026-11-27) stays comparable with what it was. Not in or from quick runs."""
    if quick or not table_path.exists():
        return ""
    before = table_path.read_text().split(EARLIER)[0]
    return "" if "QUICK MODE" in before else EARLIER + re.sub(r"(?m)^## ", "### ", before)
