"""FID and KID of a samples file: `python -m diffusion.evaluate --samples samples.npz --reference REF`.

REF is another .npz (``arr_0``: uint8 N x H x W x C, the samples-file format) or the name of a dataset of
`diffusion.data.ImageDataModule` (``digits``, ``mnist``, ``fashion_mnist``, ``cifar10``; ``--data_root``
for the downloaded ones, ``folder`` with ``--data_root DIR``): its whole train split (or a fixed random
``--num_reference`` of it), rendered at the samples' image size.

``--features inception`` (default) is the standard FID/KID (torch-fidelity's InceptionV3, weights
downloaded on first use); ``--features pixels`` is the offline pixel-space FD of the digits benchmark.
Image sizes must match for Inception features: comparing two resolutions would score the resizing. Pixel
features area-average both sets to 8x8, so they accept different sizes (e.g. 16x16 samples against the
8x8 originals); channel counts must always match.

``--nll --ckpt CKPT`` evaluates a checkpoint's bits/dim on held-out images instead (`diffusion.cli.likelihood`).

Options can also come from a YAML file (--config FILE; --print_config writes one). A user error ends in one
line on stderr and exit status 2; --debug (or DIFFUSION_DEBUG=1) shows its traceback.
"""

from __future__ import annotations

import pickle
import zipfile
import zlib
from pathlib import Path
from typing import get_args

import numpy as np
import torch
from jsonargparse import ArgumentParser
from jsonargparse.typing import PositiveInt, restricted_number_type
from torch.utils.data import DataLoader, Subset

from diffusion.cli import likelihood
from diffusion.cli.parsing import command_parser
from diffusion.cli.reporting import reporting_user_errors
from diffusion.data.image_files import find_images
from diffusion.data.images import MIN_IMAGE_SIZE, ImageDataModule, ImageDatasetName
from diffusion.data.numpy_files import numpy_file_kind
from diffusion.errors import UserError
from diffusion.generation.render import to_uint8_images
from diffusion.metrics.fid_kid import Features, compute_metrics, make_metrics

AtLeastTwo = restricted_number_type("AtLeastTwo", int, (">=", 2), docstring="int restricted to be >=2")


def load_npz_images(path: str | Path) -> np.ndarray:
    """``arr_0`` of a samples file, checked to be uint8 (N, H, W, C) images with C in {1, 3}."""
    path = Path(path)
    fix = "pass the samples.npz that python -m diffusion.sample wrote (or np.savez(path, uint8_images))"
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path} — make one with python -m diffusion.sample")
    kind = numpy_file_kind(path)
    if kind == "npy":
        raise ValueError(f"{path} is a single .npy array, not an .npz archive — {fix}")
    if kind == "other":
        raise ValueError(f"{path} is not an .npz archive — {fix}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if "arr_0" not in archive.files:
                raise ValueError(
                    f"{path} has no arr_0 (it holds {archive.files}) — samples files store the images as "
                    "arr_0: np.savez(path, images)"
                )
            images = archive["arr_0"]
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as err:
        raise ValueError(f"{path} is truncated or corrupt ({err}) — {fix}") from err
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(
            f"{path}: arr_0 has dtype {images.dtype} and shape {images.shape}, not uint8 images of shape "
            "(N, H, W, C) with C = 1 or 3 (vector samples have no FID) — save images as np.savez(path, images) "
            "with images.astype(np.uint8) in 0..255"
        )
    if len(images) < 2:
        raise ValueError(
            f"{path} holds {len(images)} image(s) and FID needs at least 2 — sample more (--num_samples)"
        )
    return images


def load_reference(
    reference: str,
    image_size: int,
    channels: int,
    data_root: str = "data",
    num_reference: int | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Reference images as uint8 (N, H, W, C): an .npz file, or a dataset's train split at ``image_size``."""
    if reference.endswith(".npz") or Path(reference).is_file():
        images = load_npz_images(reference)
        return images[_subset(len(images), num_reference, seed)]
    if reference not in get_args(ImageDatasetName):
        raise ValueError(
            f"--reference {reference!r} is neither an existing .npz file nor a dataset — pass an .npz or one "
            f"of the datasets {', '.join(get_args(ImageDatasetName))}"
        )
    if image_size < MIN_IMAGE_SIZE:  # a dataset is rendered at the samples' size
        raise ValueError(
            f"the samples are {image_size}x{image_size}, smaller than the {MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE} a "
            f"dataset reference can be rendered at — compare them with an .npz of {image_size}x{image_size} "
            "images as --reference"
        )
    if reference == "folder":
        find_images(data_root, "--data_root")  # the folder's errors, naming evaluate's flag
    folder_channels = channels if reference == "folder" else None
    data = ImageDataModule(
        reference, root=data_root, image_size=image_size, channels=folder_channels, random_flip=False,
        val_fraction=0.0,
    )  # fmt: skip
    data.prepare_data()  # downloads torchvision datasets on first use
    data.setup("fit")
    dataset = Subset(data.train_set, _subset(len(data.train_set), num_reference, seed).tolist())
    loader = DataLoader(dataset, batch_size=500, shuffle=False)
    return np.concatenate([to_uint8_images(batch.x, data.normalization) for batch in loader])


def _subset(n: int, num: int | None, seed: int) -> np.ndarray:
    """All n indices, or a fixed random ``num`` of them in increasing order."""
    if num is None or num >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:num])


def evaluate(
    samples: np.ndarray,
    reference: np.ndarray,
    features: Features = "inception",
    kid_subset_size: int = 1000,
    batch_size: int = 250,
    device: str = "cpu",
    inception_weights: str | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """FID, KID mean and std between two uint8 (N, H, W, C) image arrays (see the module docstring)."""
    if samples.shape[-1] != reference.shape[-1]:
        raise ValueError(
            f"samples have {samples.shape[-1]} channel(s) but the reference has {reference.shape[-1]}; "
            "compare images with the same channel count"
        )
    if features == "inception" and samples.shape[1:3] != reference.shape[1:3]:
        raise ValueError(
            f"samples are {samples.shape[1]}x{samples.shape[2]} but the reference is "
            f"{reference.shape[1]}x{reference.shape[2]}; Inception FID needs one size (pass a dataset name as "
            "--reference to render it at the samples' size, or use --features pixels, which pools both to 8x8)"
        )
    # KID's subsets cannot be larger than either set; a smaller subset gives a noisier estimate.
    subset_size = min(kid_subset_size, len(samples), len(reference))
    metrics = _make_metrics(features, subset_size, samples.shape[-1], inception_weights)
    for metric in metrics.values():
        metric.to(device)
    for images, real in [(reference, True), (samples, False)]:
        for start in range(0, len(images), batch_size):
            batch = torch.from_numpy(images[start : start + batch_size]).permute(0, 3, 1, 2).to(device)
            for metric in metrics.values():
                metric.update(batch, real=real)  # (B, C, H, W) uint8
    return compute_metrics(metrics, seed)


def _make_metrics(features: Features, subset_size: int, channels: int, inception_weights: str | None) -> dict:
    """`make_metrics`, with a bad --inception_weights file reported as one line that names it."""
    if features != "inception" or inception_weights is None:
        return make_metrics(features, subset_size, channels=channels, inception_weights=inception_weights)
    path = Path(inception_weights)
    fix = (
        "pass torch-fidelity's weights-inception-2015-12-05-6726825d.pth (github.com/toshas/torch-fidelity "
        "releases), or leave --inception_weights out to download it"
    )
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"--inception_weights {path} {what} — {fix}")
    try:
        return make_metrics(features, subset_size, channels=channels, inception_weights=inception_weights)
    except (pickle.UnpicklingError, EOFError, RuntimeError) as err:
        if "Error(s) in loading state_dict" in str(err):  # a PyTorch file of other weights: keys summarized
            raise
        reason = " ".join(str(err.__cause__ or err).split())
        raise UserError(
            f"--inception_weights {path} is not a readable PyTorch weights file ({reason})", fix
        ) from err


def build_parser() -> ArgumentParser:
    parser = command_parser("python -m diffusion.evaluate", __doc__)
    parser.add_argument("--samples", type=str, required=True, help="samples.npz (arr_0: uint8 N x H x W x C)")
    parser.add_argument(
        "--reference",
        type=str,
        required=True,
        help=f"an .npz file or a dataset: {get_args(ImageDatasetName)}",
    )
    parser.add_argument("--features", type=Features, default="inception")
    parser.add_argument(
        "--kid_subset_size",
        type=AtLeastTwo,
        default=1000,
        help="KID subset size (capped at the image counts)",
    )
    parser.add_argument(
        "--num_reference", type=AtLeastTwo | None, default=None, help="a fixed random subset of the reference"
    )
    parser.add_argument(
        "--data_root", type=str, default="data", help="download folder of torchvision datasets; folder root"
    )
    parser.add_argument("--batch_size", type=PositiveInt, default=250)
    parser.add_argument("--device", type=str | None, default=None, help="default: cuda if visible, else cpu")
    parser.add_argument(
        "--inception_weights", type=str | None, default=None, help="a local copy of the InceptionV3 weights"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the reference subset and KID's subsets")
    return parser


def main(argv: list[str] | None = None) -> dict[str, float]:
    """`python -m diffusion.evaluate [flags]`: print and return FID and KID of a samples file."""
    if likelihood.requested(argv):  # --nll: bits/dim of a checkpoint, a command of its own
        return likelihood.main(argv)
    # RuntimeError too: torch-fidelity's failed download of the Inception weights says what to do instead.
    with reporting_user_errors(argv, also=(RuntimeError,)):
        args = build_parser().parse_args(argv)
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            torch.device(device)
        except RuntimeError as err:  # torch lists two dozen device types
            raise UserError(f"--device {device} is not a device", "pass cpu, cuda or cuda:N") from err
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"--device {device}: no CUDA GPU is visible here", "use --device cpu")
        samples = load_npz_images(args.samples)
        reference = load_reference(
            args.reference, samples.shape[1], samples.shape[-1], args.data_root, args.num_reference, args.seed
        )
        result = evaluate(
            samples, reference, args.features, args.kid_subset_size, args.batch_size, device,
            args.inception_weights, args.seed,
        )  # fmt: skip
    print(f"samples:   {args.samples} ({len(samples)} images, {samples.shape[1]}x{samples.shape[2]})")
    print(f"reference: {args.reference} ({result['num_real']} images); features: {args.features}")
    print(f"FID: {result['fid']:.4f}")
    print(f"KID: {result['kid_mean']:.6f} ± {result['kid_std']:.6f}")
    return result


if __name__ == "__main__":
    main()
