"""Training-time hooks: EMA of the weights and sample grids in TensorBoard and PNG."""

import math
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.utilities import rank_zero_only

from diffusion.data import denormalize
from diffusion.module import DiffusionModule
from diffusion.plotting import save_image_grid, save_scatter
from diffusion.sampling import Sampler


class EMA(WeightAveraging):
    """Exponential moving average of the weights, on Lightning's WeightAveraging callback.

    Updated once per optimizer step (so also under accumulate_grad_batches and DDP), stored in checkpoints
    (the EMA weights under "state_dict", the raw ones under "current_model_state") and restored on resume.

    decay warms up as min(decay, (1 + n) / (10 + n)) after n updates (Tensorflow's ExponentialMovingAverage
    with num_updates), so short CPU runs are not dominated by the random initial weights.

    Lightning swaps the EMA weights in for validation; this subclass swaps them back only in
    `on_validation_end`, so every `on_validation_epoch_end` hook (sample grids, FID) sees EMA weights
    whatever the order of the callbacks.
    """

    def __init__(self, decay: float = 0.9999, warmup: bool = True, update_every_n_steps: int = 1) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay={decay} must be in (0, 1); Ho et al. use 0.9999")
        if update_every_n_steps < 1:
            raise ValueError(f"update_every_n_steps={update_every_n_steps} must be >= 1")
        self.decay = decay
        self.warmup = warmup
        self.update_every_n_steps = update_every_n_steps
        super().__init__(use_buffers=True, avg_fn=self._average)

    def current_decay(self, num_updates: int) -> float:
        if not self.warmup:
            return self.decay
        return min(self.decay, (1 + num_updates) / (10 + num_updates))

    def _average(
        self, averaged: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor
    ) -> torch.Tensor:
        decay = self.current_decay(int(num_averaged))
        return decay * averaged + (1 - decay) * current

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and (step_idx + 1) % self.update_every_n_steps == 0

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # swapped back in on_validation_end instead

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)


class SampleGrid(L.Callback):
    """Samples a fixed-seed grid at the end of validation (so with EMA weights when EMA is on), logs it to
    TensorBoard and saves it as `<run dir>/samples/step_<global step>.png` (and `latest.png`).

    Every rank draws its share of the grid (per-sample seeds make the union the same grid whatever the
    world size), so no rank sits idle in a collective while rank 0 samples.
    For vector data it saves a scatter plot of the first two features.
    """

    def __init__(
        self,
        num_samples: int = 64,
        seed: int = 0,
        every_n_validations: int = 1,
        sampler: Sampler | None = None,
        steps: int | None = None,
    ) -> None:
        if num_samples < 1 or every_n_validations < 1:
            raise ValueError("SampleGrid needs num_samples >= 1 and every_n_validations >= 1")
        self.num_samples = num_samples
        self.seed = seed
        self.every_n_validations = every_n_validations
        self.sampler = sampler
        self.steps = steps
        self._validations = 0
        self._out_dir: Path | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # trainer.log_dir is a collective under DDP (rank 0 broadcasts it): read it here on every rank,
        # never inside the rank-zero-only save, where the other ranks would not join and it would deadlock.
        self._out_dir = Path(trainer.log_dir or trainer.default_root_dir) / "samples"

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: DiffusionModule) -> None:
        if trainer.sanity_checking:
            return
        self._validations += 1
        if (self._validations - 1) % self.every_n_validations:
            return
        samples = sample_across_ranks(
            pl_module, self.num_samples, self.seed, sampler=self.sampler, steps=self.steps
        )
        self._save(trainer, pl_module, samples)

    @rank_zero_only
    def _save(self, trainer: L.Trainer, pl_module: DiffusionModule, samples: torch.Tensor) -> None:
        out_dir = self._out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"step_{trainer.global_step:07d}.png"
        data = denormalize(samples.float().cpu(), pl_module.normalization)
        if samples.ndim == 4:
            grid = save_image_grid(data, path)
            experiment = getattr(trainer.logger, "experiment", None)
            if hasattr(experiment, "add_image"):
                experiment.add_image("samples", grid, global_step=trainer.global_step)
        else:
            save_scatter(data.numpy(), path)
        (out_dir / "latest.png").write_bytes(path.read_bytes())


def sample_across_ranks(module: DiffusionModule, num_samples: int, seed: int, **overrides) -> torch.Tensor:
    """`num_samples` samples split over all ranks and gathered in index order (on every rank).

    Rank r draws samples r, r + world, r + 2 world, ...; each rank draws the same count (the last few may
    be extras beyond num_samples, dropped after the gather) because all_gather needs equal shapes.
    """
    world, rank = module.trainer.world_size, module.global_rank
    per_rank = math.ceil(num_samples / world)
    indices = torch.arange(per_rank) * world + rank
    local = module.sample(per_rank, seed=seed, indices=indices, **overrides)
    if world == 1:
        return local[:num_samples]
    gathered = module.all_gather(local)  # (world, per_rank, ...)
    # (world, per_rank) -> interleave so position i holds sample i.
    return gathered.transpose(0, 1).reshape(world * per_rank, *local.shape[1:])[:num_samples]
