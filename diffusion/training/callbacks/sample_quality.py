"""The quality of generated samples during training: FID and KID against the training images (or their saved
statistics), at the end of validation, by the computation of `python -m diffusion.evaluate`
(`diffusion.metrics.sample_quality`)."""

from functools import partial
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset, Subset

from diffusion.core.sampling import DEFER, SamplingOptions, check_options
from diffusion.data.labels import class_labels
from diffusion.errors import InvalidValue, OutOfRange, check_bool, check_whole_number
from diffusion.generation.arguments import checked_seed
from diffusion.generation.ranks import SAMPLING_BATCH, drawn_anyway, generate_batches, rank_indices
from diffusion.generation.render import to_uint8
from diffusion.metrics.features import (
    Features,
    check_features,
    check_inception_weights,
    distance_name,
    feature_size,
)
from diffusion.metrics.reference_stats import load_statistics
from diffusion.metrics.sample_quality import KID_SUBSET_SIZE, SampleQuality
from diffusion.training.callbacks.grids import EveryNValidations
from diffusion.training.callbacks.run_progress import shows_progress
from diffusion.training.module import DiffusionModule
from diffusion.training.option_notes import OptionNote, SayValue

FID, KID = "val/fid", "val/kid"  # the metrics it logs (a checkpoint can monitor them)


class SampleQualityCallback(EveryNValidations):
    """FID and KID of generated samples against the training images, logged as ``val/fid``, ``val/kid``.

    The value is the one ``python -m diffusion.evaluate`` gives for the same samples against the same
    reference: both feed uint8 images to `diffusion.metrics.sample_quality.SampleQuality`.

    Runs at the end of validation (not in the sanity check), so with EMA weights when EMA is on, every
    ``every_n_validations`` validations. ``ModelCheckpoint(monitor="val/fid", mode="min")`` can keep the
    best model. With ``features="pixels"`` the logged value is the pixel-space FD (offline), not Inception FID.

    The real images are the training images as stored, without random augmentation: the data module's
    ``unaugmented_train_set()`` when it has one (`diffusion.data.ImageDataModule` does), else the training
    DataLoader's dataset. With ``reference_stats`` (an .npz of FID statistics, written once by
    ``python -m diffusion.evaluate --reference DATASET --save_stats FILE``) no real image is read at all; KID,
    which needs the real images' features, is then not computed. Under DDP nothing is duplicated and no rank idles: rank r feeds real images
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
        kid: also compute KID (keeps all features in memory); by default whenever real images are read, i.e.
            without ``reference_stats``.
        kid_subset_size: KID subset size (1,000 as in torch-fidelity), capped at the number of images available.
        num_real: real images for the reference statistics (default: num_samples, capped at the train set).
        reference_stats: an .npz of FID statistics (``mu``, ``sigma``) standing in for the real images.
        batch_size: images per sampling / feature batch on each rank.
        inception_weights: a local copy of the InceptionV3 weights (offline clusters).
    """

    acts = "to score samples (FID, KID)"

    def __init__(
        self,
        num_samples: int = 1000,
        features: Features = "inception",
        every_n_validations: int = 1,
        sampling: SamplingOptions = DEFER,
        seed: int = 0,
        kid: bool | None = None,
        kid_subset_size: int = KID_SUBSET_SIZE,
        num_real: int | None = None,
        batch_size: int = SAMPLING_BATCH,
        inception_weights: str | None = None,
        reference_stats: str | None = None,
    ) -> None:
        check_features(features)
        if kid is not None:
            check_bool("kid", kid, "pass kid=True, kid=False, or None (KID unless reference_stats is given)")
        if reference_stats is not None and kid:
            raise InvalidValue(
                "SampleQualityCallback kid=True needs the real images' features, and reference_stats holds only "
                "their mean and covariance",
                "leave kid unset (or False) with reference_stats, or drop reference_stats",
            )
        if reference_stats is not None and num_real is not None:
            raise InvalidValue(
                "SampleQualityCallback num_real picks real images, and with reference_stats none are read",
                "leave num_real out",
            )
        # num_real None: as many as num_samples (0 was read as None, neither refused nor honoured)
        for name, value, low in [
            ("num_samples", num_samples, 2),
            ("kid_subset_size", kid_subset_size, 2),
            ("num_real", 2 if num_real is None else num_real, 2),
            ("batch_size", batch_size, 1),
        ]:
            check_whole_number(name, value)
            if value < low:
                larger = "pass a larger value" + (
                    ", or leave it out: as many as num_samples" if name == "num_real" else ""
                )
                raise OutOfRange(name, value, f">= {low}", larger)
        super().__init__(every_n_validations)
        check_options(sampling, "sampling", "SampleQualityCallback(sampling=SamplingOptions(...))")
        self.num_samples = num_samples
        self.features = features
        self.sampling = DEFER if sampling is None else sampling  # None: the model's own defaults, as DEFER
        self.seed = checked_seed(seed)  # of the samples, the real subset and KID's subsets
        self.kid = kid if kid is not None else reference_stats is None
        self.kid_subset_size = kid_subset_size
        if (
            not self.kid and kid_subset_size != KID_SUBSET_SIZE
        ):  # it did nothing, said as SampleQuality's metrics
            rank_zero_warn(
                OptionNote(partial(_kid_off, kid_subset_size, reference_stats is not None), type(self))
            )
        self.num_real = num_samples if num_real is None else num_real
        self.batch_size = batch_size
        check_inception_weights(inception_weights, features)  # at construction, not at setup after steps
        self.inception_weights = inception_weights
        self.reference_stats = reference_stats
        self.quality: SampleQuality | None = None
        self.last: dict[str, float] = {}  # the latest result (all ranks), with the gathered image counts
        self._real_fed = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        shape = tuple(getattr(pl_module, "sample_shape", ()))
        if len(shape) != 3:
            raise InvalidValue(
                "SampleQualityCallback needs image data (sample shape (C, H, W)), but the model's sample_shape is "
                f"{shape}",
                "FID/KID compare images. Remove the callback for vector data.",
            )
        self.sampling.check_steps_fit(pl_module.schedule.num_timesteps, type(self), "sampling.steps")  # type: ignore[union-attr, arg-type]
        conditional = getattr(pl_module, "num_classes", None) is not None
        dropout = getattr(pl_module, "hparams", {}).get("label_dropout")  # 0: it never learnt to be guided
        self.sampling.check_guidance_fits(conditional, type(self), "sampling.guidance_scale", dropout)
        if self.num_samples < trainer.world_size:
            raise OutOfRange(
                "num_samples", self.num_samples, f">= the world size {trainer.world_size}",
                "pass at least one sample per process",
            )  # fmt: skip
        if self.quality is None:
            # Built here on every rank (not in __init__) so that a bad Inception download or statistics file
            # fails at setup, and so the pixel features know the channel count.
            reference = None
            if self.reference_stats is not None:
                reference = load_statistics(self.reference_stats)
                reference.check_fits(
                    self.features, feature_size(self.features, shape[0]), shape[1:],
                    f"SampleQualityCallback reference_stats {self.reference_stats}",
                )  # fmt: skip
                rank_zero_info(
                    f"SampleQualityCallback: FID against the statistics in {self.reference_stats}; no KID (it needs "
                    "the real images' features, which a statistics file does not hold)"
                )
            self.quality = SampleQuality(
                self.features, ["fid", "kid"] if self.kid else ["fid"], channels=shape[0], reference=reference,
                kid_subset_size=self.kid_subset_size if self.kid else KID_SUBSET_SIZE, inception_weights=self.inception_weights,
            )  # fmt: skip

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: DiffusionModule) -> None:  # type: ignore[override]
        if not self.is_due(trainer):
            return
        # self.quality is made in setup.
        self.quality.to(pl_module.device)  # type: ignore[union-attr]  # no-op after the first time (the module moves after setup)
        if not self._real_fed and self.reference_stats is None:
            self._feed_real(trainer, pl_module)
            self._real_fed = True
        self._feed_generated(trainer, pl_module)
        result = self.quality.compute(self.seed)  # type: ignore[union-attr]
        self.quality.reset()  # type: ignore[union-attr]  # generated features only (the real side stays); also clears the cached values
        self.last = result
        # Every rank computed the same value from the same gathered states; sync_dist averages identical
        # numbers (exact) and spares Lightning's "use sync_dist=True" warning. Logged on every rank so a
        # ModelCheckpoint monitoring val/fid finds it wherever it runs.
        pl_module.log(FID, result["fid"], sync_dist=True)
        if self.kid:
            pl_module.log(KID, result["kid_mean"], sync_dist=True)
        against = (
            f"{result['num_real']} real images" if self.reference_stats is None
            else f"the statistics in {self.reference_stats}"
        )  # fmt: skip
        rank_zero_info(
            f"step {trainer.global_step}: {distance_name(self.features)} {result['fid']:.4g} from "
            f"{result['num_fake']} generated and {against}"
        )

    def _feed_real(self, trainer: L.Trainer, pl_module: DiffusionModule) -> None:
        dataset: Any = _train_dataset(trainer)  # a map-style dataset: it has a length
        num_real = min(self.num_real, len(dataset))
        # A fixed random subset rather than the first items: folders sorted by class would bias those.
        subset = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(self.seed))
        shard = subset[rank_indices(num_real, pl_module.global_rank, trainer.world_size)]
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
            sampler=pl_module.sampler(self.sampling),
            seed=self.seed,
            batch_size=self.batch_size,
            labels=labels,
            progress=shows_progress(trainer),  # thousands of samples: minutes, with a bar over the batches
        ):
            self._update(samples, pl_module, real=False)

    def _update(self, images: torch.Tensor, pl_module: DiffusionModule, real: bool) -> None:
        finite = images if real else drawn_anyway(images, "the quality metrics")
        uint8 = to_uint8(finite.to(pl_module.device), pl_module.normalization)  # (N, C, H, W)
        self.quality.update(uint8, real=real)  # type: ignore[union-attr]  # made in setup


def _train_dataset(trainer: L.Trainer) -> Dataset:
    """The training set (items ``x`` or ``(x, ...)`` in model units) without random augmentation when the
    datamodule offers it (``unaugmented_train_set``), else the dataset of the training DataLoader."""
    datamodule = trainer.datamodule  # type: ignore[attr-defined]  # set at run time by Lightning
    if datamodule is not None and hasattr(datamodule, "unaugmented_train_set"):
        return datamodule.unaugmented_train_set()
    loader = datamodule.train_dataloader() if datamodule is not None else trainer.train_dataloader
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "__len__"):
        raise InvalidValue(
            "SampleQualityCallback takes real images from the training DataLoader's dataset, but got "
            f"{type(loader).__name__}",
            "give it reference_stats (FID statistics) instead, or a data module whose train_dataloader has one",
        )
    return dataset


FIDCallback = SampleQualityCallback
"""The name configs of earlier versions give it (`diffusion.training.callbacks.FIDCallback`)."""


def _kid_off(subset_size: int, by_statistics: bool, option: SayValue) -> str:
    """The note on a KID subset size given with no KID computed, each option said by `option`."""
    why = "reference_stats holds no real images' features" if by_statistics else option("kid", False)
    fix = "drop reference_stats and " if by_statistics else ""
    return (
        f"{option('kid_subset_size', subset_size)} not used: no KID is computed ({why}) — {fix}pass "
        f"{option('kid', True)} to compute it, or leave kid_subset_size out"
    )
