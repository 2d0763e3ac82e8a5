"""The CIFAR-10 recipe as users run it on a GPU: training under NCCL, resuming, a kill -9, and the sample CLI.

    python benchmarks/gpu_checks.py train OUT     # OUT/train.md
    python benchmarks/gpu_checks.py sample OUT    # OUT/sample.md
    SUITE_QUICK=1 ...                             # a tiny UNet on a CPU in seconds: the commands, not the numbers

train: `python train.py --config configs/cifar10.yaml --strategy ddp --devices 1` (NCCL on a GPU) on synthetic
CIFAR-10 (benchmarks/speed_data.py: the recipe's loader and transforms over made-up pixels) in bf16-mixed and
16-mixed: are all logged losses finite; does `--ckpt_path last` resume (16-mixed, 10 more steps); and a run
killed with SIGKILL after a checkpoint (tests/helpers/ddp.py KillAt) and resumed with `--ckpt_path last`,
against the same run left alone, twice (the second says how far two uninterrupted runs on this GPU land from
each other). The kill runs load in the main process (num_workers 0): flips drawn in worker processes are not
reproduced after a mid-epoch resume (diffusion/data/resumable.py).

sample: `python -m diffusion.sample` from the bf16 run's checkpoint (or a 2-step run of its own), DDIM-50 and
DPM-Solver++(2M) SDE-20 in 32-bit and bf16-mixed: the command's wall time (start-up and loading included).
"""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
QUICK = os.environ.get("SUITE_QUICK") == "1"
WORK = Path(os.environ.get("SUITE_WORK", "/tmp/suite_work"))
STEPS, EVERY, KILL = (6, 2, 4) if QUICK else (40, 10, 20)
TINY = [
    "--model.network.init_args.channels", "8", "--model.network.init_args.channel_mult", "[1, 2]",
    "--model.network.init_args.num_res_blocks", "1", "--data.init_args.val_from_train", "8",
    "--data.init_args.num_workers", "0", "--accelerator", "cpu",
]  # fmt: skip
RECIPE = [
    "--config", str(ROOT / "configs" / "cifar10.yaml"), "--strategy", "ddp", "--devices", "1",
    "--data.class_path", "speed_data.SyntheticCIFAR10", "--trainer.log_every_n_steps", "1",
    "--checkpoint.every_n_train_steps", str(EVERY), "--trainer.enable_progress_bar", "false",
    *(TINY if QUICK else []),
]  # fmt: skip


def train_py(name: str, *flags: str) -> tuple[int, float, str]:
    """`python train.py <recipe> <flags>` in a session of its own (KillAt kills its process group), logging
    under WORK/runs/<name>; returns (exit status, seconds, the output's last lines)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests"),
                                                     env.get("PYTHONPATH")]))  # fmt: skip
    command = [sys.executable, str(ROOT / "train.py"), *RECIPE, "--trainer.logger.init_args.save_dir",
               str(WORK / "runs"), "--trainer.logger.init_args.name", name, *flags]  # fmt: skip
    print(f"[{name}] python train.py {' '.join(command[2:])}", flush=True)
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=WORK, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    RUNNING.append(process)
    output = process.communicate()[0]
    RUNNING.remove(process)
    seconds = time.perf_counter() - start
    print(output[-1500:], flush=True)
    return process.returncode, seconds, "\n".join(output.strip().splitlines()[-3:])


RUNNING: list[subprocess.Popen] = []  # train.py sessions under way: the suite's time limit ends them too


def end_running(signum: int, frame) -> None:
    for process in RUNNING:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    sys.exit(128 + signum)


def run_dir(name: str) -> Path:
    return WORK / "runs" / name / "version_0"


def logged_losses(name: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir(name)))
    events.Reload()
    return [event.value for event in events.Scalars("train/loss")]


def final_weights(name: str) -> dict[str, dict[str, torch.Tensor]]:
    checkpoint = torch.load(
        run_dir(name) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True
    )
    pick = lambda state: {k: v.float() for k, v in state.items() if k.startswith("network.")}  # noqa: E731
    return {"raw": pick(checkpoint["current_model_state"]), "EMA": pick(checkpoint["state_dict"]),
            "step": checkpoint["global_step"]}  # fmt: skip


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def check_train(out: Path) -> list[str]:
    lines, failed = ["## train.py on the GPU: precisions, resume, kill -9", ""], False
    lines += [f"`python train.py {' '.join(RECIPE)} ...` ({STEPS} steps, a checkpoint every {EVERY}).", ""]
    resume = ["--precision", "16-mixed", "--max_steps", str(STEPS // 2 + EVERY), "--ckpt_path", "last"]
    for name, flags in [
        ("bf16", ["--precision", "bf16-mixed", "--max_steps", str(STEPS)]),
        ("fp16", ["--precision", "16-mixed", "--max_steps", str(STEPS // 2)]),
        *([] if QUICK else [("fp16", resume)]),  # quick: the kill below resumes with --ckpt_path last too
    ]:
        code, seconds, tail = train_py(name, *flags)
        what = f"`{' '.join(flags)}`"
        if code != 0:
            failed = True
            lines.append(f"- {what}: FAILED (exit status {code}): {tail}")
            continue
        losses = logged_losses(name)
        finite = all(math.isfinite(x) for x in losses)
        failed |= not finite or not losses
        step = final_weights(name)["step"]
        lines.append(
            f"- {what}: {seconds:.0f} s, ended at step {step}, {len(losses)} losses logged, "
            f"{'all finite' if finite else 'NOT ALL FINITE'} (last {losses[-1] if losses else float('nan'):.4f})"
        )
    lines.append("")
    kill = ["--precision", "bf16-mixed", "--max_steps", str(STEPS), "--data.init_args.num_workers", "0"]
    killer = {"class_path": "helpers.ddp.KillAt", "init_args": {"step": KILL}}
    alone = train_py("alone", *kill)
    # Quick: no second run left alone (the same command; on a CPU it lands on the first's weights).
    again = (0, 0.0, "") if QUICK else train_py("alone_again", *kill)
    killed = train_py("killed", *kill, "--trainer.callbacks=" + json.dumps([killer]))
    resumed = train_py("killed", *kill, "--ckpt_path", "last")
    if killed[0] not in (-signal.SIGKILL, 128 + signal.SIGKILL):
        lines.append(
            f"- the kill at step {KILL}: FAILED, exit status {killed[0]}, not SIGKILL's: {killed[2]}"
        )
        failed = True
    elif any(code != 0 for code, _, _ in (alone, again, resumed)):
        tails = " / ".join(tail for code, _, tail in (alone, again, resumed) if code != 0)
        lines.append(f"- kill -9 + resume: FAILED: {tails}")
        failed = True
    else:
        left, ended = final_weights("alone"), final_weights("killed")
        second = None if QUICK else final_weights("alone_again")
        for kind in ("raw", "EMA"):
            floor = "not run (quick)" if second is None else f"{max_abs_diff(second[kind], left[kind]):.3g}"
            lines.append(
                f"- kill -9 at step {KILL} + `--ckpt_path last` to step {ended['step']}: {kind} weights max|diff| "
                f"{max_abs_diff(ended[kind], left[kind]):.3g} from the run left alone (two runs left alone: {floor})"
            )
    (out / "train.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return ["FAILED"] if failed else []


def check_sample(out: Path) -> list[str]:
    checkpoint = run_dir("bf16") / "checkpoints" / "last.ckpt"
    lines, failed = ["## The sample CLI on the GPU", ""], False
    if not checkpoint.is_file():
        code, _, tail = train_py("bf16", "--precision", "bf16-mixed", "--max_steps", "2")
        if code != 0:
            (out / "sample.md").write_text(f"FAILED: no checkpoint to sample from: {tail}\n")
            return ["FAILED"]
        lines.append("(from a 2-step run of its own: the train stage left no checkpoint)")
    num, batch = (8, 4) if QUICK else (2500, 1250)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    for sampler, steps in [("ddim", 50), ("dpmpp_2m_sde", 20)]:
        for precision in ("32", "bf16-mixed"):
            command = [sys.executable, "-m", "diffusion.sample", "--ckpt", str(checkpoint), "--num_samples", str(num),
                       "--batch_size", str(batch), "--sampler", sampler, "--steps", str(steps), "--precision", precision,
                       "--out", str(WORK / "samples" / f"{sampler}_{precision}"), "--overwrite"]  # fmt: skip
            start = time.perf_counter()
            result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            if result.returncode != 0:
                failed = True
                tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
                lines.append(
                    f"- {sampler}-{steps} {precision}: FAILED (exit status {result.returncode}): {' '.join(tail)}"
                )
                continue
            lines.append(
                f"- {sampler}-{steps} {precision}: {num:,} samples (batch {batch}) in {seconds:.1f} s with start-up "
                f"and loading, {num / seconds:,.0f} images/s: 50,000 in ~{50_000 * seconds / num:,.0f} s"
            )
    (out / "sample.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return ["FAILED"] if failed else []


if __name__ == "__main__":
    stage, out = sys.argv[1], Path(sys.argv[2])
    signal.signal(signal.SIGTERM, end_running)
    out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    problems = {"train": check_train, "sample": check_sample}[stage](out)
    sys.exit(1 if problems else 0)
