"""Training and sampling throughput of a recipe, and what the framework costs against plain PyTorch loops.

    python benchmarks/speed.py                                 # the default recipe (digits), ~5 min on 2 CPU cores
    python benchmarks/speed.py --config configs/cifar10.yaml   # the same on a GPU (batch 128, its precision)
    python benchmarks/speed.py --baseline 82f9c05              # also the default job's wall time vs that commit
    python benchmarks/speed.py --quick --out /tmp/speed        # plumbing check in seconds; numbers meaningless
    python benchmarks/speed.py -- --model.compile true         # train.py flags after `--` (project and plain)

Three training paths on the same batches, interleaved in one process: round r runs each path for
`--warmup + --steps` optimizer steps (the order rotates every round), and a path's step time is the median,
over all rounds, of the intervals between consecutive step starts after its warm-up (on CUDA, of 10-step
chunks closed by a synchronize):

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
import copy
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from diffusion.callbacks import EMA
from diffusion.cli import DiffusionCLI, with_default_config
from diffusion.data import IndexedDataset, SplitDataModule
from diffusion.models import UNet
from diffusion.models.unet import AttnBlock
from diffusion.module import use_tf32_on_cuda

ROOT = Path(__file__).resolve().parents[1]
TINY_UNET = [
    "--model.network.init_args.channels", "8", "--model.network.init_args.channel_mult", "[1, 2]",
    "--model.network.init_args.num_res_blocks", "1", "--model.network.init_args.attention_levels", "[1]",
]  # fmt: skip
# What the timed Trainer leaves out: everything that is not a training step.
QUIET = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]


@dataclass
class Timed:
    """A training path and what was measured of it."""

    name: str
    run: Callable[[int], list[float]]  # timed steps -> seconds of each (after the warm-up steps)
    batch_size: int
    note: str = ""
    times: list[float] = field(default_factory=list)  # every timed step of every round
    rounds: list[float] = field(default_factory=list)  # the median of each round
    peak_bytes: int = 0
    peak_above_start: int = 0  # the step's own working memory: activations, gradients, temporaries

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.times)


# ---- timing and memory --------------------------------------------------------------------------------
class StepClock:
    """Step-start timestamps; on CUDA one synchronize per `chunk` steps, so the queue is not drained per step."""

    def __init__(self, device: torch.device, warmup: int) -> None:
        self.cuda = device.type == "cuda"
        self.chunk = 10 if self.cuda else 1
        self.warmup = warmup
        self.marks: list[tuple[int, float]] = []
        self.steps = 0

    def tick(self) -> None:
        if self.steps >= self.warmup and (self.steps - self.warmup) % self.chunk == 0:
            if self.cuda:
                torch.cuda.synchronize()
            self.marks.append((self.steps, time.perf_counter()))
        self.steps += 1

    def per_step(self) -> list[float]:
        return [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(self.marks, self.marks[1:], strict=False)]


class ClockCallback(L.Callback):
    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.clock.tick()

    def on_train_end(self, trainer, pl_module) -> None:
        self.clock.tick()  # closes the last step


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


def precision_context(precision: str, device: torch.device) -> tuple[Callable, torch.amp.GradScaler | None]:
    """autocast and GradScaler as Lightning's precision plugin sets them up (16-mixed on CPU runs as bf16)."""
    if "mixed" not in precision:
        return contextlib.nullcontext, None
    dtype = torch.float16 if precision.startswith("16") and device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    return (lambda: torch.autocast(device.type, dtype=dtype)), scaler


def cycle(loader) -> Iterator:
    while True:
        yield from loader


def to_device(batch, device: torch.device):
    return [x.to(device, non_blocking=True) for x in batch]


# ---- the three paths ----------------------------------------------------------------------------------
def build_project(cli_args: list[str], synthetic: bool) -> DiffusionCLI:
    saved, sys.argv[1:] = sys.argv[1:], []  # LightningCLI warns when args come with a command line of its own
    try:
        cli = DiffusionCLI(with_default_config([*cli_args, *QUIET]))
    finally:
        sys.argv[1:] = saved
    if synthetic:
        data = cli.datamodule
        cli.datamodule = SyntheticImages(cli.model.sample_shape, data.batch_size, data.num_workers)
    return cli


class SyntheticImages(SplitDataModule):
    """Uniform noise in [-1, 1] of the recipe's shape: for machines that cannot download the recipe's data."""

    def __init__(self, sample_shape: tuple[int, ...], batch_size: int, num_workers: int, num_samples=10_000):
        super().__init__(batch_size, num_workers, val_fraction=0.0, seed=0)
        self.sample_shape, self.num_samples = tuple(sample_shape), num_samples

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            generator = torch.Generator().manual_seed(0)
            images = torch.rand((self.num_samples, *self.sample_shape), generator=generator) * 2 - 1
            self._split(IndexedDataset(TensorDataset(images)))


def recipe_ema(cli: DiffusionCLI) -> EMA:
    return next(c for c in cli.trainer.callbacks if isinstance(c, EMA))


def project_path(cli: DiffusionCLI, device: torch.device, warmup: int) -> Callable[[int], list[float]]:
    """The recipe's module, data and callbacks, a fresh Trainer per round (the same module keeps training)."""
    module, data, trainer, ema = cli.model, cli.datamodule, cli.trainer, recipe_ema(cli)

    def run(steps: int) -> list[float]:
        clock = StepClock(device, warmup)
        fresh = L.Trainer(
            accelerator=device.type, devices=1, precision=trainer.precision,
            gradient_clip_val=trainer.gradient_clip_val, max_steps=warmup + steps,
            limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
            callbacks=[EMA(ema.decay, ema.warmup, ema.update_every_n_steps), ClockCallback(clock)],
        )  # fmt: skip
        fresh.fit(module, data)
        return clock.per_step()

    return run


def plain_path(cli: DiffusionCLI, device: torch.device, warmup: int) -> Callable[[int], list[float]]:
    """The same DiffusionModule (a copy), data and optimizer in a hand-written loop."""
    module = copy.deepcopy(cli.model).to(device)
    if module.hparams.get("compile"):
        module.network.compile()
    module.on_fit_start()  # the rank's noise generator
    params = list(module.parameters())
    ema_params = [p.detach().clone() for p in params]
    decay, clip = recipe_ema(cli).decay, cli.trainer.gradient_clip_val
    autocast, scaler = precision_context(str(cli.trainer.precision), device)
    per_sample = module.hparams.noise_mode == "per_sample"
    cli.datamodule.setup("fit")
    batches = cycle(cli.datamodule.train_dataloader())
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    updates = 0

    def run(steps: int) -> list[float]:
        nonlocal updates
        clock = StepClock(device, warmup)
        module.train()
        for _ in range(warmup + steps):
            clock.tick()
            x0, indices = to_device(next(batches), device)
            with autocast():
                noise, t = module.draw_noise_and_timesteps(x0, indices, updates, per_sample)
                loss = module.per_sample_loss(x0, noise, t).mean()
            optimizer_step(loss, optimizer, scaler, params, clip)
            scheduler.step()
            with torch.no_grad():
                torch._foreach_lerp_(ema_params, params, 1 - min(decay, (1 + updates) / (10 + updates)))
            updates += 1
        clock.tick()
        return clock.per_step()

    return run


def optimizer_step(loss, optimizer, scaler, params, clip: float | None) -> None:
    """backward, unscale, clip, step, zero_grad: Lightning's order."""
    (scaler.scale(loss) if scaler else loss).backward()
    if scaler:
        scaler.unscale_(optimizer)
    if clip:
        torch.nn.utils.clip_grad_norm_(params, clip)
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def diffusers_config(network: UNet) -> dict:
    """UNet2DModel arguments for the architecture of this project's UNet (both are Ho et al.'s), read off
    the built network."""
    channels = network.channels
    widths = [stage.blocks[-1].conv1.out_channels for stage in network.down]
    attention = [isinstance(stage.attns[0], AttnBlock) for stage in network.down]
    down = ["AttnDownBlock2D" if attn else "DownBlock2D" for attn in attention]
    resblock = network.down[0].blocks[0]
    heads = network.mid_attn.num_heads
    return {
        "in_channels": network.in_channels, "out_channels": network.conv_out.out_channels,
        "block_out_channels": tuple(widths), "layers_per_block": len(network.down[0].blocks),
        "down_block_types": tuple(down), "up_block_types": tuple(b.replace("Down", "Up") for b in reversed(down)),
        "norm_num_groups": min(32, channels), "dropout": resblock.dropout.p,
        "attention_head_dim": None if heads == 1 else widths[-1] // heads,
    }  # fmt: skip


def diffusers_path(cli: DiffusionCLI, device: torch.device, warmup: int) -> tuple[Callable, str]:
    from diffusers import DDPMScheduler, UNet2DModel
    from diffusers.training_utils import EMAModel

    module, hp = cli.model, cli.model.hparams
    model = UNet2DModel(**diffusers_config(module.network)).to(device)
    ours = sum(p.numel() for p in module.network.parameters())
    theirs = sum(p.numel() for p in model.parameters())
    if abs(theirs - ours) > 0.01 * ours:
        raise RuntimeError(f"UNet2DModel has {theirs:,} parameters, this project's UNet {ours:,}")
    if hp.get("compile"):
        model.compile()
    schedule = DDPMScheduler(
        num_train_timesteps=hp.num_timesteps, beta_schedule="linear", beta_start=hp.beta_start,
        beta_end=hp.beta_end,
    )  # fmt: skip
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=hp.lr, betas=hp.adam_betas)
    warm = max(hp.warmup_steps, 1)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warm))
    ema = EMAModel(params, decay=recipe_ema(cli).decay, foreach=True)
    clip = cli.trainer.gradient_clip_val
    autocast, scaler = precision_context(str(cli.trainer.precision), device)
    batches = cycle(cli.datamodule.train_dataloader())

    def run(steps: int) -> list[float]:
        clock = StepClock(device, warmup)
        model.train()
        for _ in range(warmup + steps):
            clock.tick()
            x0 = next(batches)[0].to(device, non_blocking=True)
            noise = torch.randn_like(x0)
            t = torch.randint(0, hp.num_timesteps, (x0.shape[0],), device=device)
            noisy = schedule.add_noise(x0, noise, t)
            with autocast():
                loss = F.mse_loss(model(noisy, t).sample.float(), noise)
            optimizer_step(loss, optimizer, scaler, params, clip)
            lr_scheduler.step()
            ema.step(params)
        clock.tick()
        return clock.per_step()

    return run, f"UNet2DModel, {theirs:,} parameters"


# ---- sampling and the whole job -------------------------------------------------------------------------
def sampling_seconds(module, device: torch.device, batch: int, steps: int, repeats: int) -> list[float]:
    """Seconds per batch of DDIM-`steps` with per-sample seeds, after one short warm-up call."""
    module.to(device)
    module.sample(batch, seed=0, sampler="ddim", steps=2)
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        module.sample(batch, seed=0, sampler="ddim", steps=steps)
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
            times = path.run(steps)
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
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every path")
    parser.add_argument("--steps", type=int, default=60, help="timed optimizer steps per path and round")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before them, every round")
    parser.add_argument("--sampling_steps", type=int, default=50, help="DDIM steps of the sampling measure")
    parser.add_argument("--accelerator", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--synthetic", action="store_true", help="random images of the recipe's shape")
    parser.add_argument("--no_diffusers", action="store_true", help="skip the diffusers path")
    parser.add_argument("--baseline", help="a git revision: also time the default job from it and from here")
    parser.add_argument("--job_steps", type=int, default=500, help="steps of each timed job (--baseline)")
    parser.add_argument("--job_rounds", type=int, default=2, help="interleaved jobs per tree (--baseline)")
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
    batch = cli.datamodule.batch_size
    num_params = sum(p.numel() for p in cli.model.network.parameters())
    paths = [
        Timed("project: Lightning Trainer + EMA callback", project_path(cli, device, args.warmup), batch),
        Timed("plain loop, same module", plain_path(cli, device, args.warmup), batch),
    ]
    if not args.no_diffusers and isinstance(cli.model.network, UNet):
        try:
            run, note = diffusers_path(cli, device, args.warmup)
            paths.append(Timed("diffusers UNet2DModel, plain loop", run, batch, note=note))
        except ImportError:
            print("diffusers is not installed (pip install -e '.[bench]'): no diffusers path", flush=True)
    print(f"{len(paths)} paths x {args.rounds} rounds x ({args.warmup} warm-up + {args.steps} timed steps), "
          f"batch {batch}, {num_params:,} parameters, on {device_name(device)}", flush=True)  # fmt: skip
    interleave(paths, args.rounds, args.steps, device)
    sampling = sampling_seconds(cli.model, device, batch, args.sampling_steps, repeats=3)
    job = compare_jobs(args, cli_args) if args.baseline else None
    table = markdown(args, cli_args, cli, device, paths, sampling, job, num_params)
    out = args.out or ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.md").write_text(table)
    print("\n" + table + f"\nwritten to {out / 'speed.md'}")
    return table


def compare_jobs(args: argparse.Namespace, cli_args: list[str]) -> dict:
    """The default job (`python train.py` + the flags after --), cut to --job_steps (default: one validation
    interval of the digits recipe, with its validation and sample grid), from --baseline and from here,
    alternating; returns the wall times."""
    job_args = [*cli_args, "--max_steps", str(args.job_steps)]
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


def markdown(args, cli_args, cli, device, paths: list[Timed], sampling, job, num_params: int) -> str:
    plain = next(p for p in paths if p.name.startswith("plain"))
    peer = next((p for p in paths if p.name.startswith("diffusers")), None)
    project = paths[0]
    quick = (
        " QUICK MODE (tiny UNet, a few steps): plumbing only, the numbers mean nothing" if args.quick else ""
    )
    lines = [
        f"## Training and sampling speed ({time.strftime('%Y-%m-%d')}, {device_name(device)}, "
        f"torch {torch.__version__}){quick}",
        "",
        f"`{args.command}`",
        "",
        f"Recipe: `train.py {' '.join(cli_args) or '(configs/digits.yaml)'}`; batch {project.batch_size}, "
        f"{num_params:,} parameters, precision {cli.trainer.precision}; {len(paths)} paths interleaved, "
        f"{args.rounds} rounds of {args.warmup} warm-up + {args.steps} timed steps each; medians.",
        "",
        "| path | s / step | training images / s | vs plain loop | per-round ratio to plain | peak memory |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for path in paths:
        ratio = path.step_seconds / plain.step_seconds
        per_round = ", ".join(f"{a / b:.3f}" for a, b in zip(path.rounds, plain.rounds, strict=True))
        name = f"{path.name} ({path.note})" if path.note else path.name
        lines.append(
            f"| {name} | {path.step_seconds:.4f} | {path.batch_size / path.step_seconds:.1f} | {ratio:.3f}x "
            f"| {per_round} | {fmt_bytes(path.peak_bytes)} (+{fmt_bytes(path.peak_above_start)}) |"
        )
    memory = "CUDA max_memory_allocated" if device.type == "cuda" else "the process's peak RSS (VmHWM)"
    lines += [
        "",
        f"Peak memory: {memory} while the path ran (+ above what was in use when it started: its steps' "
        "own memory; the models and data of all paths share the process).",
    ]
    sample_s = statistics.median(sampling)
    lines += [
        "",
        f"Sampling: DDIM-{args.sampling_steps}, batch {project.batch_size}, per-sample seeds: "
        f"{sample_s:.2f} s per batch, **{project.batch_size / sample_s:.1f} images / s**.",
        "",
        "| target | value | result |",
        "| --- | ---: | --- |",
    ]
    tax = project.step_seconds / plain.step_seconds
    lines.append(
        f"| framework tax: project / plain loop <= 1.03 | {tax:.3f} | {'PASS' if tax <= 1.03 else 'MISS'} |"
    )
    if peer is not None:
        vs = project.step_seconds / peer.step_seconds
        lines.append(f"| project / diffusers <= 0.8 | {vs:.3f} | {'PASS' if vs <= 0.8 else 'MISS'} |")
    if job:
        base, here = (statistics.median(v) for v in job["seconds"].values())
        name = next(iter(job["seconds"]))
        lines += [
            "",
            f"Default job, `train.py {' '.join(job['args'])}` (each a fresh process, alternating trees): "
            f"{name}: {base:.1f} s, this tree: {here:.1f} s, **{base / here:.2f}x faster** "
            f"(target 1.5x; runs: {job['seconds']}).",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
