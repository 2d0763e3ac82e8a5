"""Training and sampling throughput of a recipe, and what the framework costs against plain PyTorch loops.

    python benchmarks/speed.py                                 # the default recipe (digits), ~5 min on 2 CPU cores
    python benchmarks/speed.py --config configs/cifar10.yaml   # the same on a GPU (batch 128, its precision)
    python benchmarks/speed.py --baseline 82f9c05              # also the default job's wall time vs that commit
    python benchmarks/speed.py --quick --out /tmp/speed        # plumbing check in seconds; numbers meaningless
    python benchmarks/speed.py -- --model.compile true         # train.py flags after `--` (project and plain)

Three training paths on the same batches, interleaved in one process: round r runs each path for
`--warmup + --steps` optimizer steps (the order rotates every round). A path's step time is the median, over
all rounds, of the intervals between consecutive step starts after its warm-up (on CUDA, of 10-step chunks
closed by a synchronize). A ratio between two paths is the median of their per-round ratios: paired within a
round, so a machine that slows down for a while (other jobs) moves both sides of a ratio alike.

- project: the recipe as `python train.py` builds it (LightningCLI: config, flags, DiffusionModule, DataModule,
  the EMA callback, gradient clipping, Adam with warmup, precision) run by a Lightning Trainer with no
  validation, logger, checkpointing or progress bar.
- plain: the same DiffusionModule (a copy), batches and optimizer (configure_optimizers) in a hand-written
  loop: autocast/GradScaler as the precision asks, clip_grad_norm_, EMA by one torch._foreach_lerp_.
- diffusers: diffusers' UNet2DModel built with the same widths, blocks and attention levels (so the same
  parameter count), DDPMScheduler.add_noise, Adam with warmup, clipping and EMAModel(foreach=True): the loop
  of diffusers' train_unconditional example without accelerate. Skipped when diffusers is missing
  (`pip install -e ".[bench]"`) or the network is not a UNet.

Then sampling: DDIM-50 (per-sample seeds) of one batch of the recipe's size with the project's module,
images/s. Peak memory per path: CUDA max_memory_allocated; CPU the process's peak RSS (VmHWM, reset per path
through /proc/self/clear_refs; it includes what the other paths keep resident).

Results go to benchmarks/results/speed.md (OUT/speed.md with --out, and always with --quick).
"""

import argparse
import contextlib
import io
import logging
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from speed_paths import build_project, diffusers_path, plain_path, project_path, training_flops

from diffusion.core.sampling import SamplingOptions
from diffusion.models import UNet
from diffusion.training.optim import use_tf32_on_cuda

ROOT = Path(__file__).resolve().parents[1]
TINY_UNET = [
    "--model.network.init_args.channels", "8", "--model.network.init_args.channel_mult", "[1, 2]",
    "--model.network.init_args.num_res_blocks", "1", "--model.network.init_args.attention_levels", "[1]",
]  # fmt: skip


@dataclass
class Timed:
    """A training path and what was measured of it."""

    name: str
    run: Callable[[int], list[float]]  # timed steps -> seconds of each (after the warm-up steps)
    note: str = ""
    times: list[float] = field(default_factory=list)  # every timed step of every round
    rounds: list[float] = field(default_factory=list)  # the median of each round
    peak_bytes: int = 0
    peak_above_start: int = 0  # the step's own working memory: activations, gradients, temporaries
    walls: list[float] = field(default_factory=list)  # wall seconds of each round, warm-up included

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.times)


@dataclass
class Run:
    """Everything one benchmark run measured, for the table."""

    args: argparse.Namespace
    cli_args: list[str]
    precision: str
    device: torch.device
    batch: int
    num_params: int = 0
    flops: int = 0  # of one training step's forward + backward
    paths: list[Timed] = field(default_factory=list)
    sampling: list[float] = field(default_factory=list)  # seconds per batch
    job: dict | None = None


COMPILED = "plain loop, network compiled"
PEER = "diffusers UNet2DModel, plain loop"


def reset_peak_memory(device: torch.device) -> int:
    """Start a peak-memory window; returns the memory in use at its start."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := current RSS
    return _proc_status_bytes("VmRSS")


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _proc_status_bytes("VmHWM")


def _proc_status_bytes(field_name: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    import resource  # not Linux: the peak of the whole process

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- sampling and the whole job -------------------------------------------------------------------------
def sampling_seconds(module, device: torch.device, batch: int, steps: int, repeats: int) -> list[float]:
    """Seconds per batch of DDIM-`steps` with per-sample seeds, after one short warm-up call."""
    module.to(device)
    module.sample(batch, seed=0, options=SamplingOptions(sampler="ddim", steps=2))
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        module.sample(batch, seed=0, options=SamplingOptions(sampler="ddim", steps=steps))
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds


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


# ---- the run ------------------------------------------------------------------------------------------
def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    model = platform.processor() or "CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {torch.get_num_threads()} threads"


def fmt_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def interleave(paths: list[Timed], rounds: int, steps: int, device: torch.device) -> None:
    for r in range(rounds):
        order = paths[r % len(paths) :] + paths[: r % len(paths)]  # rotate: no path always goes first
        for path in order:
            start = reset_peak_memory(device)
            began = time.perf_counter()
            times = path.run(steps)
            path.walls.append(time.perf_counter() - began)
            peak = peak_memory(device)
            path.peak_bytes = max(path.peak_bytes, peak)
            path.peak_above_start = max(path.peak_above_start, peak - start)
            path.rounds.append(statistics.median(times))
            path.times += times
            print(f"  round {r + 1}/{rounds} {path.name}: {statistics.median(times):.4f} s/step", flush=True)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python benchmarks/speed.py", *argv])
    cli_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="a recipe (default: configs/digits.yaml, as train.py)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds of every path")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per path and round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them, every round")
    parser.add_argument("--sampling_steps", type=int, default=50, help="DDIM steps of the sampling measure")
    parser.add_argument("--accelerator", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--synthetic", action="store_true", help="random images of the recipe's shape")
    parser.add_argument("--no_diffusers", action="store_true", help="skip the diffusers path")
    parser.add_argument(
        "--compiled", action="store_true",
        help="also the plain loop with the network compiled (as --model.compile true), and its compile time",
    )  # fmt: skip
    parser.add_argument("--baseline", help="a git revision: also time the default job from it and from here")
    parser.add_argument(
        "--job_steps", type=int, default=500,
        help="steps of each timed job (--baseline); 0: each tree's whole default job, its own max_steps",
    )  # fmt: skip
    parser.add_argument("--job_rounds", type=int, default=2, help="interleaved jobs per tree (--baseline)")
    parser.add_argument("--peak_tflops", type=float, help="the device's peak (e.g. 989 for H100 SXM bf16)")
    parser.add_argument("--quick", action="store_true", help="tiny UNet and few steps: plumbing only")
    parser.add_argument("--out", type=Path, help="write speed.md here (default with --quick: a temp dir)")
    args = parser.parse_args(argv)
    args.command = command
    if args.quick:
        args.rounds, args.steps, args.warmup, args.sampling_steps = 2, 3, 2, 3
        args.job_steps, args.job_rounds = 4, 1
        cli_args = [*TINY_UNET, *cli_args]
        args.out = args.out or Path(tempfile.mkdtemp(prefix="speed_quick_"))
    if min(args.rounds, args.steps) < 1 or args.warmup < 0:
        parser.error("--rounds and --steps must be >= 1 and --warmup >= 0")
    if args.config:
        cli_args = ["--config", args.config, *cli_args]
    return args, cli_args


def main(argv: list[str] | None = None) -> str:
    args, cli_args = parse_args(argv)
    for name in ("lightning.pytorch", "lightning.fabric"):  # one Trainer per round: keep their banners out
        logging.getLogger(name).setLevel(logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    accelerator = args.accelerator
    if accelerator == "auto":
        accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(accelerator)
    use_tf32_on_cuda(device)  # as DiffusionModule.setup does for training
    cli = build_project([*cli_args, "--trainer.accelerator", accelerator], args.synthetic)
    batch, network = cli.datamodule.batch_size, cli.model.to(device).network
    run = Run(args, cli_args, str(cli.trainer.precision), device, batch)
    run.num_params = sum(p.numel() for p in network.parameters())
    run.flops = training_flops(network, cli.model.sample_shape, batch, device)  # before anything compiles
    run.paths = [
        Timed("project: Lightning Trainer + EMA callback", project_path(cli, device, args.warmup)),
        Timed("plain loop, same module", plain_path(cli, device, args.warmup)),
    ]
    if args.compiled:
        compiled = plain_path(cli, device, args.warmup, compile=True)
        run.paths.append(Timed(COMPILED, compiled, note="torch.compile, default mode"))
    if not args.no_diffusers and isinstance(network, UNet):
        try:
            train, note = diffusers_path(cli, device, args.warmup)
            run.paths.append(Timed(PEER, train, note=note))
        except ImportError:
            print("diffusers is not installed (pip install -e '.[bench]'): no diffusers path", flush=True)
    print(f"{len(run.paths)} paths x {args.rounds} rounds x ({args.warmup} warm-up + {args.steps} timed "
          f"steps), batch {batch}, {run.num_params:,} parameters, on {device_name(device)}", flush=True)  # fmt: skip
    interleave(run.paths, args.rounds, args.steps, device)
    run.sampling = sampling_seconds(cli.model, device, batch, args.sampling_steps, repeats=3)
    run.job = compare_jobs(args, cli_args) if args.baseline else None
    table = markdown(run)
    out = args.out or ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.md").write_text(table)
    print("\n" + table + f"\nwritten to {out / 'speed.md'}")
    return table


def compare_jobs(args: argparse.Namespace, cli_args: list[str]) -> dict:
    """The default job (`python train.py` + the flags after --), cut to --job_steps (default: one validation
    interval of the digits recipe, with its validation and sample grid; 0: the whole job, each tree with its
    own recipe's step count), from --baseline and from here, alternating; returns the wall times."""
    job_args = [*cli_args, "--max_steps", str(args.job_steps)] if args.job_steps else list(cli_args)
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    work = Path(tempfile.mkdtemp(prefix="speed_job_"))
    trees = {args.baseline: export_tree(args.baseline, work / "baseline"), "this tree": ROOT}
    seconds: dict[str, list[float]] = {name: [] for name in trees}
    for r in range(args.job_rounds):
        for name, tree in list(trees.items())[:: 1 if r % 2 == 0 else -1]:
            seconds[name].append(job_seconds(tree, job_args, work / f"runs_{len(seconds[name])}_{r}", env))
            print(f"  job round {r + 1}/{args.job_rounds} {name}: {seconds[name][-1]:.1f} s", flush=True)
    return {"args": job_args, "seconds": seconds}


def paired_ratio(path: Timed, reference: Timed) -> tuple[float, float, float]:
    """Median, min and max over rounds of path's step time / reference's in the same round."""
    ratios = [a / b for a, b in zip(path.rounds, reference.rounds, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def markdown(run: Run) -> str:
    args, paths = run.args, run.paths
    project, plain = paths[0], paths[1]
    peer = next((path for path in paths if path.name == PEER), None)
    quick = (
        " QUICK MODE (tiny UNet, a few steps): plumbing only, the numbers mean nothing" if args.quick else ""
    )
    lines = [
        f"## Training and sampling speed ({time.strftime('%Y-%m-%d')}, {device_name(run.device)}, "
        f"torch {torch.__version__}){quick}",
        "",
        f"`{args.command}`",
        "",
        f"Recipe: `train.py {' '.join(run.cli_args) or '(configs/digits.yaml)'}`"
        f"{' with synthetic images' if args.synthetic else ''}; batch {run.batch}, {run.num_params:,} "
        f"parameters, precision {run.precision}; {len(paths)} paths interleaved, {args.rounds} rounds of "
        f"{args.warmup} warm-up + {args.steps} timed steps each. One training step's forward + backward: "
        f"{run.flops / 1e9:.1f} GFLOP ({run.flops / run.batch / 1e9:.2f} GFLOP per image, FlopCounterMode).",
        "",
        "| path | s / step | training images / s | TFLOP/s | vs plain loop (per-round range) | peak memory |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for path in paths:
        ratio, low, high = paired_ratio(path, plain)
        name = f"{path.name} ({path.note})" if path.note else path.name
        lines.append(
            f"| {name} | {path.step_seconds:.4f} | {run.batch / path.step_seconds:.1f} "
            f"| {run.flops / path.step_seconds / 1e12:.3g} | {ratio:.3f}x ({low:.3f}-{high:.3f}) "
            f"| {fmt_bytes(path.peak_bytes)} (+{fmt_bytes(path.peak_above_start)}) |"
        )
    memory = "CUDA max_memory_allocated" if run.device.type == "cuda" else "the process's peak RSS (VmHWM)"
    sample_s = statistics.median(run.sampling)
    lines += [
        "",
        f"Peak memory: {memory} while the path ran (+ above what was in use when it started: its steps' "
        "own memory; the models and data of all paths share the process). TFLOP/s: the counted FLOPs over "
        "the step time (the diffusers UNet has the same layers).",
        "",
        f"Sampling: DDIM-{args.sampling_steps}, batch {run.batch}, per-sample seeds: {sample_s:.2f} s per "
        f"batch, **{run.batch / sample_s:.1f} images / s**.",
    ]
    if args.peak_tflops:
        achieved = run.flops / project.step_seconds / 1e12
        lines += [
            "",
            f"FLOP utilisation of the project path: {achieved:.1f} of {args.peak_tflops:g} TFLOP/s = "
            f"**{achieved / args.peak_tflops:.1%}** of the peak given by --peak_tflops.",
        ]
    compiled = next((path for path in paths if path.name == COMPILED), None)
    if compiled is not None and len(compiled.walls) > 1:
        extra = compiled.walls[0] - statistics.median(compiled.walls[1:])
        saved = plain.step_seconds - compiled.step_seconds
        if saved > 0:
            pays_off = (
                f"saving {saved * 1000:.1f} ms a step, it pays for itself after {extra / saved:,.0f} steps"
            )
        else:
            pays_off = f"costing {-saved * 1000:.1f} ms more a step, it never pays off"
        lines += [
            "",
            f"Compiling: the compiled path's first round took {extra:.0f} s longer than its later ones (Dynamo "
            f"and Inductor at its first steps); {pays_off} (against the plain loop).",
        ]
    lines += ["", "| target | value | result |", "| --- | ---: | --- |"]
    tax = paired_ratio(project, plain)[0]
    lines.append(
        f"| framework tax: project / plain loop <= 1.03 | {tax:.3f} | {'PASS' if tax <= 1.03 else 'MISS'} |"
    )
    if peer is not None:
        vs = paired_ratio(project, peer)[0]
        lines.append(f"| project / diffusers <= 0.8 | {vs:.3f} | {'PASS' if vs <= 0.8 else 'MISS'} |")
    if run.job:
        base, here = (statistics.median(v) for v in run.job["seconds"].values())
        name = next(iter(run.job["seconds"]))
        whole = "" if args.job_steps else " to the end of each tree's own recipe"
        lines += [
            "",
            f"Default job, `train.py {' '.join(run.job['args'])}`{whole} (each a fresh process, alternating trees): "
            f"{name}: {base:.1f} s, this tree: {here:.1f} s, **{base / here:.2f}x faster** "
            f"(target 1.5x; each run: "
            + "; ".join(
                f"{tree} {', '.join(f'{x:.1f}' for x in xs)} s" for tree, xs in run.job["seconds"].items()
            )
            + ").",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
