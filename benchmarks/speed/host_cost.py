"""What a training step costs the host when the network costs nothing: `train.py`'s Lightning path against a
plain loop over the same module, and where the difference goes.

On a GPU the host queues a step's kernels while the device runs the previous ones; the host's own work per step
(Lightning's loops, hooks, callbacks, logging, the data path) caps the step rate only when it takes longer than
the device's step. A network that costs nothing (one scale parameter) makes the host's work the whole step, so
its milliseconds can be read on any machine:

    python benchmarks/speed/host_cost.py               # the digits recipe's objects, 300 steps a path, 3 rounds
    python benchmarks/speed/host_cost.py --profile 15  # + the 15 heaviest functions of the Lightning path
    python benchmarks/speed/host_cost.py -- --data.init_args.on_device false    # train.py flags after `--`

Paths, interleaved by round (A B, B A, ...): `train.py` (the recipe's Trainer, callbacks, progress bar and
logger, as users run it, validation and checkpoints out of the timed window) and the plain loop (the same
module, batches from the same data module, Adam, clipping, an EMA lerp: what any training loop must do).
"""

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import lightning as L
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

from benchmarks.speed.speed_paths import optimizer_step
from diffusion.cli.train import DiffusionCLI, with_default_config


class CostlessNetwork(nn.Module):
    """`model(x_t, t) -> x_t * scale`: one parameter, a network with no cost, so a step is all host work."""

    def __init__(self, in_channels: int = 1, out_channels: int | None = None, num_classes: int | None = None):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor, t: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return x * self.scale


class StepStamps(L.Callback):
    """A timestamp at every training batch's start: per-step seconds, steps with a validation left out."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.stamps.append(time.perf_counter())

    def per_step(self, warmup: int) -> list[float]:
        return [b - a for a, b in zip(self.stamps[warmup:], self.stamps[warmup + 1 :], strict=False)]


def build(flags: list[str], steps: int, save_dir: str) -> DiffusionCLI:
    saved, sys.argv[1:] = sys.argv[1:], []
    try:
        return DiffusionCLI(
            with_default_config(
                [
                    "--model.network.class_path", "host_cost.CostlessNetwork",
                    "--max_steps", str(steps), "--trainer.val_check_interval", str(steps),
                    "--trainer.logger.init_args.save_dir", save_dir, *flags,
                ]
            )
        )  # fmt: skip
    finally:
        sys.argv[1:] = saved


def lightning_round(flags: list[str], steps: int, warmup: int, save_dir: str, profile: bool):
    cli = build(flags, warmup + steps + 1, save_dir)
    stamps = StepStamps()
    cli.trainer.callbacks.append(stamps)
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    cli.trainer.fit(cli.model, cli.datamodule)
    if profiler:
        profiler.disable()
    return stamps.per_step(warmup)[:steps], profiler


def plain_round(flags: list[str], steps: int, warmup: int, save_dir: str) -> list[float]:
    cli = build(flags, warmup + steps + 1, save_dir)
    module, data = cli.model, cli.datamodule
    data.setup("fit")
    batches = iter(data.train_dataloader())
    module.on_fit_start()
    params = list(module.parameters())
    ema = [p.detach().clone() for p in params]
    module.hparams.lr_schedule = "constant"  # no Trainer, no max_steps to decay to; the cost is the same
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    stamps = []
    for step in range(warmup + steps + 1):
        stamps.append(time.perf_counter())
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(data.train_dataloader())
            batch = next(batches)
        # data held on the device: the indices become a Batch there
        batch = data.on_after_batch_transfer(batch, 0)
        x0, index = batch[0], batch[1]
        noise, t = module.draw_noise_and_timesteps(x0, index, step, per_sample=False)
        loss = module.per_sample_loss(x0, noise, t).mean()
        optimizer_step(loss, optimizer, None, params, 1.0)
        scheduler.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema, params, 0.001)
    return [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1 :], strict=False)][:steps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="timed steps per path and round")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--profile", type=int, default=0, help="print this many heaviest functions (Lightning)"
    )
    parser.add_argument("--save_dir", default="/tmp/host_cost_runs")
    parser.add_argument("flags", nargs="*", help="train.py flags, after --")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the host's own work is single-threaded; steadier figures on a busy machine
    Path(args.save_dir).mkdir(parents=True, exist_ok=True)
    os.chdir(args.save_dir)  # runs without a logger write into the working directory
    times: dict[str, list[float]] = {"train.py": [], "plain loop": []}
    ratios = []
    profiler = None
    for round_ in range(args.rounds):
        order = ["train.py", "plain loop"] if round_ % 2 == 0 else ["plain loop", "train.py"]
        medians = {}
        for path in order:
            if path == "train.py":
                last = round_ == args.rounds - 1 and args.profile > 0
                per_step, prof = lightning_round(args.flags, args.steps, args.warmup, args.save_dir, last)
                profiler = prof or profiler
            else:
                per_step = plain_round(args.flags, args.steps, args.warmup, args.save_dir)
            medians[path] = statistics.median(per_step)
            times[path].append(medians[path])
        ratios.append(medians["train.py"] / medians["plain loop"])
    print("\n| path | host ms per step (median of rounds) |\n| --- | ---: |")
    for path, values in times.items():
        print(f"| {path} | {1000 * statistics.median(values):.2f} |")
    print(f"| train.py / plain loop | {statistics.median(ratios):.2f}x |")
    if profiler is not None:
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(args.profile)
        print(stream.getvalue())
        profiler.dump_stats(Path(args.save_dir) / "train_py.prof")


if __name__ == "__main__":
    main()
