"""The CIFAR-10 recipe as users run it on a GPU: training under NCCL, resuming, a kill -9, and the sample CLI.

    python benchmarks/gpu/gpu_checks.py train OUT   # OUT/train.md
    python benchmarks/gpu/gpu_checks.py sample OUT  # OUT/sample.md
    SUITE_QUICK=1 ...                               # a tiny UNet on a CPU: the commands, not the numbers

train: `python train.py --config configs/cifar10.yaml` on synthetic CIFAR-10 (benchmarks/speed/speed_data.py: the
recipe's data module over made-up pixels) in chains that run side by side (none of them times anything):
- under DDP on one device (`--trainer.strategy.class_path lightning.pytorch.strategies.DDPStrategy --devices 1`:
  NCCL on a GPU; the class, because `--strategy ddp` on one device may run without DDP), eager (what a checkpoint holds
  does not depend on compiling): 16-mixed, then resumed with `--ckpt_path last` (the GradScaler's state);
  bf16-mixed left alone; the same run killed with SIGKILL after a checkpoint (tests/helpers/ddp.py KillAt) and
  resumed with `--ckpt_path last`, whose raw and EMA weights are compared with the run left alone's. Where they
  differ, the run is left alone once more: how far two uninterrupted runs on this GPU land from each other
  (nondeterministic kernels). The kill chains load in the main process (num_workers 0): flips drawn in worker
  processes are not reproduced after a mid-epoch resume (diffusion/data/resumable.py).
- on a GPU, the recipe as users run it (its own strategy and compile setting), in bf16-mixed and 16-mixed; what
  they compile then sits in Inductor's on-disk cache when the speed stages compile the same graphs.
Every run's logged losses must be finite.

sample: a 1-step checkpoint of its own, then `python -m diffusion.sample` with DDIM-50 in 32-bit and
DPM-Solver++(2M) SDE-20 in bf16-mixed: the samples file's shape, type and spread (sampling speed is measured
elsewhere).
"""

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

# CIFAR-10's stand-in, by the class path train.py imports (the speed part's data: gpu/ uses speed/, not back).
from benchmarks.speed.speed_data import DATA_CLASS

ROOT = Path(__file__).resolve().parents[2]
QUICK = os.environ.get("SUITE_QUICK") == "1"
WORK = Path(os.environ.get("SUITE_WORK", "/tmp/suite_work"))
STEPS, EVERY, KILL, AS_USERS_STEPS = (6, 2, 4, 0) if QUICK else (40, 10, 20, 12)
DDP_CLASS = "lightning.pytorch.strategies.DDPStrategy"
TINY = [
    "--model.network.init_args.channels", "8", "--model.network.init_args.channel_mult", "[1, 2]",
    "--model.network.init_args.num_res_blocks", "1", "--data.init_args.num_images", "64",
    "--data.init_args.val_from_train", "2",
    "--data.init_args.batch_size", "2", "--data.init_args.num_workers", "0", "--accelerator", "cpu",
]  # fmt: skip
RECIPE = [
    "--config", str(ROOT / "configs" / "cifar10.yaml"), "--data.class_path", DATA_CLASS,
    "--trainer.log_every_n_steps", "1", "--checkpoint.every_n_train_steps", str(EVERY),
    "--trainer.enable_progress_bar", "false", *(TINY if QUICK else []),
]  # fmt: skip
CHECKED = [
    *RECIPE, "--trainer.strategy.class_path", DDP_CLASS, "--devices", "1", "--model.compile_training", "false",
]  # fmt: skip
RUNNING: list[subprocess.Popen] = []  # train.py sessions under way: the suite's time limit ends them too
PRINTING = threading.Lock()


@dataclass
class Trained:
    name: str
    flags: list[str]
    code: int
    seconds: float
    tail: str


def train_py(name: str, base: list[str], *flags: str) -> Trained:
    """`python train.py <base> <flags>` in a session of its own (KillAt kills its process group), logging
    under WORK/runs/<name>."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH")]))
    command = [sys.executable, str(ROOT / "train.py"), *base, "--trainer.logger.init_args.save_dir",
               str(WORK / "runs"), "--trainer.logger.init_args.name", name, *flags]  # fmt: skip
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=WORK, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    RUNNING.append(process)
    output = process.communicate()[0]
    RUNNING.remove(process)
    seconds = time.perf_counter() - start
    # The process group's backend (NCCL on a GPU), wherever it appears, then the end of the output.
    backend = next(
        (line for line in output.splitlines() if "distributed_backend=" in line), "(no process group)"
    )
    with PRINTING:  # whole blocks: the chains print side by side
        print(f"[{name}] python train.py {' '.join(command[2:])}\n{backend}\n{output[-1500:]}", flush=True)
    return Trained(name, list(flags), process.returncode, seconds, " ".join(output.strip().splitlines()[-3:]))


def end_running(signum: int, frame) -> None:
    for process in list(RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    os._exit(128 + signum)  # the chains' threads would keep the interpreter alive


def run_dir(name: str) -> Path:
    return WORK / "runs" / name / "version_0"


def logged_losses(name: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir(name)))
    events.Reload()
    return [event.value for event in events.Scalars("train/loss")]


def final_weights(name: str) -> dict:
    checkpoint = torch.load(
        run_dir(name) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True
    )
    pick = lambda state: {k: v.float() for k, v in state.items() if k.startswith("network.")}  # noqa: E731
    return {"raw": pick(checkpoint["current_model_state"]), "EMA": pick(checkpoint["state_dict"]),
            "step": checkpoint["global_step"]}  # fmt: skip


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def outcome(run: Trained) -> tuple[str, bool]:
    """A line for train.md and whether the run did what it should (exit 0, every logged loss finite)."""
    what = f"`{' '.join(run.flags)}`"
    if run.code != 0:
        return f"- {what}: FAILED (exit status {run.code}): {run.tail}", False
    losses = logged_losses(run.name)
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    last = f"{losses[-1]:.4f}" if losses else "none"
    return (
        f"- {what}: {run.seconds:.0f} s, ended at step {final_weights(run.name)['step']}, {len(losses)} losses "
        f"logged, {'all finite' if finite else 'NOT ALL FINITE'} (last {last})"
    ), finite


def kill_and_resume() -> tuple[list[str], bool]:
    """The run killed at step KILL and resumed, against the same run left alone (run at the same time)."""
    kill = ["--precision", "bf16-mixed", "--max_steps", str(STEPS), "--data.init_args.num_workers", "0"]
    killer = {"class_path": "helpers.ddp.KillAt", "init_args": {"step": KILL}}
    with ThreadPoolExecutor(1) as pool:
        alone = pool.submit(train_py, "alone", CHECKED, *kill)
        killed = train_py("killed", CHECKED, *kill, "--trainer.callbacks=" + json.dumps([killer]))
        resumed = train_py("killed", CHECKED, *kill, "--ckpt_path", "last") if killed.code != 0 else None
        alone = alone.result()
    line, ok = outcome(alone)
    lines = [line.replace("`: ", "` (left alone): ", 1)]
    if killed.code not in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return [
            *lines,
            f"- the kill at step {KILL}: FAILED, exit status {killed.code}, not SIGKILL's: {killed.tail}",
        ], False
    if resumed.code != 0 or alone.code != 0:
        return [*lines, f"- kill -9 + resume: FAILED: {resumed.tail if resumed.code else alone.tail}"], False
    left, ended = final_weights("alone"), final_weights("killed")
    diffs = {kind: max_abs_diff(ended[kind], left[kind]) for kind in ("raw", "EMA")}
    floor = dict.fromkeys(
        diffs, "not run: the resumed run matched exactly" if not any(diffs.values()) else "not run (quick)"
    )
    if any(diffs.values()) and not QUICK:
        again = train_py("alone_again", CHECKED, *kill)
        if again.code == 0:
            second = final_weights("alone_again")
            floor = {kind: f"{max_abs_diff(second[kind], left[kind]):.3g}" for kind in diffs}
    for kind, diff in diffs.items():
        lines.append(
            f"- kill -9 at step {KILL} + `--ckpt_path last` to step {ended['step']}: {kind} weights max|diff| "
            f"{diff:.3g} from the run left alone (two runs left alone: {floor[kind]})"
        )
    return lines, ok


def fp16_and_resume() -> tuple[list[str], bool]:
    first = train_py("fp16", CHECKED, "--precision", "16-mixed", "--max_steps", str(STEPS // 2))
    line, ok = outcome(first)
    lines = [line]
    if first.code == 0:
        resumed = train_py("fp16", CHECKED, "--precision", "16-mixed", "--max_steps", str(STEPS // 2 + EVERY),
                           "--ckpt_path", "last")  # fmt: skip
        line, resumed_ok = outcome(resumed)
        lines, ok = [*lines, line], ok and resumed_ok
    return lines, ok


def as_users_run_it(precision: str) -> tuple[list[str], bool]:
    line, ok = outcome(train_py(f"recipe_{precision}", RECIPE, "--precision", precision,
                                "--max_steps", str(AS_USERS_STEPS)))  # fmt: skip
    return [line], ok


def check_train(out: Path) -> bool:
    shutil.rmtree(WORK / "runs", ignore_errors=True)  # run folders are read as version_0
    chains = {"fp16": fp16_and_resume, "kill": kill_and_resume}
    if AS_USERS_STEPS:  # not on a CPU: nothing compiles there, so these would repeat the chains above
        chains |= {
            "bf16-mixed": lambda: as_users_run_it("bf16-mixed"),
            "16-mixed": lambda: as_users_run_it("16-mixed"),
        }
    done: dict[str, tuple[list[str], bool]] = {}

    def write() -> None:  # after each chain: a stage ended at its limit keeps what was done
        lines = ["## train.py on the GPU: precisions, resume, kill -9", "",
                 f"`python train.py {' '.join(CHECKED)} ...`: DDP on one device, eager, a checkpoint every {EVERY} "
                 "steps; the chains ran side by side.", ""]  # fmt: skip
        for name in ("fp16", "kill"):
            lines += done.get(name, ([f"- ({name}: not finished)"], False))[0]
        if AS_USERS_STEPS:
            lines += ["", f"The recipe as users run it (its own strategy and compile setting), `python train.py "
                      f"{' '.join(RECIPE)} ...`:", ""]  # fmt: skip
            for name in ("bf16-mixed", "16-mixed"):
                lines += done.get(name, ([f"- ({name}: not finished)"], False))[0]
        (out / "train.md").write_text("\n".join(lines) + "\n")

    with ThreadPoolExecutor(len(chains)) as pool:
        futures = {pool.submit(chain): name for name, chain in chains.items()}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            write()
    print((out / "train.md").read_text(), flush=True)
    return all(ok for _, ok in done.values())


def check_sample(out: Path) -> bool:
    shutil.rmtree(WORK / "runs", ignore_errors=True)
    source = train_py(
        "source", RECIPE, "--model.compile_training", "false", "--precision", "bf16-mixed", "--max_steps", "1"
    )
    if source.code != 0:
        (out / "sample.md").write_text(f"FAILED: no checkpoint to sample from: {source.tail}\n")
        return False
    checkpoint = run_dir("source") / "checkpoints" / "last.ckpt"
    lines, ok = (
        ["## The sample CLI on the GPU", "", f"From a 1-step checkpoint (`{checkpoint.name}`).", ""],
        True,
    )
    num, batch = (4, 2) if QUICK else (500, 250)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    for sampler, steps, precision in [("ddim", 50, "32"), ("dpmpp_2m_sde", 20, "bf16-mixed")]:
        folder = WORK / "samples" / f"{sampler}_{precision}"
        command = [sys.executable, "-m", "diffusion.sample", "--ckpt", str(checkpoint), "--num_samples", str(num),
                   "--batch_size", str(batch), "--sampler", sampler, "--steps", str(steps), "--precision", precision,
                   "--out", str(folder), "--overwrite"]  # fmt: skip
        start = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        name = f"{sampler}-{steps} {precision}"
        if result.returncode != 0:
            ok = False
            tail = " ".join((result.stdout + result.stderr).strip().splitlines()[-3:])
            lines.append(f"- {name}: FAILED (exit status {result.returncode}): {tail}")
            continue
        images = np.load(folder / "samples.npz")["arr_0"]
        good = images.dtype == np.uint8 and images.shape == (num, 32, 32, 3) and images.std() > 0
        ok &= bool(good)
        lines.append(
            f"- {name}: {num:,} samples (batch {batch}) in {seconds:.1f} s with start-up and loading: "
            f"{images.dtype} {tuple(images.shape)}, spread {images.std():.1f}{'' if good else ' WRONG'}"
        )
    (out / "sample.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return ok


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "stage", choices=["train", "sample"], help="train: OUT/train.md; sample: OUT/sample.md"
    )
    parser.add_argument("out", type=Path, help="the folder the stage's markdown goes to")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, end_running)
    args.out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    passed = {"train": check_train, "sample": check_sample}[args.stage](args.out)
    sys.exit(0 if passed else 1)
