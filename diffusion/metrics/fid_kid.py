"""Sample quality: FID and KID (torchmetrics) with Inception or pixel features. Imports nothing of training:
`diffusion.training.callbacks.FIDCallback` and `python -m diffusion.evaluate` both build on it.

Two feature extractors, both taking uint8 images (N, C, H, W) in 0..255, the range the samples file holds
(images pass through `diffusion.generation.render.to_uint8` first, so the callback, the sample CLI and the evaluator
all score the same quantized pixels):

- ``"inception"``: the standard FID/KID. `InceptionFeatures` is torch-fidelity's own FID feature
  extractor (``FeatureExtractorInceptionV3``, "inception-v3-compat", 2048-d pool features), used as is:
  uint8 in, TensorFlow-1-compatible bilinear resize to 299 x 299, (x - 128) / 128, the TF Inception graph's
  weights. That is the computation of TTUR's ``fid.py``, which Ho et al. 2020 and most papers report.
  torchmetrics' default ``FrechetInceptionDistance(feature=2048)`` resizes with torch's antialiased
  bilinear instead (``antialias=True``), whose values are not comparable with papers. Its weights (~92 MB)
  are downloaded from GitHub on first use (``pip install -e ".[fid]"`` for torch-fidelity); offline, give a
  local copy with ``inception_weights``. Grayscale images are repeated to 3 channels (what torch-fidelity's
  PIL ``convert("RGB")`` does with image files).
- ``"pixels"``: `PixelFeatures`, offline and deterministic: images area-averaged to 8x8 per channel, in
  scikit-learn's digits range 0..16. The Fréchet distance on these is the pixel-space FD of the digits
  quality benchmark (two halves of the real digits score about 16.3, the floor a model can reach).

The protocol of the papers (Ho et al. 2020, Sec. 4; Nichol & Dhariwal 2021; Karras et al. 2022): FID of
50,000 samples against the statistics of the whole training set (CIFAR-10: its 50,000 training images,
unaugmented), KID with subsets of 1,000. FID is biased upwards at smaller sample counts (10,000 samples
score several points higher than 50,000), so compare with a paper only at 50,000 samples against the same
reference set; smaller counts compare runs with each other. Both real sets here are the training images as
stored: ``python -m diffusion.evaluate --reference cifar10`` renders the whole train split, and
`FIDCallback` draws its real images from the data module's `unaugmented_train_set` (no random flips).
"""

from __future__ import annotations

import warnings
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.kid import KernelInceptionDistance
from torchmetrics.utilities.distributed import gather_all_tensors

Features = Literal["inception", "pixels"]


class PixelFeatures(nn.Module):
    """Images area-averaged (`adaptive_avg_pool2d`) to size x size per channel and flattened, in 0..16.

    torchmetrics hands a custom feature module the images exactly as given to `update` (its ``normalize``
    flag only converts for its own Inception), so both ranges are accepted: uint8 in 0..255 (what this
    project passes) maps to value / 255 * 16, floats are taken as 0..1 and map to value * 16.
    ``num_features`` lets torchmetrics size its states without a dummy forward pass on 3 x 299 x 299.
    """

    def __init__(self, size: int = 8, channels: int = 1) -> None:
        super().__init__()
        if size < 1 or channels < 1:
            raise ValueError(f"PixelFeatures needs size >= 1 and channels >= 1, got {size=}, {channels=}")
        self.size = size
        self.channels = channels
        self.num_features = channels * size * size

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or images.shape[1] != self.channels:
            raise ValueError(
                f"PixelFeatures(channels={self.channels}) expects images (N, {self.channels}, H, W), "
                f"got shape {tuple(images.shape)}"
            )
        scale = 16 / 255 if images.dtype == torch.uint8 else 16.0
        pooled = F.adaptive_avg_pool2d(images.float() * scale, self.size)  # (N, C, size, size)
        return pooled.flatten(1)  # (N, C * size * size)


class InceptionFeatures(nn.Module):
    """torch-fidelity's FID feature extractor (InceptionV3, 2048-d pool features; see the module docstring)
    for uint8 (N, 1 or 3, H, W) images; it resizes to 299 x 299 itself. Downloads its weights on first use
    unless ``weights_path`` points at a local copy. The network stays in eval mode (its batch norms use
    their stored statistics) whatever ``train()`` is called on a metric holding it."""

    num_features = 2048

    def __init__(self, weights_path: str | None = None) -> None:
        super().__init__()
        try:
            from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
        except ImportError as err:
            raise ModuleNotFoundError(
                "features='inception' needs torch-fidelity: pip install -e '.[fid]' (or use features='pixels')"
            ) from err
        try:
            self.network = FeatureExtractorInceptionV3(
                "inception-v3-compat", ["2048"], feature_extractor_weights_path=weights_path
            )
        except OSError as err:  # urllib's URLError is an OSError: no network, or a bad weights_path
            raise RuntimeError(
                f"could not load the InceptionV3 weights ({err}). They are downloaded from GitHub on first use; "
                "offline, pass a local copy (inception_weights / --inception_weights) or use features='pixels'"
            ) from err

    def train(self, mode: bool = True) -> InceptionFeatures:
        super().train(mode)
        self.network.eval()
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or images.shape[1] not in (1, 3) or images.dtype != torch.uint8:
            raise ValueError(
                "Inception features need uint8 (N, 1 or 3, H, W) images in 0..255 (to_uint8_images), got "
                f"{images.dtype} of shape {tuple(images.shape)}"
            )
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)  # grayscale -> RGB: Inception was trained on colour
        return self.network(images)[0]  # (N, 2048) float32


def make_feature_extractor(
    features: Features = "inception", channels: int = 3, inception_weights: str | None = None
) -> nn.Module:
    if features not in get_args(Features):
        raise ValueError(f"unknown features {features!r}; choose one of {get_args(Features)}")
    if features == "pixels":
        return PixelFeatures(size=8, channels=channels)
    return InceptionFeatures(inception_weights)


def make_metrics(
    features: Features = "inception",
    kid_subset_size: int = 1000,
    *,
    channels: int = 3,
    kid_subsets: int = 100,
    inception_weights: str | None = None,
    **metric_kwargs,
) -> dict[str, Metric]:
    """``{"fid": FrechetInceptionDistance, "kid": KernelInceptionDistance}`` sharing one feature module.

    Feed both uint8 (N, C, H, W) images with ``update(images, real=...)``. Real statistics survive
    ``reset()`` (``reset_real_features=False``), so they are computed once and each evaluation feeds only
    generated images. ``channels`` sizes the pixel features; ``metric_kwargs`` (torchmetrics' Metric options,
    e.g. ``compute_on_cpu``) go to both. KID needs at least ``kid_subset_size`` real and generated images
    (1,000 by default, as torch-fidelity and Binkowski et al. 2018; callers cap it at the image counts).
    """
    if kid_subset_size < 2:
        raise ValueError(f"kid_subset_size={kid_subset_size} must be >= 2 (KID's unbiased estimator)")
    extractor = make_feature_extractor(features, channels, inception_weights)
    fid = FrechetInceptionDistance(feature=extractor, reset_real_features=False, **metric_kwargs)
    with warnings.catch_warnings():
        # KID keeps every feature vector (N x 2048 floats: 8 MB per 1000 images); no need to warn each time.
        warnings.filterwarnings("ignore", message=".*will save all extracted features in buffer.*")
        kid = KernelInceptionDistance(
            feature=extractor, subsets=kid_subsets, subset_size=kid_subset_size,
            reset_real_features=False, **metric_kwargs,
        )  # fmt: skip
    return {"fid": fid, "kid": kid}


def compute_metrics(metrics: dict[str, Metric], seed: int = 0) -> dict[str, float]:
    """FID (and KID mean and std when ``"kid"`` is present) and the image counts, over all ranks.

    A collective when distributed (torchmetrics gathers the states in ``compute``): every rank must call
    it, and every rank gets the same values. KID draws its random subsets under a fixed seed in a forked
    RNG, so ranks agree and training randomness is left untouched.
    """
    fid = metrics["fid"]
    result = {
        "num_real": _gathered_sum(fid, fid.real_features_num_samples),
        "num_fake": _gathered_sum(fid, fid.fake_features_num_samples),
        "fid": float(fid.compute()),
    }
    if "kid" in metrics:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            kid_mean, kid_std = metrics["kid"].compute()
        result.update(kid_mean=float(kid_mean), kid_std=float(kid_std))
    return result


def _gathered_sum(metric: Metric, count: torch.Tensor) -> int:
    """A count state summed over ranks, as the metric's own sync sums it (shows what was fed in total)."""
    if metric.distributed_available_fn():
        return int(sum(gather_all_tensors(count)))
    return int(count)
