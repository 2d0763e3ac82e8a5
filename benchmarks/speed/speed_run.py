"""One run of benchmarks/speed/speed.py: what it measured (`Run`), its table and numbers written again after each
measurement (`save`: a run ended early keeps what it measured), and the `python train.py` processes it times."""

import argparse
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from benchmarks.speed.speed_jobs import FlagsRefused, timed_train_py
from benchmarks.speed.speed_paths import Timed
from benchmarks.speed.speed_report import markdown, targets
from diffusion.training.callbacks.step_timer import device_name

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    """Everything one benchmark run measured, for the table."""

    args: argparse.Namespace
    cli_args: list[str]
    precision: str
    device: torch.device
    batch: int
    sample_shape: tuple[int, ...] = ()
    num_params: int = 0
    flops: int = 0  # of one training step's forward + backward
    paths: list[Timed] = field(default_factory=list)
    train_py: list[dict] = field(default_factory=list)  # StepTimer reports of train.py processes
    loader: dict | None = None  # the data path alone
    sampling: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what could not be measured, and why
    skipped: list[str] = field(default_factory=list)  # train.py variants whose flags train.py refused
    job: dict | None = None


def output_folder(run: Run) -> Path:
    return run.args.out or ROOT / "benchmarks" / "results"


def save(run: Run) -> str:
    """speed.md (and with --out, speed.json: the raw numbers and the targets) of what is measured so far."""
    table = markdown(run)
    out = output_folder(run)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.md").write_text(table)
    if run.args.out:
        measured = {k: v for k, v in asdict(run).items() if k not in ("args", "paths", "device")}
        measured["paths"] = [{k: v for k, v in asdict(p).items() if k != "run"} for p in run.paths]
        measured["device"] = device_name(run.device)
        measured["peak_tflops"] = run.args.peak_tflops
        measured["targets"] = targets(run)
        (out / "speed.json").write_text(json.dumps(measured, indent=1, default=str))
    return table


def time_train_py(run: Run, accelerator: str, variants: list[str]) -> None:
    """train.py as users run it with each of these flags ('': the recipe as it is), each a process of its own."""
    args = run.args
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    work = Path(tempfile.mkdtemp(prefix="speed_train_py_"))
    runs = [(flags, env, "") for flags in dict.fromkeys(variants)]
    if args.cold_compile and "" in variants:
        # The recipe over compile caches of its own: empty for the first run (cold), filled for the second.
        caches = {
            name: str(work / "compile_cache" / name)
            for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
        }
        cached = {**env, **caches}
        runs[variants.index("")] = ("", cached, " (cold compile cache)")
        runs.insert(variants.index("") + 1, ("", cached, ""))
    for i, (flags, run_env, cold) in enumerate(runs):
        label = " ".join(["train.py", *flags.split()]) + cold
        try:
            run.train_py.append(
                timed_train_py(
                    [*run.cli_args, "--trainer.accelerator", accelerator],
                    flags.split(),
                    warmup=args.train_py_warmup,
                    steps=args.train_py_steps,
                    peak_tflops=args.peak_tflops,
                    synthetic=args.synthetic,
                    work=work / str(i),
                    env=run_env,
                    profile_steps=args.profile_steps,
                    label=label,
                )  # fmt: skip
            )
        except FlagsRefused as refused:
            if not flags:  # the recipe itself: a real failure
                run.problems.append(f"`{label}`: FAILED, {refused}".replace("|", "/"))
            else:
                run.skipped.append(f"`{label}`: skipped, train.py does not accept these flags: {refused}")
            print(run.skipped[-1] if flags else run.problems[-1], flush=True)
        except RuntimeError as error:
            print(error, flush=True)
            run.problems.append(f"`{label}`: FAILED, {str(error).splitlines()[-1]}".replace("|", "/"))
        save(run)
