"""Sample grids at the end of validation (PNG, and to TensorBoard, W&B and MLflow), and the every-n-validations
base."""

import shutil
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.loggers import Logger, MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only

from diffusion.core.sampling import DEFER, SamplingOptions, check_options
from diffusion.data.labels import class_labels
from diffusion.errors import OutOfRange, check_whole_number
from diffusion.generation.arguments import checked_seed
from diffusion.generation.ranks import sample_across_ranks
from diffusion.generation.render import save_preview
from diffusion.training.atomic_writes import write_atomically
from diffusion.training.callbacks.run_progress import shows_progress
from diffusion.training.module import DiffusionModule
from diffusion.training.run_folders import SAMPLE_GRIDS, run_folder


class EveryNValidations(L.Callback):
    """Base for callbacks that act at the end of every n-th validation: after the sanity check, and while the
    EMA weights are swapped in (see EMA)."""

    acts = "to act"  # what a subclass does at a due validation, in the fix of a bad every_n_validations

    def __init__(self, every_n_validations: int = 1) -> None:
        fix = f"pass 1 {self.acts} at every validation"
        check_whole_number("every_n_validations", every_n_validations, fix=fix)
        if every_n_validations < 1:
            raise OutOfRange("every_n_validations", every_n_validations, ">= 1", fix)
        self.every_n_validations = every_n_validations
        self._validations = 0

    def is_due(self, trainer: L.Trainer) -> bool:
        """Count this validation and say whether to act on it (call once per on_validation_epoch_end)."""
        if trainer.sanity_checking:
            return False
        self._validations += 1
        return (self._validations - 1) % self.every_n_validations == 0


class SampleGrid(EveryNValidations):
    """Samples a fixed-seed grid at the end of validation (so with EMA weights when EMA is on), saves it as
    `<run folder>/samples/step_<global step>.png` (and `latest.png`) and logs it to every logger that takes
    pictures: as an image to TensorBoard and W&B, as a file in the run's `samples` artifacts to MLflow (a CSV log
    has the files in the run folder).

    Every rank draws its share of the grid (per-sample seeds make the union the same grid whatever the
    world size), so no rank sits idle in a collective while rank 0 samples.
    For vector data it saves a scatter plot of the first two features. A class-conditional model samples the
    classes in turn (sample i of class i % num_classes, guided by `sampling.guidance_scale`), one row per class.

    Args:
        sampling: how to sample the grid; unset fields take the model's defaults.
    """

    acts = "for a grid"

    def __init__(
        self,
        num_samples: int = 64,
        seed: int = 0,
        every_n_validations: int = 1,
        sampling: SamplingOptions = DEFER,
    ) -> None:
        super().__init__(every_n_validations)
        check_whole_number("num_samples", num_samples, fix="pass e.g. 64")
        if num_samples < 1:
            raise OutOfRange("num_samples", num_samples, ">= 1", "pass e.g. 64")
        # Checked here rather than at the first validation, after the training steps before it.
        check_options(sampling, "sampling", "SampleGrid(sampling=SamplingOptions(...))")
        self.num_samples = num_samples
        self.seed = checked_seed(seed)
        self.sampling = DEFER if sampling is None else sampling  # None: the model's own defaults, as DEFER
        self._out_dir: Path | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # A collective under DDP (rank 0 broadcasts it): read here on every rank, never inside the rank-zero-only
        # save, where the other ranks would not join and it would deadlock.
        self._out_dir = run_folder(trainer) / SAMPLE_GRIDS
        module = cast(DiffusionModule, pl_module)  # the module this callback trains with
        self.sampling.check_steps_fit(module.schedule.num_timesteps, type(self), "sampling.steps")
        conditional = getattr(pl_module, "num_classes", None) is not None
        dropout = getattr(pl_module, "hparams", {}).get("label_dropout")  # 0: it never learnt to be guided
        self.sampling.check_guidance_fits(conditional, type(self), "sampling.guidance_scale", dropout)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.is_due(trainer):
            return
        module = cast(DiffusionModule, pl_module)  # the module this callback trains with
        labels = class_labels(self.num_samples, module.num_classes)
        samples = sample_across_ranks(
            module,
            self.num_samples,
            self.seed,
            module.sampler(self.sampling),
            labels,
            progress=shows_progress(trainer),
        )  # ~20 s on a CPU: not a frozen bar
        self._save(trainer, module, samples, labels)

    @rank_zero_only
    def _save(
        self,
        trainer: L.Trainer,
        pl_module: DiffusionModule,
        samples: torch.Tensor,
        labels: torch.Tensor | None,
    ) -> None:
        out_dir = self._out_dir
        assert out_dir is not None  # set in setup, which runs before any validation
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"step_{trainer.global_step:07d}.png"
        grid = write_atomically(
            path, lambda into: save_preview(samples, pl_module.normalization, into, labels)
        )
        for logger in trainer.loggers:
            if hasattr(logger, "log_image"):  # W&B's signature: the saved picture, grid or scatter plot
                logger.log_image(key="samples", images=[str(path)], step=trainer.global_step)
            elif isinstance(logger, MLFlowLogger):  # MLflow keeps pictures as the run's artifacts
                logger.experiment.log_artifact(logger.run_id, str(path), "samples")
            elif grid is not None and hasattr(_experiment(logger), "add_image"):  # TensorBoard's writer
                _experiment(logger).add_image("samples", grid, global_step=trainer.global_step)
        write_atomically(out_dir / "latest.png", lambda into: shutil.copyfile(path, into))


def _experiment(logger: Logger) -> Any:
    """The logger's own client (TensorBoard's SummaryWriter, ...): every Lightning logger has one, as
    `experiment`, which their base class does not declare."""
    return cast(Any, logger).experiment
