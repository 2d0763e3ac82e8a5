"""What benchmarks/speed/speed.py runs as separate `python train.py` processes: the recipe timed by its own StepTimer as
users run it, and the default job's wall time from another commit (--baseline)."""

import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from benchmarks.speed.speed_data import DATA_CLASS

ROOT = Path(__file__).resolve().parents[2]
# How train.py refuses an option it does not have (one line, exit status 2: diffusion/cli/parse_errors.py), in
# today's words and in older trees' (a --baseline commit).
REFUSED = ("is not an option of", "is not accepted", "unrecognized arguments")


class FlagsRefused(RuntimeError):
    """train.py stopped at its command line: an option it does not have (yet)."""


def timed_train_py(
    cli_args: list[str], extra: list[str], *, warmup: int, steps: int, peak_tflops: float | None,
    synthetic: bool, work: Path, env: dict[str, str], profile_steps: int = 0, label: str | None = None,
) -> dict:  # fmt: skip
    """`python train.py <cli_args> <extra>` as users run it (the recipe's progress bar, TensorBoard logger,
    checkpoints and strategy) for `warmup + steps` optimizer steps and one more, timed by its StepTimer
    callback; returns the timer's report (its JSON line), with the run's wall time and command line."""
    label = label or " ".join(
        ["train.py", *extra]
    )  # run from the repo root, as users do: recipe paths are relative
    work.mkdir(parents=True, exist_ok=True)
    report, log = work / "step_timer.jsonl", work / "train.log"
    command = [
        sys.executable, str(ROOT / "train.py"), *cli_args, *extra, "--max_steps", str(warmup + steps + profile_steps + 1),
        "--trainer.logger.init_args.save_dir", str(work / "runs"),
        "--trainer.callbacks+=diffusion.training.callbacks.StepTimer",
        "--trainer.callbacks.warmup_steps", str(warmup), "--trainer.callbacks.steps", str(steps),
        "--trainer.callbacks.path", str(report), "--trainer.callbacks.label", label,
        "--trainer.callbacks.profile_steps", str(profile_steps),
    ]  # fmt: skip
    if peak_tflops:
        command += ["--trainer.callbacks.peak_tflops", str(peak_tflops)]
    if synthetic:
        # The recipe's own ImageDataModule, loader and transforms over made-up CIFAR-10 pixels (speed_data.py).
        command += ["--data.class_path", DATA_CLASS]
    paths = [str(ROOT), env.get("PYTHONPATH", "")]  # the class path names a module of this repository
    print(f"  {label}: {' '.join(command[2:])}", flush=True)
    start = time.perf_counter()
    with log.open("w") as output:
        result = subprocess.run(
            command, cwd=ROOT, env={**env, "PYTHONPATH": os.pathsep.join(filter(None, paths))},
            stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    seconds = time.perf_counter() - start
    output = log.read_text(errors="replace").splitlines()
    refused = [line for line in output if line.startswith("error: ") and any(r in line for r in REFUSED)]
    if result.returncode == 2 and refused:
        raise FlagsRefused(refused[-1].removeprefix("error: "))
    if result.returncode != 0 or not report.is_file():
        tail = "\n".join(output[-25:])
        raise RuntimeError(f"{label} failed (exit status {result.returncode}):\n{tail}")
    timed = json.loads(report.read_text().splitlines()[-1])
    timed.update(wall_seconds=seconds, command=shlex.join(["python", "train.py", *command[2:]]))
    return timed


# ---- the default job against another commit (--baseline) ---------------------------------------------------
def export_tree(revision: str, into: Path) -> Path:
    """The files of a commit (git archive: reads the repository, changes nothing in it)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision], capture_output=True, check=True
    ).stdout
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def job_seconds(tree: Path, job_args: list[str], runs: Path, env: dict) -> float:
    """Wall time of `python train.py ...` run from `tree` (its own diffusion package) as a user runs it."""
    command = [sys.executable, "train.py", *job_args, "--trainer.logger.init_args.save_dir", str(runs),
               "--trainer.enable_progress_bar", "false"]  # fmt: skip
    start = time.perf_counter()
    result = subprocess.run(
        command, cwd=tree, env={**env, "PYTHONPATH": str(tree)}, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"train.py failed in {tree}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return time.perf_counter() - start


def compare_jobs(
    baseline: str, cli_args: list[str], job_steps: int, job_rounds: int, threads: int | None
) -> dict:
    """The default job (`python train.py` + the flags after --), cut to `job_steps` (default: one validation
    interval of the digits recipe, with its validation and sample grid; 0: the whole job, each tree with its
    own recipe's step count), from `baseline` and from here, alternating; returns the wall times."""
    job_args = [*cli_args, "--max_steps", str(job_steps)] if job_steps else list(cli_args)
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    work = Path(tempfile.mkdtemp(prefix="speed_job_"))
    trees = {baseline: export_tree(baseline, work / "baseline"), "this tree": ROOT}
    seconds: dict[str, list[float]] = {name: [] for name in trees}
    for r in range(job_rounds):
        for name, tree in list(trees.items())[:: 1 if r % 2 == 0 else -1]:
            seconds[name].append(job_seconds(tree, job_args, work / f"runs_{len(seconds[name])}_{r}", env))
            print(f"  job round {r + 1}/{job_rounds} {name}: {seconds[name][-1]:.1f} s", flush=True)
    return {"args": job_args, "seconds": seconds}
