"""Training-time hooks: EMA of the weights and sample grids in TensorBoard and PNG."""

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, WeightAveraging
from lightning.pytorch.utilities import rank_zero_only

from diffusion.data import denormalize
from diffusion.module import DiffusionModule
from diffusion.plotting import save_image_grid, save_scatter
from diffusion.sample import generate, interleave_ranks
from diffusion.sampling import Sampler


class EMA(WeightAveraging):
    """Exponential moving average of the weights, on Lightning's WeightAveraging callback.

    Updated once per optimizer step (so also under accumulate_grad_batches and DDP), stored in checkpoints
    (the EMA weights under "state_dict", the raw ones under "current_model_state") and restored on resume.

    decay warms up as min(decay, (1 + n) / (10 + n)) after n updates (Tensorflow's ExponentialMovingAverage
    with num_updates), so short CPU runs are not dominated by the random initial weights.

    The update is one `torch._foreach_lerp_` over all parameters, with the update count kept on the host:
    Lightning's default path (AveragedModel.update_parameters with a per-tensor `avg_fn`) walks the
    parameters in Python, builds a decay tensor per parameter and reads `n_averaged` back from the device
    every step, which cost ~16% of a CPU training step and a device sync per step on GPUs.

    Lightning swaps the EMA weights in for validation; this subclass swaps them back only in
    `on_validation_end`, so every `on_validation_epoch_end` hook (sample grids, FID) sees EMA weights
    whatever the order of the callbacks.

    Only parameters are averaged (use_buffers=False): the module's buffers are the constant noise schedule,
    which averaging could only blur by rounding; the EMA copy's buffers follow the module's at every update,
    as AveragedModel does with use_buffers=False.
    """

    def __init__(self, decay: float = 0.9999, warmup: bool = True, update_every_n_steps: int = 1) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay={decay} must be in (0, 1); Ho et al. use 0.9999")
        if update_every_n_steps < 1:
            raise ValueError(f"update_every_n_steps={update_every_n_steps} must be >= 1")
        self.decay = decay
        self.warmup = warmup
        self.update_every_n_steps = update_every_n_steps
        self._raw_state_at_end: dict[str, torch.Tensor] | None = None
        self._num_updates = 0  # = the AveragedModel's n_averaged, kept on the host
        # (EMA params, params, EMA buffers, buffers), collected at the first update
        self._pairs: tuple[list[torch.Tensor], ...] | None = None
        super().__init__(use_buffers=False)

    def current_decay(self, num_updates: int) -> float:
        """The decay of the update that follows `num_updates` updates."""
        if not self.warmup:
            return self.decay
        return min(self.decay, (1 + num_updates) / (10 + num_updates))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._num_updates, self._pairs = 0, None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Lightning's condition, with update() in place of AveragedModel.update_parameters.
        if trainer.global_step > self._latest_update_step and self.should_update(
            step_idx=trainer.global_step - 1
        ):
            self.update(pl_module)
            self._latest_update_step = trainer.global_step

    @torch.no_grad()
    def update(self, pl_module: L.LightningModule) -> None:
        """One EMA step: the first copies the weights (AveragedModel's n_averaged == 0), later ones lerp."""
        if self._pairs is None:
            # The Parameter objects, not detached views: the strategy moves the module to its device after
            # setup by swapping each parameter's data, which a cached view would not follow.
            average = self._average_model.module
            self._pairs = (
                list(average.parameters()), list(pl_module.parameters()),
                list(average.buffers()), list(pl_module.buffers()),
            )  # fmt: skip
        ema_params, params, ema_buffers, buffers = self._pairs
        if self._num_updates == 0:
            torch._foreach_copy_(ema_params, params)
        else:
            torch._foreach_lerp_(ema_params, params, 1.0 - self.current_decay(self._num_updates))
        if buffers:
            torch._foreach_copy_(ema_buffers, buffers)
        self._average_model.n_averaged += 1
        self._num_updates += 1

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        if self._average_model is not None:
            self._num_updates = int(self._average_model.n_averaged)  # once per resume, not per step

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and (step_idx + 1) % self.update_every_n_steps == 0

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # swapped back in on_validation_end instead

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning copies the EMA weights into the module here, before the final last.ckpt is written:
        # keep the raw weights so that checkpoint still holds both (and resuming continues the raw ones).
        self._raw_state_at_end = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        super().on_train_end(trainer, pl_module)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._raw_state_at_end is not None and "current_model_state" in checkpoint:
            checkpoint["current_model_state"] = self._raw_state_at_end


class Checkpoint(ModelCheckpoint):
    """ModelCheckpoint whose last.ckpt is always the final step.

    Lightning writes last.ckpt at train end only if it never wrote one, so a run whose max_steps is not a
    multiple of the validation interval would keep a last.ckpt from before its final steps.
    """

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.save_last and self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        else:
            super().on_train_end(trainer, pl_module)


class EveryNValidations(L.Callback):
    """Base for callbacks that act at the end of every n-th validation: after the sanity check, and while the
    EMA weights are swapped in (see EMA)."""

    def __init__(self, every_n_validations: int = 1) -> None:
        if every_n_validations < 1:
            raise ValueError(f"every_n_validations={every_n_validations} must be >= 1")
        self.every_n_validations = every_n_validations
        self._validations = 0

    def is_due(self, trainer: L.Trainer) -> bool:
        """Count this validation and say whether to act on it (call once per on_validation_epoch_end)."""
        if trainer.sanity_checking:
            return False
        self._validations += 1
        return (self._validations - 1) % self.every_n_validations == 0


class SampleGrid(EveryNValidations):
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
        super().__init__(every_n_validations)
        if num_samples < 1:
            raise ValueError(f"SampleGrid num_samples={num_samples} must be >= 1")
        self.num_samples = num_samples
        self.seed = seed
        self.sampler = sampler
        self.steps = steps
        self._out_dir: Path | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # trainer.log_dir is a collective under DDP (rank 0 broadcasts it): read it here on every rank,
        # never inside the rank-zero-only save, where the other ranks would not join and it would deadlock.
        self._out_dir = Path(trainer.log_dir or trainer.default_root_dir) / "samples"

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: DiffusionModule) -> None:
        if not self.is_due(trainer):
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
    """`num_samples` samples split over all ranks (see `generate`) and gathered in index order on every rank."""
    world = module.trainer.world_size
    local = generate(
        module, num_samples, batch_size=num_samples, seed=seed, progress=False,
        rank=module.global_rank, world_size=world, **overrides,
    )  # fmt: skip
    if world == 1:
        return local
    return interleave_ranks(module.all_gather(local.to(module.device)).cpu(), num_samples)
