"""The training paths that benchmarks/speed/speed.py times: the project's (Lightning), a plain loop over the same
module, and diffusers' UNet2DModel in its plain loop. Each path is built once and returns `run(steps)`, which
trains `warmup + steps` more steps and returns the seconds of each timed one. `interleave` times the paths in
rotating rounds (`Timed` holds what it measured of each), `profiled` profiles more steps of one, and
`sampling_seconds` times a sampler."""

import contextlib
import copy
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from diffusion.cli.train import DiffusionCLI, with_default_config
from diffusion.core.compiling import compiling_with
from diffusion.core.sampling import SamplingOptions
from diffusion.data.on_device import HeldSamples
from diffusion.data.split import IndexedDataset, SplitDataModule
from diffusion.generation.precision import network_precision
from diffusion.models import UNet
from diffusion.models.unet import AttnBlock
from diffusion.training.callbacks import EMA
from diffusion.training.callbacks.step_timer import KernelProfile, peak_memory, reset_peak_memory

# What the timed Trainer leaves out: everything that is not a training step.
QUIET = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]


# ---- timing and memory --------------------------------------------------------------------------------
class StepClock:
    """Step-start timestamps; on CUDA one synchronize per `chunk` steps, so the queue is not drained per step."""

    def __init__(self, device: torch.device, warmup: int, steps: int) -> None:
        self.cuda = device.type == "cuda"
        # Fewer timed steps than a chunk: one chunk of them all.
        self.chunk = min(10, steps) if self.cuda else 1
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
    profile: dict | None = None  # KernelProfile's summary (--profile_steps, CUDA)

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.times)


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


def profiled(run: Callable[[int], list[float]], steps: int, warmup: int, device: torch.device) -> dict | None:
    """Where `steps` more steps of a path (and its `warmup` ones) spend the device's time (`KernelProfile`)."""
    profile = KernelProfile(device)
    profile.start()
    run(steps)
    return profile.stop(warmup + steps)


def sampling_seconds(
    module, device: torch.device, batch: int, options: SamplingOptions, precision: str, repeats: int
) -> tuple[float, list[float]]:
    """(seconds of the first batch, seconds per batch after it) of the sampler `options` name, with per-sample
    seeds under `precision` (as the sample CLI's --precision); the first batch warms up (and compiles)."""
    module.to(device)
    seconds = []
    with network_precision(module, precision):
        for _ in range(1 + repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            module.sample(batch, seed=0, options=options)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
    return seconds[0], seconds[1:]


def precision_context(precision: str, device: torch.device) -> tuple[Callable, torch.amp.GradScaler | None]:
    """autocast and GradScaler as Lightning's precision plugin sets them up (16-mixed on CPU runs as bf16)."""
    if "mixed" not in precision:
        return contextlib.nullcontext, None
    dtype = torch.float16 if precision.startswith("16") and device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    return (lambda: torch.autocast(device.type, dtype=dtype)), scaler


def endless_batches(datamodule: SplitDataModule, device: torch.device) -> Iterator:
    """Training batches on `device` as the Trainer hands them to training_step, epoch after epoch (on the
    device path: gathered there)."""
    while True:
        yield from datamodule.training_batches(device)


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

    def _held_samples(self) -> HeldSamples:
        return HeldSamples(
            self.train_set.dataset.base.tensors[0], None, random_flip=False, uint8_images=False
        )


def recipe_ema(cli: DiffusionCLI) -> EMA:
    return next(c for c in cli.trainer.callbacks if isinstance(c, EMA))


def project_path(cli: DiffusionCLI, device: torch.device, warmup: int) -> Callable[[int], list[float]]:
    """The recipe's module, data and callbacks, a fresh Trainer per round (the same module keeps training)."""
    module, data, trainer, ema = cli.model, cli.datamodule, cli.trainer, recipe_ema(cli)

    def run(steps: int) -> list[float]:
        clock = StepClock(device, warmup, steps)
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


def plain_path(
    cli: DiffusionCLI,
    device: torch.device,
    warmup: int,
    compile: bool | Literal["plainly", "channels_last"] = False,
    backend: str | None = None,
) -> Callable[[int], list[float]]:
    """The same DiffusionModule (a copy), data and optimizer in a hand-written loop, eager; with `compile`, its
    network compiled as fitting compiles it (`backend`: torch.compile's, Inductor by default), "channels_last":
    so with the graph laid out NHWC; "plainly": only `network.compile()` (default mode: no CUDA graphs)."""
    module = copy.deepcopy(cli.model).to(device)
    if compile == "plainly":
        module.network.compile(backend=backend or "inductor")
    elif compile:
        module.hparams.compile_channels_last = compile == "channels_last"
        compile_as_fitting_does(module, str(cli.trainer.precision), device, backend)
    module.on_fit_start()  # the rank's noise generator
    params = list(module.parameters())
    ema_params = [p.detach().clone() for p in params]
    decay, clip = recipe_ema(cli).decay, cli.trainer.gradient_clip_val
    autocast, scaler = precision_context(str(cli.trainer.precision), device)
    per_sample = module.hparams.noise_mode == "per_sample"
    cli.datamodule.setup("fit")
    batches = endless_batches(cli.datamodule, device)
    # Without a Trainer there is no max_steps for a decay to end at; the rate's value does not change a step's cost.
    module.hparams.lr_schedule = "constant"
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    updates = 0

    def run(steps: int) -> list[float]:
        nonlocal updates
        clock = StepClock(device, warmup, steps)
        module.train()
        for _ in range(warmup + steps):
            clock.tick()
            x0, indices = to_device(next(batches)[:2], device)  # Batch(x, index, label): no labels here
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


def compile_as_fitting_does(
    module: L.LightningModule, precision: str, device: torch.device, backend: str | None
) -> None:
    """The module's own `setup("fit")` with compiling on: torch.compile and whatever the module does with it
    (the network's memory format, say), under a Trainer of one device that is then detached again."""
    module.hparams.compile_training = True
    module.trainer = L.Trainer(
        accelerator=device.type, devices=1, precision=precision, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    try:
        with compiling_with(backend) if backend else contextlib.nullcontext():
            module.setup("fit")
    finally:
        module.trainer = None  # the loop has no Trainer: configure_optimizers takes that path


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
    schedule = DDPMScheduler(
        num_train_timesteps=hp.num_timesteps, beta_schedule="linear", beta_start=hp.beta_start,
        beta_end=hp.beta_end,
    )  # fmt: skip
    params = list(model.parameters())
    # Its best loop: the fused Adam kernel (GradScaler unscales before clipping and hands it the scale).
    optimizer = torch.optim.Adam(params, lr=hp.lr, betas=hp.adam_betas, fused=device.type in ("cpu", "cuda"))
    warm = max(hp.warmup_steps, 1)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warm))
    ema = EMAModel(params, decay=recipe_ema(cli).decay, foreach=True)
    clip = cli.trainer.gradient_clip_val
    autocast, scaler = precision_context(str(cli.trainer.precision), device)
    batches = endless_batches(cli.datamodule, device)

    def run(steps: int) -> list[float]:
        clock = StepClock(device, warmup, steps)
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

    return run, f"UNet2DModel, {theirs:,} parameters, eager"
