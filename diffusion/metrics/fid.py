"""The Fréchet distance of two feature sets (FID with Inception features; Heusel et al. 2017), from their
statistics: either both sets' features, or the generated ones against fixed reference statistics (a
`FeatureStatistics` file), through one formula.

`FrechetDistance` keeps torchmetrics' FID states (float64 feature sums and sums of outer products per set,
summed over ranks when distributed) and takes already extracted pool features, so one pass of the extractor
feeds FID, KID and IS together (`diffusion.metrics.sample_quality`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torchmetrics.image.fid import FrechetInceptionDistance

from diffusion.errors import InvalidValue, OutOfRange, WrongType
from diffusion.metrics.reference_stats import FeatureStatistics, check_covariance


def frechet_distance(
    mu1: torch.Tensor, sigma1: torch.Tensor, mu2: torch.Tensor, sigma2: torch.Tensor
) -> torch.Tensor:
    """||mu1 - mu2||^2 + tr(sigma1 + sigma2 - 2 (sigma1 sigma2)^(1/2)), in float64.

    The trace of the matrix square root is the sum of the square roots of the eigenvalues of sigma1 @ sigma2
    (as torchmetrics computes it): the product is similar to the positive semi-definite
    sigma1^(1/2) sigma2 sigma1^(1/2), so its eigenvalues are real and >= 0 up to rounding; the real part of
    the complex square root drops the rounding's tiny negative ones (singular covariances, e.g. blank pixels).
    """
    mu1, sigma1, mu2, sigma2 = checked_statistics(mu1=mu1, sigma1=sigma1, mu2=mu2, sigma2=sigma2)
    return distance(mu1, sigma1, mu2, sigma2)


def distance(
    mu1: torch.Tensor, sigma1: torch.Tensor, mu2: torch.Tensor, sigma2: torch.Tensor
) -> torch.Tensor:
    """The formula, on checked float64 statistics."""
    eigenvalues = torch.linalg.eigvals(sigma1 @ sigma2)
    trace_sqrt = eigenvalues.sqrt().real.sum()
    return (mu1 - mu2).square().sum() + sigma1.trace() + sigma2.trace() - 2 * trace_sqrt


def checked_statistics(values: bool = True, **given: object) -> list[torch.Tensor]:
    """`frechet_distance`'s arguments as float64 tensors (numpy arrays too: a statistics file's `mu` and `sigma`),
    each mean (D,) and covariance (D, D) of one D, refused by name otherwise; with `values`, finite and each sigma
    a covariance (`check_covariance`). `FrechetDistance` leaves the values unchecked, as they are its own: its
    covariances of summed outer products are covariances by construction, and for near-identical features their
    cancellation's rounding may be all there is of them, which no tolerance relative to their size would take."""
    tensors = {}
    for name, value in given.items():
        if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.number):
            value = torch.from_numpy(value)
        if not isinstance(value, torch.Tensor) or value.dtype == torch.bool or value.is_complex():
            raise WrongType(
                name, value, "a tensor or array of numbers", "pass a mean (D,) and a covariance (D, D)"
            )
        tensors[name] = value.double()
    size = len(tensors["mu1"]) if tensors["mu1"].ndim == 1 else None
    if size == 0:  # statistics of no features: torch's reduction error in the formula
        raise OutOfRange(
            "mu1", "<shape (0,)>", "the mean of D >= 1 features",
            "pass statistics of the features of at least one sample set (torch.cov(features.T) of (N, D) features)",
        )  # fmt: skip
    for name, value in tensors.items():
        shape = (size,) if name.startswith("mu") else (size, size)
        if size is None or value.shape != shape:
            raise OutOfRange(
                name, f"<shape {tuple(value.shape)}>", f"of shape {shape if size else '(D,)'}",
                "pass both sets' means (D,) and covariances (D, D) of one feature space",
            )  # fmt: skip
    for name, value in tensors.items() if values else ():
        if not bool(torch.isfinite(value).all()):
            raise InvalidValue(
                f"{name} holds values that are not finite (NaN or infinity)",
                "pass the statistics of features that are all finite (samples of a model that diverged have none)",
            )
        if name.startswith("sigma"):
            check_covariance(name, value)
    return list(tensors.values())


class GivenFeatures(nn.Module):
    """The 'extractor' of a metric fed features already extracted: passes them on (``num_features`` spares
    torchmetrics a dummy forward pass)."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features


def check_image_count(metric: str, count: int, real: bool) -> None:
    """A metric's images of one side (real or generated) are enough to compute it: at least 2, for a covariance
    (FID) or KID's unbiased estimator; said with the call that feeds them (`SampleQuality.update`'s)."""
    if count < 2:
        side, which = ("real", "the reference images") if real else ("generated", "the samples")
        raise InvalidValue(
            f"{metric} needs at least 2 {side} images, got {count}",
            f"feed {which} with update(images, real={real}) before compute(), 2 or more in all",
        )


class FrechetDistance(FrechetInceptionDistance):
    """torchmetrics' FID over given (N, num_features) features: ``update(features, real=...)``.

    Real statistics survive ``reset()``: they are computed once and each evaluation feeds only generated
    features. With ``reference``, the real side is those fixed statistics and no real features are fed.
    ``metric_kwargs`` are torchmetrics' Metric options (e.g. ``compute_on_cpu``).
    """

    def __init__(
        self, num_features: int, reference: FeatureStatistics | None = None, **metric_kwargs: Any
    ) -> None:
        if reference is not None and reference.size != num_features:
            raise ValueError(f"reference statistics are {reference.size}-d, the features {num_features}-d")
        super().__init__(feature=GivenFeatures(num_features), reset_real_features=False, **metric_kwargs)
        self.reference = reference

    def update(self, features: torch.Tensor, real: bool) -> None:
        if real and self.reference is not None:
            raise InvalidValue(
                "real=True: this FrechetDistance compares with fixed reference statistics,"
                " which stand for the real features",
                "feed generated features as update(features, real=False),"
                " or build FrechetDistance without reference= to feed real ones",
            )
        super().update(features, real)

    def statistics(self, real: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean (D,) and unbiased covariance (D, D) in float64 of the fed real or generated features (of this
        process; inside ``compute`` they are the states summed over ranks)."""
        count = self.real_features_num_samples if real else self.fake_features_num_samples
        check_image_count("FID", int(count), real)
        total = self.real_features_sum if real else self.fake_features_sum
        outer = self.real_features_cov_sum if real else self.fake_features_cov_sum
        mean = total / count
        covariance = (outer - count * torch.outer(mean, mean)) / (count - 1)
        return mean, covariance

    def reference_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The real side: the fixed reference, or the statistics of the fed real features."""
        if self.reference is None:
            return self.statistics(real=True)
        device = self.fake_features_sum.device
        return (
            torch.from_numpy(self.reference.mu).to(device),
            torch.from_numpy(self.reference.sigma).to(device),
        )

    def compute(self) -> torch.Tensor:
        (mu1, sigma1), (mu2, sigma2) = self.reference_statistics(), self.statistics(real=False)
        return distance(*checked_statistics(False, mu1=mu1, sigma1=sigma1, mu2=mu2, sigma2=sigma2))

    def feature_statistics(self, **provenance: Any) -> FeatureStatistics:
        """The fed real features' statistics as a `FeatureStatistics` (to save as a reference file);
        ``provenance``: its ``features``, ``num_images`` and ``image_size``."""
        mean, covariance = self.statistics(real=True)
        return FeatureStatistics(
            mean.cpu().numpy().astype(np.float64), covariance.cpu().numpy().astype(np.float64), **provenance
        )
