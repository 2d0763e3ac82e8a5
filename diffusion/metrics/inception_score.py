"""The Inception Score (Salimans et al. 2016) of generated images, from their Inception logits:
IS = exp(E_x KL(p(y|x) || p(y))), with p(y|x) the softmax of an image's logits and p(y) its mean over the images
of a split; the score is the mean (and standard deviation) over 10 splits.

The protocol of the papers (Ho et al. 2020 report 9.46 ± 0.11 on CIFAR-10): 50,000 samples in 10 consecutive
splits of 5,000, the standard deviation over the splits' scores with NumPy's default ddof=0 — the original
code's computation, which torch-fidelity's ``isc_features_to_metric`` performs (in float64) and which is used
here with ``shuffle=False``: samples are drawn independently, so consecutive splits are random splits already,
and the score does not depend on a shuffling seed. The logits are those of the TF Inception graph's
1008-class head without its bias (`diffusion.metrics.features.InceptionFeatures`), as in the original code.
"""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from diffusion.errors import InvalidValue, OutOfRange

IS_SPLITS = 10


class InceptionScore(Metric):
    """IS of the images whose logits (N, classes) are fed with ``update``; ``compute`` returns (mean, std)
    over ``splits`` splits. Keeps every image's logits (4 KB each), gathered over ranks when distributed."""

    full_state_update = False
    higher_is_better = True

    logits: list[torch.Tensor]  # the metric's state (add_state), declared for the type checker

    def __init__(self, splits: int = IS_SPLITS, **metric_kwargs: Any) -> None:
        super().__init__(**metric_kwargs)
        if splits < 1:
            raise OutOfRange("splits", splits, ">= 1")
        self.splits = splits
        self.add_state("logits", [], dist_reduce_fx="cat")

    def update(self, logits: torch.Tensor) -> None:
        self.logits.append(logits.float())

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        from torch_fidelity.metric_isc import isc_features_to_metric

        logits = dim_zero_cat(self.logits)
        if len(logits) < self.splits:
            raise InvalidValue(
                f"the Inception Score splits the samples into {self.splits} parts, so it needs at least "
                f"{self.splits} samples, got {len(logits)}",
                "feed more samples with update(images, real=False) before compute(), "
                "or split them into fewer parts (SampleQuality's is_splits)",
            )
        score = isc_features_to_metric(logits.cpu(), splits=self.splits, shuffle=False)
        mean, std = score["inception_score_mean"], score["inception_score_std"]
        return torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
