"""Training and sampling throughput of a recipe, and what the framework costs against plain PyTorch loops.

    python benchmarks/speed/speed.py                           # the default recipe (digits), ~5 min on 2 CPU cores
    python benchmarks/speed/speed.py --config configs/cifar10.yaml --synthetic --peak_tflops 790   # on a GPU
    python benchmarks/speed/speed.py --baseline 82f9c05        # also the default job's wall time vs that commit
    python benchmarks/speed/speed.py --quick --out /tmp/speed  # plumbing check; numbers meaningless
    python benchmarks/speed/speed.py -- --model.compile_training true         # flags after `--`: the project path and train.py

Training paths on the same batches, interleaved in one process: round r runs each path for
`--warmup + --steps` optimizer steps (the order rotates every round). A path's step time is the median, over
all rounds, of the intervals between consecutive step starts after its warm-up (on CUDA, of 10-step chunks
closed by a synchronize). A ratio between two paths is the median of their per-round ratios: paired within a
round, so a machine that slows down for a while (other jobs) moves both sides of a ratio alike.

- project: the recipe as `python train.py` builds it (LightningCLI: config, flags, DiffusionModule, DataModule,
  the EMA callback, gradient clipping, Adam with warmup, precision) run by a Lightning Trainer with no
  validation, logger, checkpointing or progress bar.
- plain: the same DiffusionModule (a copy), batches and optimizer (configure_optimizers) in a hand-written
  loop: autocast/GradScaler as the precision asks, clip_grad_norm_, EMA by one torch._foreach_lerp_; eager, and
  with --compiled also with the network compiled as fitting compiles it (--quick: the eager backend).
- diffusers: diffusers' UNet2DModel built with the same widths, blocks and attention levels (so the same
  parameter count) in its own best loop: DDPMScheduler.add_noise, fused Adam with warmup, clipping,
  EMAModel(foreach=True), its attention through SDPA, the same precision: the loop of diffusers'
  train_unconditional example without accelerate, eager. When it cannot be built (diffusers missing: `pip install
  -e ".[bench]"`, or failing to import) the table says why.

In order (what the targets are about first, so that a run ended early has it): `python train.py` as users run it
(progress bar, logger, checkpoints, the recipe's strategy and data path) in a process of its own, timed by its
StepTimer callback (diffusion/training/callbacks/step_timer.py); the interleaved paths; `train.py` with each
`--train_py FLAGS` variant (one whose flags train.py does not accept is skipped with a note); the recipe's data
path alone (images/s with its workers and transforms; with --synthetic, random pixels in torchvision's CIFAR10,
speed_data.py); sampling images/s of each `--samplers` entry under each `--sampling_precisions`, with the time
50,000 samples would take (with --sampling_compile also compiled: the samplers' `compile` option, one graph for the
whole loop, CUDA graphs on CUDA; the first batch, which compiles, is reported apart; --quick: always, eager backend). Peak memory per path: CUDA max_memory_allocated; CPU the process's peak RSS (VmHWM,
reset per path through /proc/self/clear_refs; it includes what the other paths keep resident).

Results go to benchmarks/results/speed.md (OUT/speed.md with --out, and always with --quick; OUT/speed.json too),
written again after each measurement: a run ended early keeps what it measured.
"""

import argparse
import contextlib
import itertools
import logging
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import get_args

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

from benchmarks.arguments import existing, list_of
from benchmarks.speed.speed_data import recipe_data_throughput
from benchmarks.speed.speed_jobs import compare_jobs
from benchmarks.speed.speed_paths import (
    Timed,
    build_project,
    diffusers_path,
    interleave,
    plain_path,
    profiled,
    project_path,
    sampling_seconds,
)
from benchmarks.speed.speed_report import (
    COMPILED,
    COMPILED_CHANNELS_LAST,
    COMPILED_PLAINLY,
    PEER,
    PLAIN,
    PROJECT,
)
from benchmarks.speed.speed_run import Run, output_folder, save, time_train_py
from diffusion.core.compiling import compiling_with
from diffusion.core.sampling import SAMPLERS, SamplingOptions
from diffusion.generation.precision import Precision
from diffusion.models import UNet
from diffusion.training.callbacks.step_timer import (
    count_flops_per_sample,
    device_name,
)
from diffusion.training.optim import use_tf32_on_cuda

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import TINY_UNET  # noqa: E402 (the tiny network --quick shares with the tests)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = shlex.join(["python", "benchmarks/speed/speed.py", *argv])  # as typed: "" stays ""
    cli_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="a recipe (default: configs/digits.yaml, as train.py)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds of every path")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per path and round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them, every round")
    parser.add_argument("--accelerator", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--synthetic", action="store_true", help="random images of the recipe's shape")
    parser.add_argument("--no_project", action="store_true", help="skip the in-process Lightning path")
    parser.add_argument("--no_diffusers", action="store_true", help="skip the diffusers path")
    parser.add_argument(
        "--compiled", action="store_true",
        help="also the plain loop with the network compiled as fitting compiles it, and its compile time",
    )  # fmt: skip
    parser.add_argument(
        "--train_py", action="append", default=[], metavar="FLAGS",
        help="also time `train.py <recipe> FLAGS` (repeatable; '' is the recipe as it is, always run)",
    )  # fmt: skip
    parser.add_argument(
        "--compiled_plainly", action="store_true",
        help="also the plain loop with only network.compile() (default mode: no CUDA graphs, Inductor's layout)",
    )  # fmt: skip
    parser.add_argument(
        "--compiled_channels_last", action="store_true",
        help="also the plain loop compiled as fitting compiles it with --model.compile_channels_last true (NHWC)",
    )  # fmt: skip
    parser.add_argument(
        "--profile_steps", type=int, default=0,
        help="profile this many more steps of train.py and of each plain loop: GPU busy share, kernel kinds (CUDA)",
    )  # fmt: skip
    parser.add_argument(
        "--cold_compile", action="store_true",
        help="time the recipe's train.py twice over an empty compile cache: cold, then warm (compile seconds)",
    )  # fmt: skip
    parser.add_argument("--no_train_py", action="store_true", help="time no train.py process")
    parser.add_argument("--train_py_warmup", type=int, default=10, help="StepTimer warm-up steps")
    parser.add_argument("--train_py_steps", type=int, default=100, help="StepTimer timed steps")
    parser.add_argument(
        "--loader_batches", type=int, default=100, help="batches of the data path measure (0: none)"
    )
    parser.add_argument(
        "--samplers", nargs="*", default=["ddim:50", "dpmpp_2m_sde:20"], help="sampler:steps,... to time (empty: none)",
        action=list_of(sampler_steps, "ddim:50,dpmpp_2m_sde:20", SAMPLERS, "SAMPLER:STEPS", empty=True),
    )  # fmt: skip
    parser.add_argument(
        "--sampling_precisions", nargs="+", default=["32"], help="e.g. 32,bf16-mixed",
        action=list_of(str, "32,bf16-mixed", get_args(Precision)),
    )  # fmt: skip
    parser.add_argument(
        "--sampling_compile", action="store_true",
        help="also time each sampler compiled (its compile option: one graph for the loop, CUDA graphs on CUDA)",
    )  # fmt: skip
    parser.add_argument("--sampling_batch", type=int, help="samples per batch (default: the training batch)")
    parser.add_argument("--sampling_repeats", type=int, default=3, help="timed batches after the first")
    parser.add_argument("--baseline", help="a git revision: also time the default job from it and from here")
    parser.add_argument(
        "--job_steps", type=int, default=500,
        help="steps of each timed job (--baseline); 0: each tree's whole default job, its own max_steps",
    )  # fmt: skip
    parser.add_argument("--job_rounds", type=int, default=2, help="interleaved jobs per tree (--baseline)")
    parser.add_argument("--peak_tflops", type=float, help="the device's peak (790: bf16 measured on an H200)")
    parser.add_argument("--goal_images_per_s", type=float, help="training target (data path: twice it)")
    parser.add_argument("--quick", action="store_true", help="tiny UNet and few steps: plumbing only")
    parser.add_argument("--out", type=Path, help="write speed.md here (default with --quick: a temp dir)")
    args = parser.parse_args(argv)
    args.command = command
    args.compile_backend = None  # torch.compile's default, Inductor
    if args.quick:
        args.rounds, args.steps, args.warmup, args.train_py_warmup, args.train_py_steps = 2, 2, 1, 1, 2
        args.job_steps, args.job_rounds, args.loader_batches = 4, 1, min(args.loader_batches, 3)
        args.samplers = [f"{entry.split(':')[0]}:3" for entry in args.samplers]
        args.compile_backend = "eager"  # Dynamo traces as usual; Inductor would take minutes on a CPU
        args.sampling_compile = True
        cli_args = [*TINY_UNET, *cli_args]
        args.out = args.out or Path(tempfile.mkdtemp(prefix="speed_quick_"))
    if (
        min(args.rounds, args.steps, args.train_py_steps, args.sampling_repeats) < 1
        or min(args.warmup, args.train_py_warmup, args.profile_steps) < 0
    ):
        parser.error(
            "--rounds, --steps and --sampling_repeats must be >= 1, --warmup and --profile_steps >= 0"
        )
    if args.config:
        existing(parser, "--config", Path(args.config), "a recipe, e.g. configs/digits.yaml")
        cli_args = ["--config", args.config, *cli_args]
    return args, cli_args


def sampler_steps(text: str) -> str:
    """A --samplers item, SAMPLER:STEPS with STEPS >= 1 (the sampler's name is checked against the registry)."""
    _, _, steps = text.partition(":")
    if not steps.isdigit() or int(steps) < 1:
        raise ValueError(text)
    return text


def main(argv: list[str] | None = None) -> str:
    args, cli_args = parse_args(argv)
    with lightning_banners_off():
        return measure(args, cli_args)


@contextlib.contextmanager
def lightning_banners_off():
    """One Trainer per round: keep their banners out. The levels are given back: tests call main() in-process,
    and a later test there reading Lightning's INFO lines (caplog) would see none."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def measure(args: argparse.Namespace, cli_args: list[str]) -> str:
    if args.threads:
        torch.set_num_threads(args.threads)
    accelerator = args.accelerator
    if accelerator == "auto":
        accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(accelerator)
    use_tf32_on_cuda(device)  # as DiffusionModule.setup does for training
    cli = build_project([*cli_args, "--trainer.accelerator", accelerator], args.synthetic)
    batch, network = cli.datamodule.batch_size, cli.model.to(device).network
    run = Run(args, cli_args, str(cli.trainer.precision), device, batch, tuple(cli.model.sample_shape))
    run.num_params = sum(p.numel() for p in network.parameters())
    run.flops = round(
        (count_flops_per_sample(cli.model) or 0) * batch
    )  # a meta copy: before anything compiles
    # What the targets are about first (train.py as the recipe is, then the loops it is held against), so that a
    # run ended early has those; the train.py variants, for the record, after them.
    variants = [] if args.no_train_py else ["", *(flags for flags in args.train_py if flags.strip())]
    time_train_py(run, accelerator, variants[:1])
    if not args.no_project:
        run.paths.append(Timed(PROJECT, project_path(cli, device, args.warmup)))
    run.paths.append(Timed(PLAIN, plain_path(cli, device, args.warmup)))
    if args.compiled:
        compiled = plain_path(cli, device, args.warmup, compile=True, backend=args.compile_backend)
        note = f"torch.compile, {args.compile_backend or 'default'} backend, as fitting compiles it"
        run.paths.append(Timed(COMPILED, compiled, note=note))
    if args.compiled_channels_last:
        compiled = plain_path(cli, device, args.warmup, compile="channels_last", backend=args.compile_backend)
        run.paths.append(Timed(COMPILED_CHANNELS_LAST, compiled, note="--model.compile_channels_last true"))
    if args.compiled_plainly:
        compiled = plain_path(cli, device, args.warmup, compile="plainly", backend=args.compile_backend)
        note = "network.compile() alone: default mode, no CUDA graphs"
        run.paths.append(Timed(COMPILED_PLAINLY, compiled, note=note))
    if not args.no_diffusers and isinstance(network, UNet):
        try:
            train, note = diffusers_path(cli, device, args.warmup)
            run.paths.append(Timed(PEER, train, note=note))
        except Exception as error:  # a peer that cannot be built (or imported) is reported, not fatal
            problem = f"{PEER}: not run, {type(error).__name__}: {error}"
            print(problem, flush=True)
            run.problems.append(problem.replace("|", "/"))
    print(f"{len(run.paths)} paths x {args.rounds} rounds x ({args.warmup} warm-up + {args.steps} timed "
          f"steps), batch {batch}, {run.num_params:,} parameters, on {device_name(device)}", flush=True)  # fmt: skip
    interleave(run.paths, args.rounds, args.steps, device)
    save(run)
    if args.profile_steps:
        for path in run.paths:
            path.profile = profiled(path.run, args.profile_steps, args.warmup, device)
        save(run)
    time_train_py(run, accelerator, variants[1:])
    if args.loader_batches:
        run.loader = recipe_data_throughput(cli, run.device, args.loader_batches, args.synthetic)
        if run.loader is None:
            print("  data path: not measured (--synthetic on a recipe other than CIFAR-10)", flush=True)
        else:
            print(f"  data path: {run.loader['images_per_s']:,.0f} images/s", flush=True)
        save(run)
    for entry in args.samplers:
        sampler, steps = entry.split(":")
        for precision, compile in itertools.product(
            args.sampling_precisions,
            (False, True) if args.sampling_compile else (False,),
        ):
            size = args.sampling_batch or batch
            options = SamplingOptions(sampler=sampler, steps=int(steps), compile=compile)
            with compiling_with(args.compile_backend) if args.compile_backend else contextlib.nullcontext():
                first, seconds = sampling_seconds(
                    cli.model, device, size, options, precision, repeats=args.sampling_repeats
                )
            evaluations = SAMPLERS[sampler].evaluations(int(steps))
            run.sampling.append(
                {"sampler": sampler, "steps": int(steps), "evaluations": evaluations, "precision": precision,
                 "batch": size, "compile": compile, "first_seconds": first, "seconds": seconds}
            )  # fmt: skip
            print(
                f"  sampling {entry}{' compiled' if compile else ''} {precision}: "
                f"{size / statistics.median(seconds):,.1f} images/s (first batch {first:.2f} s)",
                flush=True,
            )
            save(run)
    if args.baseline:
        run.job = compare_jobs(args.baseline, cli_args, args.job_steps, args.job_rounds, args.threads)
    table = save(run)
    print("\n" + table + f"\nwritten to {output_folder(run) / 'speed.md'}")
    PROBLEMS[:] = run.problems
    return table


PROBLEMS: list[str] = []  # of the last main(): a path that failed or could not run


if __name__ == "__main__":
    main()
    sys.exit(1 if PROBLEMS else 0)  # the table is written; a suite's stage still says FAILED
