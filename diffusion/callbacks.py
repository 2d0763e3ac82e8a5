"""Training-time hooks: EMA of the weights, atomic checkpoints, sample grids (TensorBoard and PNG) and FID."""

import os
import signal
from pathlib import Path
from typing import Any, get_args

import lightning as L
import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import ModelCheckpoint, WeightAveraging
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, Dataset, Subset
from torchmetrics import Metric

from diffusion import checkpoint_io
from diffusion.generation import generate_batches, rank_indices, sample_across_ranks
from diffusion.labels import class_labels
from diffusion.metrics import Features, compute_metrics, make_metrics
from diffusion.module import DiffusionModule
from diffusion.preemption import Preemption, requeue_slurm_job
from diffusion.render import save_preview, to_uint8
from diffusion.sampling import DEFER, SamplingOptions


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
    """ModelCheckpoint whose last.ckpt is always the final step, and whose files are written atomically.

    Lightning writes last.ckpt at train end only if it never wrote one, so a run whose max_steps is not a
    multiple of the validation interval would keep a last.ckpt from before its final steps.

    In `setup` it makes the strategy's saves atomic (`diffusion.checkpoint_io`; on every rank, rank 0
    writes) and removes temporary files a killed save left in its folder; `save_last="link"` replaces
    last.ckpt atomically too.

    Besides the saves ModelCheckpoint makes (at validation by default), at the end of an optimizer step it
    saves last.ckpt when `every_n_minutes` of wall time passed since the last save, and when the run got
    SIGTERM or SIGUSR1, after which it ends the run with a non-zero exit (`diffusion.preemption`).

    Args:
        every_n_minutes: wall-time interval of the timed checkpoints (None: none).
        **kwargs: ModelCheckpoint's arguments.
    """

    def __init__(self, *args: Any, every_n_minutes: float | None = 30.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.preemption = Preemption(every_n_minutes)
        self._polled_step = -1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        checkpoint_io.install(trainer.strategy)
        if trainer.is_global_zero and self.dirpath and _is_local_file_protocol(self.dirpath):
            checkpoint_io.remove_leftovers(Path(self.dirpath))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # After Lightning registered its signal handlers (it restores the ones it found after fit).
        self.preemption.install(trainer)
        self._polled_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if trainer.global_step == self._polled_step:
            return  # no optimizer step since the last poll (accumulating): a save here would lose gradients
        self._polled_step = trainer.global_step
        signum, due = self.preemption.poll(trainer)
        if (signum or due) and not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            if self.save_last:
                self._save_last_checkpoint(trainer, candidates)
            else:
                self._save_checkpoint(trainer, self.format_checkpoint_name(candidates))
        if self._last_global_step_saved == trainer.global_step:
            self.preemption.saved()
        if signum:
            name = signal.Signals(signum).name
            rank_zero_info(
                f"{name} received: saved the checkpoint of step {trainer.global_step} "
                f"({self.last_model_path or self.best_model_path}); resume with --ckpt_path last"
            )
            requeue_slurm_job(trainer, signum)
            raise SIGTERMException(128 + signum)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.save_last and self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        else:
            super().on_train_end(trainer, pl_module)

    @staticmethod
    def _link_checkpoint(trainer: L.Trainer, filepath: str, linkpath: str) -> None:
        # Lightning removes last.ckpt and then links or copies: a kill in between leaves no last.ckpt, or a
        # truncated copy.
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            checkpoint_io.link_atomically(filepath, linkpath)
        trainer.strategy.barrier()


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
    For vector data it saves a scatter plot of the first two features. A class-conditional model samples the
    classes in turn (sample i of class i % num_classes, guided by `sampling.guidance_scale`), one row per class.

    Args:
        sampling: how to sample the grid; unset fields take the model's defaults.
    """

    def __init__(
        self,
        num_samples: int = 64,
        seed: int = 0,
        every_n_validations: int = 1,
        sampling: SamplingOptions = DEFER,
    ) -> None:
        super().__init__(every_n_validations)
        if num_samples < 1:
            raise ValueError(f"SampleGrid num_samples={num_samples} must be >= 1")
        self.num_samples = num_samples
        self.seed = seed
        self.sampling = sampling
        self._out_dir: Path | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # trainer.log_dir is a collective under DDP (rank 0 broadcasts it): read it here on every rank,
        # never inside the rank-zero-only save, where the other ranks would not join and it would deadlock.
        self._out_dir = Path(trainer.log_dir or trainer.default_root_dir) / "samples"

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: DiffusionModule) -> None:
        if not self.is_due(trainer):
            return
        labels = class_labels(self.num_samples, pl_module.num_classes)
        samples = sample_across_ranks(pl_module, self.num_samples, self.seed, self.sampling, labels)
        self._save(trainer, pl_module, samples, labels)

    @rank_zero_only
    def _save(
        self,
        trainer: L.Trainer,
        pl_module: DiffusionModule,
        samples: torch.Tensor,
        labels: torch.Tensor | None,
    ) -> None:
        self._out_dir.mkdir(parents=True, exist_ok=True)
        path = self._out_dir / f"step_{trainer.global_step:07d}.png"
        grid = save_preview(samples, pl_module.normalization, path, labels)
        experiment = getattr(trainer.logger, "experiment", None)
        if grid is not None and hasattr(experiment, "add_image"):
            experiment.add_image("samples", grid, global_step=trainer.global_step)
        (self._out_dir / "latest.png").write_bytes(path.read_bytes())


class FIDCallback(EveryNValidations):
    """FID (and KID) of generated samples against the training images, logged as ``val/fid``, ``val/kid``.

    Runs at the end of validation (not in the sanity check), so with EMA weights when EMA is on, every
    ``every_n_validations`` validations. ``ModelCheckpoint(monitor="val/fid", mode="min")`` can keep the
    best model. With ``features="pixels"`` the logged value is the pixel-space FD (offline), not Inception FID.

    The real images are the training images as stored, without random augmentation: the data module's
    ``unaugmented_train_set()`` when it has one (`diffusion.data.ImageDataModule` does), else the training
    DataLoader's dataset. Under DDP nothing is duplicated and no rank idles: rank r feeds real images
    r, r + world, ... of a fixed random subset of ``num_real`` of them (once; real statistics are kept) and generates
    samples r, r + world, ... of ``num_samples`` (per-sample seeds: the same images whatever the world
    size); torchmetrics then sums the states over ranks. FID depends on the sample count: compare values
    computed with the same ``num_samples``. A class-conditional model samples the classes in turn (sample i of
    class i % num_classes), guided by ``sampling.guidance_scale`` like every other sampling option.

    Args:
        num_samples: generated images per evaluation (papers: 50,000 against the whole training set, i.e.
            ``num_real`` = its size; 1,000 keeps CPU runs short but reads higher than a paper's FID).
        features: "inception" (standard FID, weights downloaded on first use) or "pixels" (offline).
        every_n_validations: evaluate at every n-th validation.
        sampling: how to sample; unset fields take the model's defaults.
        seed: seed of the generated samples, of the real subset and of KID's subsets.
        kid: also compute KID (keeps all features in memory).
        kid_subset_size: KID subset size (1,000 as in torch-fidelity), capped at the number of images available.
        num_real: real images for the reference statistics (default: num_samples, capped at the train set).
        batch_size: images per sampling / feature batch on each rank.
        inception_weights: a local copy of the InceptionV3 weights (offline clusters).
    """

    def __init__(
        self,
        num_samples: int = 1000,
        features: Features = "inception",
        every_n_validations: int = 1,
        sampling: SamplingOptions = DEFER,
        seed: int = 0,
        kid: bool = True,
        kid_subset_size: int = 1000,
        num_real: int | None = None,
        batch_size: int = 256,
        inception_weights: str | None = None,
    ) -> None:
        if features not in get_args(Features):
            raise ValueError(f"unknown features {features!r}; choose one of {get_args(Features)}")
        for name, value, low in [
            ("num_samples", num_samples, 2),
            ("kid_subset_size", kid_subset_size, 2), ("num_real", num_real or 2, 2), ("batch_size", batch_size, 1),
        ]:  # fmt: skip
            if value < low:
                raise ValueError(f"FIDCallback {name}={value} must be >= {low}")
        super().__init__(every_n_validations)
        self.num_samples = num_samples
        self.features = features
        self.sampling = sampling
        self.seed = seed
        self.kid = kid
        self.kid_subset_size = kid_subset_size
        self.num_real = num_real or num_samples
        self.batch_size = batch_size
        self.inception_weights = inception_weights
        self.metrics: dict[str, Metric] | None = None
        self.last: dict[str, float] = {}  # the latest result (all ranks), with the gathered image counts
        self._real_fed = False
        self._num_real_total = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        shape = tuple(getattr(pl_module, "sample_shape", ()))
        if len(shape) != 3:
            raise ValueError(
                f"FIDCallback needs image data (sample shape (C, H, W)), but the model's sample_shape is {shape}; "
                "FID/KID compare images. Remove the callback for vector data."
            )
        if self.num_samples < trainer.world_size:
            raise ValueError(
                f"FIDCallback num_samples={self.num_samples} must be >= the world size {trainer.world_size}"
            )
        if self.metrics is None:
            # Built here on every rank (not in __init__) so that a bad Inception download fails at setup,
            # and so the pixel features know the channel count.
            self.metrics = make_metrics(
                self.features, self.kid_subset_size, channels=shape[0],
                inception_weights=self.inception_weights,
            )  # fmt: skip
            if not self.kid:
                del self.metrics["kid"]

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: DiffusionModule) -> None:
        if not self.is_due(trainer):
            return
        for metric in self.metrics.values():
            metric.to(pl_module.device)  # no-op after the first time; the module moves after setup
        if not self._real_fed:
            self._feed_real(trainer, pl_module)
            self._real_fed = True
        self._feed_generated(trainer, pl_module)
        if self.kid:
            # KID's subsets are drawn from all gathered features: they cannot outnumber them.
            self.metrics["kid"].subset_size = min(
                self.kid_subset_size, self.num_samples, self._num_real_total
            )
        result = compute_metrics(self.metrics, self.seed)
        for metric in self.metrics.values():
            metric.reset()  # generated features only (reset_real_features=False); also clears the cached value
        self.last = result
        # Every rank computed the same value from the same gathered states; sync_dist averages identical
        # numbers (exact) and spares Lightning's "use sync_dist=True" warning. Logged on every rank so a
        # ModelCheckpoint monitoring val/fid finds it wherever it runs.
        pl_module.log("val/fid", result["fid"], sync_dist=True)
        if self.kid:
            pl_module.log("val/kid", result["kid_mean"], sync_dist=True)
        rank_zero_info(
            f"step {trainer.global_step}: FID ({self.features} features) {result['fid']:.4g} from "
            f"{result['num_fake']} generated and {result['num_real']} real images"
        )

    def _feed_real(self, trainer: L.Trainer, pl_module: DiffusionModule) -> None:
        dataset = _train_dataset(trainer)
        self._num_real_total = min(self.num_real, len(dataset))
        # A fixed random subset rather than the first items: folders sorted by class would bias those.
        subset = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(self.seed))
        shard = subset[rank_indices(self._num_real_total, pl_module.global_rank, trainer.world_size)]
        loader = DataLoader(Subset(dataset, shard.tolist()), batch_size=self.batch_size, shuffle=False)
        # A fallback dataset's random transforms would draw from the global RNG: fork it so training noise
        # is unchanged.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            for batch in loader:
                images = batch[0] if isinstance(batch, tuple | list) else batch  # Batch(x, index) or x
                self._update(images, pl_module, real=True)

    def _feed_generated(self, trainer: L.Trainer, pl_module: DiffusionModule) -> None:
        indices = rank_indices(self.num_samples, pl_module.global_rank, trainer.world_size)
        labels = class_labels(self.num_samples, pl_module.num_classes)  # classes in turn, or None
        for samples in generate_batches(
            pl_module,
            indices,
            seed=self.seed,
            batch_size=self.batch_size,
            options=self.sampling,
            labels=labels,
        ):
            self._update(samples, pl_module, real=False)

    def _update(self, images: torch.Tensor, pl_module: DiffusionModule, real: bool) -> None:
        uint8 = to_uint8(images.to(pl_module.device), pl_module.normalization)  # (N, C, H, W)
        for metric in self.metrics.values():
            metric.update(uint8, real=real)


def _train_dataset(trainer: L.Trainer) -> Dataset:
    """The training set (items ``x`` or ``(x, ...)`` in model units) without random augmentation when the
    datamodule offers it (``unaugmented_train_set``), else the dataset of the training DataLoader."""
    datamodule = trainer.datamodule
    if datamodule is not None and hasattr(datamodule, "unaugmented_train_set"):
        return datamodule.unaugmented_train_set()
    loader = datamodule.train_dataloader() if datamodule is not None else trainer.train_dataloader
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "__len__"):
        raise ValueError(
            f"FIDCallback takes real images from the training DataLoader's dataset, but got {type(loader).__name__}"
        )
    return dataset
