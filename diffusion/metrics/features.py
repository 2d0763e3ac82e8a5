"""The feature extractors FID, KID and IS read images through, both taking uint8 images (N, C, H, W) in 0..255,
the range the samples file holds (images pass through `diffusion.generation.render.to_uint8` first, so the FID
callback, the sample CLI and the evaluator all score the same quantized pixels):

- ``"inception"``: the standard features. `InceptionFeatures` is torch-fidelity's own extractor
  (``FeatureExtractorInceptionV3``, "inception-v3-compat"), used as is: uint8 in, TensorFlow-1-compatible
  bilinear resize to 299 x 299, (x - 128) / 128, the TF Inception graph's weights. That is the computation of
  TTUR's ``fid.py`` and of the original Inception Score code, which Ho et al. 2020 and most papers report.
  One pass gives both outputs: the 2048-d pool features (FID, KID) and the 1008-class logits of the TF graph
  without the bias term (IS; torch-fidelity's ``logits_unbiased``, what the original IS code's
  ``matmul(pool3, w)`` computes). torchmetrics' default ``FrechetInceptionDistance(feature=2048)`` resizes
  with torch's antialiased bilinear instead (``antialias=True``), whose values are not comparable with papers.
  Its weights (~92 MB) are downloaded from GitHub on first use (``pip install -e ".[fid]"`` for
  torch-fidelity); offline, give a local copy with ``inception_weights``. Grayscale images are repeated to 3
  channels (what torch-fidelity's PIL ``convert("RGB")`` does with image files).
- ``"pixels"``: `PixelFeatures`, offline and deterministic: images area-averaged to 8x8 per channel, in
  scikit-learn's digits range 0..16. The Fréchet distance on these is the pixel-space FD of the digits
  quality benchmark (two halves of the real digits score about 16.3, the floor a model can reach). They have
  no class logits, so no Inception Score.
"""

from __future__ import annotations

import os
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import nn

from diffusion.data.numpy_files import PICKLE, is_torch_archive
from diffusion.errors import CannotRead, InvalidValue, MissingFile, WrongType

Features = Literal["inception", "pixels"]

PIXEL_SIZE = 8  # PixelFeatures pools every image to 8x8 per channel


class ImageFeatures(NamedTuple):
    """What one pass of an extractor gives: ``pool`` (N, D) for FID and KID, ``logits`` (N, classes) for IS
    (None where the extractor has no classifier)."""

    pool: torch.Tensor
    logits: torch.Tensor | None


class PixelFeatures(nn.Module):
    """Images area-averaged (`adaptive_avg_pool2d`) to size x size per channel and flattened, in 0..16.

    Both ranges are accepted: uint8 in 0..255 (what this project passes) maps to value / 255 * 16, floats are
    taken as 0..1 and map to value * 16.
    """

    def __init__(self, size: int = PIXEL_SIZE, channels: int = 1) -> None:
        super().__init__()
        if size < 1 or channels < 1:
            raise ValueError(f"PixelFeatures needs size >= 1 and channels >= 1, got {size=}, {channels=}")
        self.size = size
        self.channels = channels
        self.num_features = channels * size * size

    def forward(self, images: torch.Tensor) -> ImageFeatures:
        if images.ndim != 4 or images.shape[1] != self.channels:
            raise ValueError(
                f"PixelFeatures(channels={self.channels}) expects images (N, {self.channels}, H, W), "
                f"got shape {tuple(images.shape)}"
            )
        scale = 16 / 255 if images.dtype == torch.uint8 else 16.0
        pooled = F.adaptive_avg_pool2d(images.float() * scale, self.size)  # (N, C, size, size)
        return ImageFeatures(pooled.flatten(1), None)  # (N, C * size * size)


INCEPTION_WEIGHTS_FIX = (
    "pass the path of torch-fidelity's weights-inception-2015-12-05-6726825d.pth (github.com/toshas/torch-fidelity "
    "releases), or leave inception_weights out to download it"
)


def check_inception_weights(weights_path: object, features: str = "inception") -> None:
    """A given `inception_weights` is a file that is there: a missing one was said as a failed download, whose fix
    (pass a local copy) was what the caller had done. Given with other `features`, it is warned unused."""
    if weights_path is None:
        return
    if features != "inception":
        warnings.warn(
            f"inception_weights={weights_path!r} is not used: features={features!r} computes no "
            "Inception features (the file is not read)",
            stacklevel=3,
        )
        return
    if not isinstance(weights_path, str | os.PathLike):
        raise WrongType("inception_weights", weights_path, "a path (str or Path)", INCEPTION_WEIGHTS_FIX)
    if not os.path.exists(weights_path):
        raise MissingFile(
            f"inception_weights={os.fspath(weights_path)} does not exist", INCEPTION_WEIGHTS_FIX
        )
    if not os.path.isfile(weights_path):
        raise InvalidValue(
            f"inception_weights={os.fspath(weights_path)} is a folder, not a file", INCEPTION_WEIGHTS_FIX
        )


# The evaluate command's words for the file it was given (its --inception_weights flag, said as the parameter in
# Python): the same file's faults read the same from both
READABLE_WEIGHTS_FIX = (
    "pass torch-fidelity's weights-inception-2015-12-05-6726825d.pth (github.com/toshas/torch-fidelity "
    "releases), or leave {--inception_weights} out to download it"
)


def read_inception_weights(weights_path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict in the local InceptionV3 weights file `weights_path` (a file that is there:
    `check_inception_weights`), read as tensors alone (no code of the file run), or InvalidValue naming
    `{--inception_weights}` and what the file is: empty, truncated, another kind of file (a web page saved in
    its place), pickled objects, or no state dict; CannotRead for the system's refusal. The reading check of
    SampleQuality, its callback and the evaluate command, before torch-fidelity reads the file (with
    no restriction to tensors: it would have run such code)."""
    path = os.fspath(weights_path)

    def unreadable(reason: str) -> InvalidValue:
        return InvalidValue(
            f"{{--inception_weights}} {path} is not a readable PyTorch weights file ({reason})",
            READABLE_WEIGHTS_FIX,
        )

    try:
        with open(path, "rb") as file:
            start = file.read(16)
        is_zip = zipfile.is_zipfile(path)
        if not start:
            raise unreadable("it is empty: 0 bytes")
        if start[:2] == b"PK" and not is_zip:  # torch.save's zip archive without its end: cut short
            raise unreadable("it is truncated: a zip archive, torch.save's format, cut short")
        if not is_zip and start[:1] != PICKLE:  # neither format of torch.save
            raise unreadable(f"neither torch.save's zip archive nor a pickle: it starts with {start!r}")
        if is_zip and not is_torch_archive(Path(path)):
            raise unreadable("a zip archive torch.save did not write, such as np.savez's .npz")
        # a pickle.dump's protocol was warned of by torch.load before the line that says what the file is
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*pickle protocol", category=UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # what weights_only=True refuses: objects other than tensors
        raise unreadable(
            "it holds pickled objects other than tensors, which could run code when loaded"
        ) from err
    except EOFError as err:  # torch.save's legacy format cut short
        raise unreadable("it is truncated: it ends before its last tensor") from err
    except RuntimeError as err:  # a damaged archive: torch's own reason, its first sentence
        first = (str(err).strip().splitlines() or [type(err).__name__])[0].split(". ")[0]
        raise unreadable(f"torch.load: {first}") from err
    except OSError as err:
        raise CannotRead(
            f"could not read inception_weights={path} ({err.strerror or err})", INCEPTION_WEIGHTS_FIX
        ) from err
    if not isinstance(state, Mapping):
        raise unreadable(f"it holds a {type(state).__name__}, not a state dict: names -> tensors")
    other = next((key for key, value in state.items() if not isinstance(value, torch.Tensor)), None)
    if other is not None:
        kind = type(state[other]).__name__
        raise unreadable(f"its entry {other!r} is a {kind}, not a tensor: a state dict holds tensors alone")
    return dict(state)


class InceptionFeatures(nn.Module):
    """torch-fidelity's InceptionV3 (see the module docstring) for uint8 (N, 1 or 3, H, W) images: 2048-d pool
    features and 1008 logits from one pass; it resizes to 299 x 299 itself. Downloads its weights on first use
    unless ``weights_path`` points at a local copy. The network stays in eval mode (its batch norms use their
    stored statistics) whatever ``train()`` is called on a module holding it."""

    num_features = 2048

    def __init__(self, weights_path: str | None = None) -> None:
        super().__init__()
        check_inception_weights(weights_path)
        try:
            from diffusion.metrics.inception_network import InceptionV3
        except ImportError as err:
            raise ModuleNotFoundError(
                "features='inception' needs torch-fidelity: pip install -e '.[fid]' (or use features='pixels')"
            ) from err
        source = None
        if weights_path is not None:  # its faults said of the file, before torch-fidelity reads it
            read_inception_weights(weights_path)
            source = f"{{--inception_weights}} {os.fspath(weights_path)}"
        try:
            self.network = InceptionV3(weights_path, source, READABLE_WEIGHTS_FIX)
        except OSError as err:  # urllib's URLError is an OSError: no network, or a file it cannot read
            if weights_path is not None:
                raise CannotRead(
                    f"could not read inception_weights={weights_path} ({err})", INCEPTION_WEIGHTS_FIX
                ) from err
            raise CannotRead(
                f"could not load the InceptionV3 weights ({err}); they are downloaded from GitHub on first use",
                # SampleQuality's options (and the callback's; evaluate's flags of the same names)
                "offline, pass {--inception_weights} PATH (a local copy), or {--features} pixels",
            ) from err

    def train(self, mode: bool = True) -> InceptionFeatures:
        super().train(mode)
        self.network.eval()
        return self

    def forward(self, images: torch.Tensor) -> ImageFeatures:
        if images.ndim != 4 or images.shape[1] not in (1, 3) or images.dtype != torch.uint8:
            raise ValueError(
                "Inception features need uint8 (N, 1 or 3, H, W) images in 0..255 (to_uint8_images), got "
                f"{images.dtype} of shape {tuple(images.shape)}"
            )
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)  # grayscale -> RGB: Inception was trained on colour
        pool, logits = self.network(images)  # (N, 2048), (N, 1008) float32
        return ImageFeatures(pool, logits)


def check_features(features: str) -> None:
    if not isinstance(features, str):  # a list or None was said as an unknown name
        choices = " or ".join(map(repr, get_args(Features)))
        raise WrongType("features", features, choices, "pass features='inception' (the papers') or 'pixels'")
    if features not in get_args(Features):
        raise InvalidValue(f"unknown features {features!r}", f"choose one of {get_args(Features)}")


def distance_name(features: Features) -> str:
    """What a printed line calls the Fréchet distance: "FID" only of Inception features, the one papers report;
    of pixels it is a pixel-space FD, and a reader must not take it for an FID."""
    return "FID" if features == "inception" else f"FD of {features} (not an FID)"


def feature_size(features: Features, channels: int) -> int:
    """The length of the pool features (what FID statistics are made of), known without building anything."""
    check_features(features)
    return InceptionFeatures.num_features if features == "inception" else channels * PIXEL_SIZE**2


def make_feature_extractor(
    features: Features = "inception", channels: int = 3, inception_weights: str | None = None
) -> PixelFeatures | InceptionFeatures:
    check_features(features)
    if features == "pixels":
        return PixelFeatures(size=PIXEL_SIZE, channels=channels)
    return InceptionFeatures(inception_weights)
