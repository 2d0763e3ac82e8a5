"""FID, KID and IS of generated images: the one computation `python -m diffusion.evaluate` and
`diffusion.training.callbacks.SampleQualityCallback` both run, so a value logged during training and the
evaluator's on the same images against the same reference are the same number.

`SampleQuality` holds a feature extractor (`diffusion.metrics.features`) and the metrics fed from its single
pass over each batch: FID (`diffusion.metrics.fid`, torchmetrics' states), KID (torchmetrics) and the
Inception Score (`diffusion.metrics.inception_score`). The real side of FID is either real images fed once
(their statistics survive ``reset``) or a statistics file (`diffusion.metrics.reference_stats`).

The protocol of the papers (Ho et al. 2020, Sec. 4; Nichol & Dhariwal 2021; Karras et al. 2022): FID of
50,000 samples against the statistics of the whole training set (CIFAR-10: its 50,000 training images,
unaugmented), KID with subsets of 1,000, IS of the same 50,000 samples in 10 splits. FID is biased upwards
at smaller sample counts (10,000 samples score several points higher than 50,000), so compare with a paper
only at 50,000 samples against the same reference set; smaller counts compare runs with each other.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.image.kid import KernelInceptionDistance
from torchmetrics.utilities.distributed import gather_all_tensors

from diffusion.errors import (
    InvalidValue,
    OutOfRange,
    UserError,
    WrongType,
    check_bool,
    check_whole_number,
)
from diffusion.generation.arguments import checked_seed
from diffusion.generation.image_grid import (
    FROM_SAMPLES,
    HALF_A_LEVEL,
    check_channels_first,
    check_images,
    check_some_pixels,
)
from diffusion.metrics.features import (
    Features,
    check_features,
    check_inception_weights,
    feature_size,
    make_feature_extractor,
)
from diffusion.metrics.fid import FrechetDistance, GivenFeatures, check_image_count
from diffusion.metrics.inception_score import IS_SPLITS, InceptionScore
from diffusion.metrics.progress import progress_bar
from diffusion.metrics.reference_stats import FeatureStatistics

QualityMetric = Literal["fid", "kid", "is"]
KID_SUBSET_SIZE = 1000  # torch-fidelity's and Binkowski et al. 2018's


FEATURE_BATCH = 250  # images through a feature extractor at once (the evaluate command's --batch_size)

# The options torchmetrics' Metric.__init__ pops from its keywords (1.x); it refuses any other, without naming them.
METRIC_OPTIONS = (
    "compute_on_cpu",
    "dist_sync_on_step",
    "process_group",
    "dist_sync_fn",
    "distributed_available_fn",
    "sync_on_compute",
    "compute_with_cache",
)


class UnexpectedKeyword(UserError, TypeError):
    """A keyword argument the function does not take: a TypeError, as Python's own for a bad keyword."""


def check_metric_options(options: dict[str, Any]) -> None:
    """Refuse keywords that are not torchmetrics' Metric options, naming them and the ones accepted, and options of
    the wrong kind by their name (torchmetrics' ValueError gave no fix; a function option not callable, none)."""
    unknown = [name for name in options if name not in METRIC_OPTIONS]
    if unknown:
        raise UnexpectedKeyword(
            f"SampleQuality got unexpected keyword arguments {unknown}",
            "pass only its own arguments (features, metrics, channels, reference, kid_subset_size, kid_subsets, "
            f"is_splits, inception_weights) and torchmetrics' Metric options: {', '.join(METRIC_OPTIONS)}",
        )
    for name, value in options.items():
        if name.endswith("_fn") and value is not None and not callable(value):
            raise WrongType(name, value, "a function or None", f"pass {name} as a function, or leave it out")
        if name not in ("process_group", "dist_sync_fn", "distributed_available_fn"):
            check_bool(name, value)


def check_reference(reference: object, features: str, size: int) -> None:
    """`reference` is None or `FeatureStatistics` of `features` of length `size`: a statistics file's path was
    taken for them and failed in an AttributeError naming nothing, and other features of the same length were
    compared without a word."""
    if reference is None:
        return
    if not isinstance(reference, FeatureStatistics):
        fix = (
            f"pass load_statistics({os.fspath(reference)!r}), the statistics that file holds"
            if isinstance(reference, str | os.PathLike)
            else "pass load_statistics(path) of a statistics .npz, another SampleQuality's real_statistics(), "
            "or None to feed the real images with update(images, real=True)"
        )
        raise WrongType("reference", reference, "FeatureStatistics (or None)", fix)
    if reference.features not in (None, features):
        raise InvalidValue(
            f"reference holds statistics of {reference.features} features, not {features}",
            f"build SampleQuality(features={reference.features!r}), or pass statistics of {features} features",
        )
    if reference.size != size:
        raise InvalidValue(
            f"reference holds {reference.size}-d statistics, and {features} features of these images are "
            f"{size}-d",
            "pass statistics of the same features and channels (load_statistics of a file evaluate wrote for them)",
        )


# The options of one metric, with their defaults: given otherwise without that metric, they are warned unused.
METRIC_OF_OPTION = {
    "kid_subset_size": ("kid", KID_SUBSET_SIZE),
    "kid_subsets": ("kid", 100),
    "is_splits": ("is", IS_SPLITS),
}
METRIC_NAMES = {"kid": "KID", "is": "Inception Score"}


def note_unused_options(metrics: list[str], **given: int) -> None:
    """A UserWarning for each option of a metric `metrics` leaves out, given a value other than its default (as the
    project's other notes count an option given): it does nothing, and the caller may have meant that metric."""
    for name, value in given.items():
        metric, default = METRIC_OF_OPTION[name]
        if metric not in metrics and value != default:
            warnings.warn(
                f"{name}={value} is not used: metrics={metrics} computes no {METRIC_NAMES[metric]} — add "
                f"{metric!r} to metrics to compute it, or leave {name} out",
                stacklevel=3,
            )


class SampleQuality(nn.Module):
    """FID, KID and IS of uint8 (N, C, H, W) images fed with ``update(images, real=...)``.

    Args:
        features: "inception" (the papers' features) or "pixels" (offline 8x8 pixels; no IS).
        metrics: which of "fid", "kid", "is" ``compute`` reports. IS is of the generated images alone.
        channels: the images' channel count (sizes the pixel features).
        reference: fixed FID statistics for the real side, ``load_statistics(path)`` (not the path), of these
            features and channels (no real images are fed then; no KID).
        kid_subset_size: KID's subset size, capped at the image counts when computed.
        kid_subsets: how many random subsets KID averages.
        is_splits: the Inception Score's splits (10, as the papers).
        inception_weights: a local copy of the InceptionV3 weights (offline machines).
        metric_kwargs: torchmetrics' Metric options (`METRIC_OPTIONS`, e.g. ``compute_on_cpu``), for every metric;
            any other keyword is refused (a TypeError).
    """

    def __init__(
        self,
        features: Features = "inception",
        metrics: Sequence[QualityMetric] = ("fid", "kid"),
        *,
        channels: int = 3,
        reference: FeatureStatistics | None = None,
        kid_subset_size: int = KID_SUBSET_SIZE,
        kid_subsets: int = 100,
        is_splits: int = IS_SPLITS,
        inception_weights: str | None = None,
        **metric_kwargs: Any,
    ) -> None:
        super().__init__()
        check_metric_options(metric_kwargs)
        check_features(features)
        names = list(get_args(QualityMetric))
        if isinstance(metrics, str):  # iterated, "fid" would be the metrics 'f', 'i', 'd'
            raise WrongType("metrics", metrics, "a list of metric names", f"pass metrics=[{metrics!r}]")
        if not isinstance(metrics, Iterable):  # iterating it was a TypeError naming nothing
            raise WrongType("metrics", metrics, "a list of metric names", "pass e.g. metrics=['fid']")
        metrics = list(metrics)  # read once: a generator was used up by the checks, and no metric reported
        unknown = [name for name in metrics if name not in names]
        if unknown:
            raise InvalidValue(f"unknown metrics {unknown}", f"choose from {names}")
        if not metrics:  # compute would return the image counts and no metric
            raise InvalidValue("metrics=[] names no metric", f"name some of {names}, e.g. metrics=['fid']")
        repeated = next((name for name in metrics if list(metrics).count(name) > 1), None)
        if repeated is not None:  # computed once: the repeat would be taken as once, without a word
            times = list(metrics).count(repeated)
            raise InvalidValue(
                f"metrics={list(metrics)} has {repeated!r} {'twice' if times == 2 else f'{times} times'}",
                f"name each metric once: metrics={list(dict.fromkeys(metrics))}",
            )
        channels = check_whole_number("channels", channels, fix="pass the images' channel count: 1 or 3")
        if channels not in (1, 3):  # images are gray or RGB: what to_uint8 gives and Inception reads
            raise OutOfRange("channels", channels, "1 (gray) or 3 (RGB)", "pass the images' channel count")
        check_reference(reference, features, feature_size(features, channels))  # before the weights load
        if "is" in metrics and features != "inception":
            raise InvalidValue(
                f"the Inception Score needs Inception features (the classifier's logits), not {features}",
                "use features='inception' or leave 'is' out",
            )
        if "kid" in metrics and reference is not None:
            raise InvalidValue(
                "KID needs the reference images' features, and FID statistics hold only their mean and "
                "covariance",
                "leave 'kid' out or compare with reference images",
            )
        # Checked before the extractor is built: the Inception weights load (or download) in seconds.
        fix = "pass e.g. 1000 (torch-fidelity's; capped at the image counts when computed)"
        check_whole_number("kid_subset_size", kid_subset_size, fix=fix)
        if kid_subset_size < 2:
            raise OutOfRange("kid_subset_size", kid_subset_size, ">= 2 (KID's unbiased estimator)", fix)
        check_whole_number("kid_subsets", kid_subsets, 1, fix="pass e.g. 100 (torch-fidelity's)")
        check_whole_number("is_splits", is_splits, 1, fix=f"pass e.g. {IS_SPLITS} (the papers')")
        check_inception_weights(inception_weights, features)
        note_unused_options(
            list(metrics), kid_subset_size=kid_subset_size, kid_subsets=kid_subsets, is_splits=is_splits
        )
        self.features = features
        self.channels = channels
        self.reported = tuple(metrics)
        self.kid_subset_size = kid_subset_size
        self.extractor = make_feature_extractor(features, channels, inception_weights)
        size = self.extractor.num_features
        # FID's states are always kept: they hold the image counts and the statistics --save_stats writes.
        self.fid = FrechetDistance(size, reference, **metric_kwargs)
        self.kid: KernelInceptionDistance | None = None
        if "kid" in metrics:
            with warnings.catch_warnings():
                # KID keeps every feature vector (N x 2048 floats: 8 MB per 1000 images); no need to warn.
                warnings.filterwarnings("ignore", message=".*will save all extracted features in buffer.*")
                # Not cached: torchmetrics returns a cached compute() until the next update, so a compute under
                # another seed gave the first seed's subsets without a word.
                self.kid = KernelInceptionDistance(
                    feature=GivenFeatures(size), subsets=kid_subsets, subset_size=kid_subset_size,
                    reset_real_features=False, **{**metric_kwargs, "compute_with_cache": False},
                )  # fmt: skip
        self.inception_score = InceptionScore(is_splits, **metric_kwargs) if "is" in metrics else None

    @property
    def reference(self) -> FeatureStatistics | None:
        return self.fid.reference

    def update(self, images: torch.Tensor, real: bool) -> None:
        """Feed uint8 (N, C, H, W) images in 0..255 (`to_uint8(samples, module.normalization)`): one extractor pass
        for every metric. Pixel features take float images in [0, 1] too; anything else is refused, not scored."""
        check_bool("real", real)
        if real and self.reference is not None:  # said before the extractor's pass, in this class's words
            raise InvalidValue(
                "real=True: this SampleQuality compares with fixed reference statistics (reference=),"
                " which stand for the real images",
                "feed generated images as update(images, real=False),"
                " or build SampleQuality without reference= to feed real images",
            )
        self._check_images(images)
        with torch.no_grad():
            pool, logits = self.extractor(images)
        self.fid.update(pool, real=real)
        if self.kid is not None:
            self.kid.update(pool, real=real)
        if self.inception_score is not None and not real:
            self.inception_score.update(logits)

    def _check_images(self, images: torch.Tensor) -> None:
        """`images` are pixels this scores as the caller meant: (N, channels, H, W), uint8 or (pixel features) float
        in [0, 1] up to half a pixel level. Samples in model units (-1..1) or floats 0..255 gave another FID without
        a word. A range check reads every value once, far less than the features cost. No images at all are
        refused: a caller's empty slice was fed as nothing without a word."""
        check_images(images, FROM_SAMPLES)
        check_some_pixels(images)
        if images.shape[1] != self.channels:
            check_channels_first(images, (self.channels,))
            built = (
                f", or build SampleQuality(channels={images.shape[1]})" if images.shape[1] in (1, 3) else ""
            )
            raise InvalidValue(
                f"images has {images.shape[1]} channels (shape {tuple(images.shape)}), and this SampleQuality "
                f"was built for channels={self.channels}",
                f"pass images of {self.channels} channel(s){built}",
            )
        if images.dtype == torch.uint8:
            return
        samples = "samples as to_uint8(samples, module.normalization) (model units -> uint8 pixels)"
        if not images.is_floating_point():
            raise InvalidValue(
                f"images are {images.dtype} values, not uint8 images in 0..255 or float images in [0, 1]",
                f"pass {samples}, or pixels 0..255 as images.to(torch.uint8)",
            )
        if self.features == "inception":  # Inception reads uint8 pixels (torch-fidelity's extractor)
            raise InvalidValue(
                f"images are {images.dtype} values, and features='inception' takes uint8 images in 0..255",
                f"pass {samples}, or images in [0, 1] as images.mul(255).round().to(torch.uint8)",
            )
        low, high = (float(value) for value in torch.aminmax(images.detach()))
        if math.isnan(low) or math.isnan(high):
            raise InvalidValue("images holds NaN values, which are no pixels", FROM_SAMPLES)
        if low < -HALF_A_LEVEL or high > 1 + HALF_A_LEVEL:
            raise InvalidValue(
                f"images holds values from {low:.4g} to {high:.4g}, outside [0, 1] "
                "(float images are pixels in [0, 1]; samples in model units are -1..1)",
                FROM_SAMPLES,
            )

    def compute(self, seed: int = 0) -> dict[str, float]:
        """The reported metrics (``fid``; ``kid_mean``, ``kid_std``; ``is_mean``, ``is_std``) and the image
        counts ``num_fake`` and ``num_real`` (absent when a statistics file does not say), over all ranks.

        A collective when distributed (torchmetrics gathers the states in ``compute``): every rank must call
        it, and every rank gets the same values. KID draws its random subsets under ``seed`` in a forked RNG,
        so ranks agree and training randomness is left untouched.
        """
        seed = checked_seed(
            seed, "it draws KID's random subsets"
        )  # torch took -1 as 2**64 - 1 without a word
        num_fake = _gathered_sum(self.fid, self.fid.fake_features_num_samples)
        num_real: int | None
        if self.reference is None:
            num_real = _gathered_sum(self.fid, self.fid.real_features_num_samples)
        else:
            num_real = self.reference.num_images
        result: dict[str, float] = {"num_fake": num_fake}
        if num_real is not None:
            result["num_real"] = num_real
        if "fid" in self.reported:
            result["fid"] = float(self.fid.compute())
        if self.kid is not None:
            # torchmetrics' KID failed on none ("No samples to concatenate") and gave NaN for one; num_real is
            # the images fed (KID takes no reference statistics)
            check_image_count("KID", num_real or 0, real=True)
            check_image_count("KID", num_fake, real=False)
            # KID's subsets are drawn from all gathered features: they cannot outnumber them.
            # KID takes no reference statistics: num_real is the gathered count.
            self.kid.subset_size = min(self.kid_subset_size, num_real, num_fake)  # type: ignore[type-var, assignment]
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                kid_mean, kid_std = self.kid.compute()
            result.update(kid_mean=float(kid_mean), kid_std=float(kid_std))
        if self.inception_score is not None:
            is_mean, is_std = self.inception_score.compute()
            result.update(is_mean=float(is_mean), is_std=float(is_std))
        return result

    def reset(self) -> None:
        """Forget the generated images (also the cached values); the real side stays."""
        for metric in self.metrics():
            metric.reset()

    def metrics(self) -> list[Metric]:
        return [m for m in (self.fid, self.kid, self.inception_score) if m is not None]

    def real_statistics(self, image_size: tuple[int, int] | None = None) -> FeatureStatistics:
        """The statistics of the real images fed so far (this process's), as a reference file holds them."""
        count = int(self.fid.real_features_num_samples)
        return self.fid.feature_statistics(features=self.features, num_images=count, image_size=image_size)


def feed_images(
    quality: SampleQuality,
    images: np.ndarray,
    real: bool,
    batch_size: int = FEATURE_BATCH,
    device: str | torch.device = "cpu",
    description: str = "features",
) -> None:
    """Feed uint8 (N, H, W, C) images (the samples-file layout) in batches, with a progress bar on a
    terminal."""
    with progress_bar(len(images), description) as bar:
        for start in range(0, len(images), batch_size):
            batch = torch.from_numpy(images[start : start + batch_size]).permute(0, 3, 1, 2)  # (B, C, H, W)
            quality.update(batch.to(device), real=real)
            bar.update(len(batch))


def _gathered_sum(metric: Metric, count: torch.Tensor) -> int:
    """A count state summed over ranks, as the metric's own sync sums it (shows what was fed in total)."""
    if metric.distributed_available_fn():
        return int(sum(gather_all_tensors(count)))
    return int(count)
