"""DiffusionModule: a DDPM (Ho et al. 2020) as a LightningModule, composing a network and a NoiseSchedule.

The Trainer owns everything distributed (DDP, samplers, gradient sync, accumulation, precision, rank-zero
checkpointing); this file owns only the diffusion objective, the optimizer and sampling.
"""

import math
import os
import warnings
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from diffusion import noise as counter_noise
from diffusion.sampling import Generators, Sampler, VarianceType, final_sample, randn, reverse_steps
from diffusion.schedule import BetaSchedule, NoiseSchedule, PredictionType, _check_choice

LossWeighting = Literal["none", "min_snr"]
NoiseMode = Literal["fast", "per_sample"]
Weights = Literal["ema", "raw"]


def sample_seed(seed: int, step: int, index: int) -> int:
    """A 63-bit seed that depends only on (seed, step, sample index), for per-sample generators."""
    return ((seed * 1_000_003 + step) * 2_654_435_761 + index) % (2**63 - 1)


def use_tf32_on_cuda(device: torch.device) -> None:
    """TF32 tensor cores for float32 matmuls on a CUDA device (Ampere and newer; cuDNN convolutions use them
    by default): products with a 10-bit mantissa, float32 accumulation, several times the float32 rate.
    A precision the user set explicitly (anything but torch's default "highest") is kept."""
    if device.type == "cuda" and torch.get_float32_matmul_precision() == "highest":
        torch.set_float32_matmul_precision("high")


def per_sample_generators(seed: int, step: int, indices: torch.Tensor) -> counter_noise.PerSampleNoise:
    """Per-sample noise for the samplers: draw k of sample i depends only on (seed, step, k, i). One
    counter-based stream for the whole batch (diffusion/noise.py), not a torch.Generator per sample."""
    return counter_noise.PerSampleNoise(seed, indices, step=step)


class DiffusionModule(L.LightningModule):
    """Trains `network` to predict the noise (or x_0, or v) added by the forward process.

    Args:
        network: any `model(x_t, t) -> same shape as x_t` (diffusion.models.UNet or MLP).
        sample_shape: shape of one sample, (C, H, W) or (D,); set from the data by the CLI.
        normalization: {"shift": [...], "scale": [...]} mapping model units back to data units; set from the
            data by the CLI so a checkpoint can turn samples into images or vectors on its own.
        prediction_type: what the network outputs: the noise "eps" (Ho et al.), "x0", or "v".
        loss_weighting: "none" (Ho et al.'s simple loss) or "min_snr" (Hang et al. 2023, gamma=min_snr_gamma).
        lr, warmup_steps, adam_betas, weight_decay: Adam with linear warmup (Ho et al.: 2e-4, 5000 steps).
        sampler, sampling_steps, eta, variance, clip_denoised: defaults for `sample()` and the callbacks.
        noise_mode: "fast" draws noise and timesteps from a per-rank generator; "per_sample" makes them a
            function of (noise_seed, optimizer step, dataset index), so a run on N devices reproduces a run on
            one device with accumulate_grad_batches=N (see README, "Scaling out").
        noise_seed: seed of the training noise; None uses the seed given to seed_everything (or 0).
        init_from: weights to start from: a checkpoint of this project or a state_dict of the network.
            Loaded here, before the strategy wraps the model, so every rank starts identical.
        compile: compile the network with torch.compile when fitting starts. In place (nn.Module.compile),
            so parameter names and checkpoint keys stay `network.*`, with no `_orig_mod.` in them.
    """

    def __init__(
        self,
        network: nn.Module,
        sample_shape: tuple[int, ...] = (1, 16, 16),
        normalization: dict[str, list[float]] | None = None,
        beta_schedule: BetaSchedule = "linear",
        num_timesteps: int = 1000,
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
        prediction_type: PredictionType = "eps",
        loss_weighting: LossWeighting = "none",
        min_snr_gamma: float = 5.0,
        lr: float = 2e-4,
        warmup_steps: int = 5000,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        sampler: Sampler = "ddpm",
        sampling_steps: int | None = None,
        eta: float = 0.0,
        variance: VarianceType = "fixedlarge",
        clip_denoised: bool = True,
        noise_mode: NoiseMode = "fast",
        noise_seed: int | None = None,
        init_from: str | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__()
        for name, value, allowed in [
            ("prediction_type", prediction_type, PredictionType),
            ("loss_weighting", loss_weighting, LossWeighting),
            ("sampler", sampler, Sampler),
            ("variance", variance, VarianceType),
            ("noise_mode", noise_mode, NoiseMode),
        ]:
            _check_choice(name, value, allowed)
        if lr <= 0 or warmup_steps < 0:
            raise ValueError(f"need lr > 0 and warmup_steps >= 0, got lr={lr}, warmup_steps={warmup_steps}")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`.*")
            # init_from is a one-time source of weights: the checkpoint then holds them itself.
            self.save_hyperparameters(ignore=["init_from"])
        if isinstance(self.hparams.get("network"), nn.Module):
            # Built in Python rather than by the CLI: only the CLI records the network's config, so such a
            # checkpoint is loaded with `load_from_checkpoint(path, network=...)`.
            self.hparams.pop("network")
        self.network = network
        self.sample_shape = tuple(sample_shape)
        self.schedule = NoiseSchedule(beta_schedule, num_timesteps, beta_start, beta_end)
        self._generator: torch.Generator | None = None
        self._compiled = False
        if init_from is not None:
            try:
                self.network.load_state_dict(read_network_weights(init_from))
            except RuntimeError as error:
                raise RuntimeError(
                    f"init_from={init_from}: these weights do not fit {type(network).__name__}; use the "
                    f"--model.network settings of the run that saved them.\n{error}"
                ) from error

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.network(x_t, t)

    # ---- training -------------------------------------------------------------------------------------
    @property
    def _noise_seed(self) -> int:
        if self.hparams.noise_seed is not None:
            return self.hparams.noise_seed
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    def setup(self, stage: str) -> None:
        precision = str(self.trainer.precision)
        if precision in ("16-true", "bf16-true"):
            # True half precision casts every buffer, and the noise schedule loses the precision its small
            # betas need (Lightning's HalfPrecision calls module.to(dtype)); mixed precision keeps it float32.
            raise ValueError(
                f"precision={precision} is not supported: it would cast the noise schedule to half precision; "
                f"use --precision {precision.replace('-true', '-mixed')} (the network runs in half, the "
                "schedule and loss stay float32)"
            )
        use_tf32_on_cuda(self.device)  # Lightning already points self.device at the run's device here
        if self.hparams.compile and stage == "fit" and not self._compiled:
            # After the EMA callback's setup has copied the module: its copy stays a plain module.
            self.network.compile()
            self._compiled = True

    def on_fit_start(self) -> None:
        # seed_everything gives every rank the same seed: without the rank in this generator's seed, all ranks
        # would draw identical noise and timesteps, wasting the extra devices. The step makes a resumed run
        # continue with fresh noise rather than replaying the first steps.
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(sample_seed(self._noise_seed, self.global_step, self.global_rank + 1))

    def on_train_start(self) -> None:
        rank_zero_info(describe_batches(self.trainer))

    def draw_noise_and_timesteps(
        self, x0: torch.Tensor, indices: torch.Tensor, step: int, per_sample: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Noise like x0 and timesteps (B,) for one batch, from the rank's generator or per sample."""
        T = self.schedule.num_timesteps
        if per_sample:  # a function of (seed, step, dataset index), drawn for the whole batch on its device
            indices = indices.to(x0.device)
            seed = self._noise_seed
            t_key = counter_noise.noise_key(seed, counter_noise.TRAINING_TIMESTEPS, step)
            t = counter_noise.randint(T, t_key, indices)
            key = counter_noise.noise_key(seed, counter_noise.TRAINING_NOISE, step)
            return counter_noise.normal(x0.shape, key, indices, dtype=x0.dtype), t
        t = torch.randint(T, (x0.shape[0],), device=x0.device, generator=self._generator)
        return randn(x0.shape, self._generator, x0.device), t

    def per_sample_loss(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Weighted MSE between the network output and its target, one value per sample, shape (B,)."""
        x_t = self.schedule.q_sample(x0, t, noise)
        target = self.schedule.training_target(self.hparams.prediction_type, x0, t, noise)
        output = self.network(x_t, t).float()
        loss = (output - target).pow(2).flatten(1).mean(dim=1)
        if self.hparams.loss_weighting == "min_snr":
            snr = self.schedule.snr(t)
            clipped = snr.clamp(max=self.hparams.min_snr_gamma)
            # Hang et al. 2023: weight min(SNR, gamma) on the x0 loss, expressed for each target.
            weight = {"eps": clipped / snr, "x0": clipped, "v": clipped / (snr + 1)}[
                self.hparams.prediction_type
            ]
            loss = loss * weight
        return loss

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x0, indices = batch
        per_sample = self.hparams.noise_mode == "per_sample"
        noise, t = self.draw_noise_and_timesteps(x0, indices, self.global_step, per_sample)
        loss = self.per_sample_loss(x0, noise, t).mean()
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x0, indices = batch
        # Fixed noise per validation sample (step 0), so val/loss is comparable across epochs and world sizes.
        noise, t = self.draw_noise_and_timesteps(x0, indices, step=0, per_sample=True)
        self.log("val/loss", self.per_sample_loss(x0, noise, t).mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> dict[str, Any]:
        # The fused kernel updates all parameters at once: about half the time of the default per-tensor
        # loop on a CPU (which gets no foreach default), and what CUDA runs fastest.
        optimizer = torch.optim.Adam(
            self.parameters(), lr=self.hparams.lr, betas=self.hparams.adam_betas,
            weight_decay=self.hparams.weight_decay, fused=self.device.type in ("cpu", "cuda"),
        )  # fmt: skip
        warmup = max(self.hparams.warmup_steps, 1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- sampling -------------------------------------------------------------------------------------
    @property
    def normalization(self) -> dict[str, list[float]]:
        """Maps model units to data units (x * scale + shift); images default to [-1, 1] -> [0, 1]."""
        if self.hparams.get("normalization"):
            return self.hparams.normalization
        is_image = len(self.sample_shape) == 3
        channels = self.sample_shape[0]
        return {
            "shift": [0.5 if is_image else 0.0] * channels,
            "scale": [0.5 if is_image else 1.0] * channels,
        }

    def sampling_options(self, **overrides: Any) -> dict[str, Any]:
        """The reverse-process options stored in hparams, with non-None overrides applied."""
        options = {
            "sampler": self.hparams.sampler,
            "steps": self.hparams.sampling_steps,
            "eta": self.hparams.eta,
            "variance": self.hparams.variance,
            "clip_denoised": self.hparams.clip_denoised,
            "prediction_type": self.hparams.prediction_type,
        }
        options.update({k: v for k, v in overrides.items() if v is not None})
        return options

    @torch.no_grad()
    def sample(
        self,
        num_samples: int,
        *,
        seed: int | None = None,
        indices: torch.Tensor | None = None,
        generator: Generators = None,
        progress: bool = False,
        **overrides: Any,
    ) -> torch.Tensor:
        """Draw samples in model units, shape (num_samples, *sample_shape).

        With `seed`, the noise of sample i is a function of (seed, i) for i in `indices` (default
        0..num_samples-1; counter-based, diffusion/noise.py), so any split of N samples into batches, ranks
        or devices gives the same N samples.
        `overrides` (sampler, steps, eta, variance, clip_denoised) replace the defaults in the checkpoint.
        """
        if seed is not None:
            indices = torch.arange(num_samples) if indices is None else indices
            if len(indices) != num_samples:
                raise ValueError(f"got {len(indices)} indices for num_samples={num_samples}")
            generator = per_sample_generators(seed, 0, indices)
        was_training = self.training
        self.eval()
        x_T = randn((num_samples, *self.sample_shape), generator, self.device)
        options = self.sampling_options(**overrides)
        x = final_sample(
            reverse_steps(self.network, self.schedule, x_T, generator=generator, progress=progress, **options)
        )
        self.train(was_training)
        return x


def describe_batches(trainer: L.Trainer) -> str:
    """'N samples, B per device x W processes x A accumulation = global batch G, S optimizer steps per epoch'.

    Per rank, an epoch has ceil(N / (B x W)) batches (DistributedSampler pads the last shard) and Lightning
    steps the optimizer every A batches and at the end of the epoch.
    """
    world, accumulate = trainer.world_size, trainer.accumulate_grad_batches  # world = devices x nodes
    loader = trainer.train_dataloader
    dataset, batch_size = getattr(loader, "dataset", None), getattr(loader, "batch_size", None)
    if batch_size is None or not hasattr(dataset, "__len__"):  # an iterable dataset or a batch sampler
        return f"{world} processes x {accumulate} accumulation"
    batches = trainer.num_training_batches
    steps = "?" if math.isinf(batches) else str(math.ceil(batches / accumulate))
    return (
        f"{len(dataset)} samples, {batch_size} per device x {world} processes x {accumulate} accumulation "
        f"= global batch {batch_size * world * accumulate}, {steps} optimizer steps per epoch"
    )


def read_network_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Network weights from a checkpoint of this project (its `network.` entries) or a plain state_dict."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"init_from: no such file {path}; pass a .ckpt of this project or a state_dict"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    if any(key.startswith("network.") for key in state):
        state = {
            key.removeprefix("network."): value for key, value in state.items() if key.startswith("network.")
        }
    return state


def load_checkpoint(
    path: str | os.PathLike, weights: Weights = "ema", map_location: str | torch.device = "cpu"
) -> DiffusionModule:
    """Load a DiffusionModule from a checkpoint alone (no config), with its EMA weights or its raw ones.

    Lightning's EMA callback stores the averaged weights under "state_dict" and the raw ones under
    "current_model_state"; a run without EMA has only raw weights, which both choices then return.
    """
    _check_choice("weights", weights, Weights)
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path}; runs keep theirs in runs/<name>/version_N/checkpoints/"
        )
    module = DiffusionModule.load_from_checkpoint(path, map_location=map_location, weights_only=False)
    if weights == "raw":
        checkpoint = torch.load(path, map_location=map_location, weights_only=False)
        if "current_model_state" in checkpoint:
            module.load_state_dict(checkpoint["current_model_state"])
    return module.eval()


def latest_checkpoint(save_dir: str | os.PathLike, name: str) -> Path:
    """The newest `<save_dir>/<name>/version_N/checkpoints/last.ckpt` (highest N)."""
    candidates = []
    for path in Path(save_dir, name).glob("version_*/checkpoints/last.ckpt"):
        version = path.parent.parent.name.removeprefix("version_")
        if version.isdigit():
            candidates.append((int(version), path))
    if not candidates:
        raise FileNotFoundError(
            f"no last.ckpt under {Path(save_dir, name)}/version_*/checkpoints/: train first "
            f"(python train.py), or pass the path of a checkpoint"
        )
    return max(candidates)[1]
