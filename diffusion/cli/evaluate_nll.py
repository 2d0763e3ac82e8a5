"""Bits per dimension of held-out images: `python -m diffusion.evaluate --nll --ckpt CKPT`.

The negative log-likelihood bound of Ho et al. 2020 (Eq. 5) in bits/dim: the prior term L_T, the KL terms
L_1 .. L_{T-1} against the true posterior and the discretized Gaussian decoder L_0 on 8-bit data, summed over
all T steps for every image (T network evaluations an image; `diffusion.core.variational_bound`), printed as the
mean over the images with its standard error. The images are the held-out (validation) split of the checkpoint's
run, rebuilt from the run's config.yaml (`--split train` for its training split), or `--data.path FILE.npz`
(``arr_0`` uint8 N x H x W x C, the samples-file format; ``arr_1`` labels for a class-conditional model).
Images are taken on the 8-bit grid (the digits' 17 grey levels are rounded to the 256 levels they are saved
as). Vector data has no 8-bit bins: --nll refuses vector checkpoints.

The model's p(x_{t-1} | x_t) is the one the DDPM sampler draws from: the checkpoint's prediction type and
variance (its learned one, if trained with --model.variance learned_range; else --variance, default the
checkpoint's sampling variance), the predicted x_0 clipped to [-1, 1] unless --clip_denoised false.
Class-conditional checkpoints give the bound on -log p(x | y) with the images' labels.

`--devices D` evaluates on D processes per machine (Lightning Fabric, as `python -m diffusion.sample`): rank r
takes images r, r + W, ...; the noise of each term is a function of (--seed, t, image position), so any number
of devices gives the same bound.
"""

import math
import sys
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any, Literal

import torch
import yaml
from jsonargparse import ActionYesNo, ArgumentParser
from jsonargparse.typing import PositiveInt
from torch.utils.data import DataLoader, Dataset

from diffusion.cli.command_line import written_as
from diffusion.cli.evaluate_notes import nll_requested, note_unused, refuse_the_other_modes_options
from diffusion.cli.flags import (
    add_flags,
    check_seed_flag,
    command_parser,
    given_model,
    ranges_said_as_flags,
    resolve_device,
)
from diffusion.cli.legacy import accept_moved_class_paths
from diffusion.cli.parse_errors import parsed_command_line
from diffusion.cli.process_group import closing_process_group, launch_ranks
from diffusion.cli.reporting import reporting_user_errors
from diffusion.core.guidance import guided_output
from diffusion.core.sampling import SamplingOptions
from diffusion.core.variance import VarianceType
from diffusion.core.variational_bound import ReverseProcess
from diffusion.data.images import ImageDataModule
from diffusion.data.numpy_files import read_images
from diffusion.data.split import READING_BATCH
from diffusion.errors import UserError
from diffusion.generation.ranks import gather_in_order
from diffusion.metrics.bits_per_dim import BOUND_BATCH, BitsPerDim, image_bounds, quantize_to_8_bits
from diffusion.training.loading import load_checkpoint
from diffusion.training.module import DiffusionModule
from diffusion.training.run_folders import run_folder_of


def reverse_process_of(
    module: DiffusionModule, variance: VarianceType | None = None, clip_denoised: bool = True
) -> ReverseProcess:
    """The p(x_{t-1} | x_t) the DDPM sampler draws from: a learned variance if the model has one, else `variance`
    (default: the model's sampling variance, fixedlarge unless set)."""
    learned = module.hparams.get("variance", "fixed") == "learned_range"
    ddpm = module.sampler(SamplingOptions(sampler="ddpm", variance=variance))  # the model's DDPM
    chosen = "learned_range" if learned else ddpm.variance  # type: ignore[attr-defined]  # a DDPM sampler's
    return ReverseProcess(module.hparams.prediction_type, chosen, learned, clip_denoised)  # type: ignore[attr-defined, arg-type]


@torch.no_grad()
def estimated_seconds(
    module: DiffusionModule,
    images: torch.Tensor,
    labels: torch.Tensor | None,
    batch_size: int,
    world_size: int,
) -> float:
    """How long the bound takes: one batch's network evaluation timed (after a warm-up one), times the T
    evaluations each of a rank's batches makes (the bound's own arithmetic is small beside them)."""
    share = math.ceil(len(images) / world_size)
    batch = min(batch_size, share)
    x = images[:batch].to(module.device)
    y = None if labels is None else labels[:batch].to(module.device)
    t = torch.full((batch,), module.schedule.num_timesteps // 2, device=module.device)
    seconds = []
    for _ in range(2):  # the first pays for allocations and kernel choices
        start = perf_counter()
        guided_output(module.network, x, t, y)
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)
        seconds.append(perf_counter() - start)
    return seconds[-1] * math.ceil(share / batch_size) * module.schedule.num_timesteps


def estimate_line(seconds: float, num_images: int, num_timesteps: int, device: torch.device) -> str:
    """'bits/dim of 90 images: 20 network evaluations each, about 0:00:03 on cpu'."""
    duration = (
        time.strftime("%H:%M:%S", time.gmtime(round(seconds)))
        if seconds < 86400
        else f"{seconds / 86400:.1f} days"
    )
    return (
        f"bits/dim of {num_images} images: {num_timesteps} network evaluations each, about {duration} on "
        f"{device} (one batch timed)"
    )


def requested(argv: list[str] | None = None) -> bool:
    """Whether `python -m diffusion.evaluate` was given --nll (on the command line, or in `argv`), or a --config
    file that sets `nll: true`, read as the parser reads a bool (`"true"` quoted too; the last word wins)."""
    return nll_requested(sys.argv[1:] if argv is None else argv)


def build_parser() -> ArgumentParser:
    parser = command_parser("python -m diffusion.evaluate --nll", __doc__)
    parser.add_argument("--nll", action=ActionYesNo, nargs="?", default=True, help="bits/dim (this command)")
    add_flags(parser, "ckpt")
    parser.add_argument(
        "--data.path", type=str | None, default=None,
        help="an .npz of uint8 N x H x W x C images (arr_1: labels) instead of the run's held-out split",
    )  # fmt: skip
    parser.add_argument(
        "--split",
        type=Literal["val", "train"],
        default="val",
        help="val (the run's held-out images) or train: from its config.yaml",
    )
    parser.add_argument("--num_images", type=PositiveInt | None, default=None, help="only the first N images")
    add_flags(
        parser, "batch_size", "seed", "weights", seed={"help": "seed of the noise of every term"},
        batch_size={"default": BOUND_BATCH, "help": "images whose bound terms are evaluated at once on each device"},
    )  # fmt: skip
    parser.add_argument(
        "--variance", type=VarianceType | None, default=None,
        help="fixedlarge or fixedsmall for a fixed-variance model (default: its sampling variance)",
    )  # fmt: skip
    parser.add_argument(
        "--clip_denoised", type=bool, default=True, help="clip the predicted x_0 to [-1, 1], as the samplers"
    )
    add_flags(
        parser, "device", "devices", "num_nodes", "accelerator",
        device={"help": "with --devices 1: cpu, cuda, cuda:1, ...; default: cuda if visible"},
        devices={"help": "processes to evaluate on (one per GPU)"},
    )  # fmt: skip
    return parser


def run_images(ckpt: str, split: str) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """The `split` images of the checkpoint's run in model units, rebuilt from its config.yaml, with their labels
    for a class-conditional run; and where they came from."""
    run = run_folder_of(ckpt)
    fix = "pass --data.path FILE.npz (uint8 N x H x W x C images) to evaluate other images"
    if run is None or not run.config_file.is_file():
        raise UserError(f"--ckpt {ckpt} is not in a run folder with a config.yaml to find its data in", fix)
    data_config = (yaml.safe_load(run.config_file.read_text()) or {}).get("data") or {}
    accept_moved_class_paths()
    if "ImageDataModule" not in str(data_config.get("class_path")):
        raise UserError(f"--ckpt {ckpt}: its run trained on {data_config.get('class_path')}, not images", fix)
    init_args = {**data_config.get("init_args", {}), "random_flip": False}  # the images as they are
    data = ImageDataModule(**init_args)
    data.prepare_data()
    data.setup("fit")
    if split not in ("val", "train"):
        raise UserError(f"--split {split} is not a split", "pass val (held out) or train")
    held_out = data.val_set if data.val_from_train is None else None
    if split == "val" and held_out is None:
        raise UserError(
            f"the run of {ckpt} held out no images (--data.val_fraction 0)", f"{fix}, or --split train"
        )
    dataset: Dataset = held_out if split == "val" else data.train_set  # type: ignore[assignment]  # set up
    items = list(DataLoader(dataset, batch_size=READING_BATCH, shuffle=False))
    images = torch.cat([batch.x for batch in items])
    labels = torch.cat([torch.as_tensor(batch.label) for batch in items]) if data.conditional else None
    return images, labels, f"{data.dataset}, {split} split of {run.config_file}"


def npz_images(path: str, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """The uint8 images (and labels) of an .npz in model units, checked against the model's sample shape."""
    images, labels = read_images(path, "--data.path")
    channels, height, width = shape
    if images.shape[1:] != (height, width, channels):
        raise UserError(
            f"--data.path {path}: the images are uint8 {images.shape}, the model's images uint8 "
            f"(N, {height}, {width}, {channels})",
            "pass images of the checkpoint's size, as samples.npz stores them",
        )
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1
    return x, None if labels is None else torch.from_numpy(labels).long(), path


def main(
    argv: list[str] | None = None, other_mode: Callable[[], ArgumentParser] | None = None
) -> dict[str, Any]:
    """`python -m diffusion.evaluate --nll --ckpt CKPT [flags]`: print and return the bits/dim of the images.
    `other_mode`: the parser of evaluate's sample-quality mode, whose options given here are said as its."""
    with reporting_user_errors(argv), closing_process_group():
        parser = build_parser()
        if other_mode is not None:
            refuse_the_other_modes_options(parser, other_mode(), argv, nll=True)
        command_line = parsed_command_line(parser, argv)
        args = command_line.config
        check_seed_flag(args.seed, "the noise of every term is a function of it")
        device: str | torch.device
        device, accelerator = resolve_device(args.device, args.accelerator, args.devices * args.num_nodes)
        args.ckpt, hparams = given_model(args.ckpt)
        shape = tuple(hparams.get("sample_shape", ()))
        if len(shape) != 3:
            raise UserError(
                f"--nll: {args.ckpt} models vectors of shape {shape}, and bits/dim is a bound on 8-bit images",
                "evaluate an image model's checkpoint (vector models have no 8-bit bins to give probabilities)",
            )
        if hparams.get("normalization") != {"shift": [0.5] * shape[0], "scale": [0.5] * shape[0]}:
            raise UserError(f"--nll: {args.ckpt} does not model images in [-1, 1]", "train it on images")
        learned = hparams.get("variance", "fixed") == "learned_range"
        if learned and args.variance not in (None, "learned_range"):
            raise UserError(
                f"--variance {args.variance}: this model learned its variance", "leave --variance out"
            )
        if not learned and args.variance == "learned_range":
            raise UserError(
                "--variance learned_range: this model was trained with fixed variances", "leave it out"
            )
        data_path = args.get("data.path")
        if data_path is not None:
            images, labels, source = npz_images(data_path, shape)
        else:
            images, labels, source = run_images(args.ckpt, args.split)
        images = quantize_to_8_bits(images[: args.num_images])
        labels = (
            None
            if labels is None or hparams["network"].get("init_args", {}).get("num_classes") is None
            else labels
        )
        labels = None if labels is None else labels[: args.num_images]
        command_line.print_config_if_asked()  # once the checkpoint and the images are read: what would run
        fabric, rank, world_size, device = launch_ranks(
            args.devices, args.num_nodes, accelerator, device, argv, "diffusion.evaluate --nll"
        )
        if rank == 0 and data_path is not None:
            note_unused(
                command_line.written, "split", args.split,
                "it picks a split of the run's data (from its config.yaml), "
                f"and {written_as(command_line.written, 'data.path')} {data_path} gives the images",
            )  # fmt: skip
        with ranges_said_as_flags():  # its `{--weights}` said as this command's flag
            module = load_checkpoint(args.ckpt, weights=args.weights, map_location=device)
        process = reverse_process_of(module, args.variance, args.clip_denoised)
        seconds = estimated_seconds(module, images, labels, args.batch_size, world_size)
        if rank == 0:  # up front: T evaluations an image take minutes to hours (1,000 x 10,000 CIFAR images)
            print(
                estimate_line(seconds, len(images), module.schedule.num_timesteps, module.device),
                file=sys.stderr,
            )
        bounds = image_bounds(
            module.network, module.schedule, process, images, labels, seed=args.seed, batch_size=args.batch_size,
            rank=rank, world_size=world_size, progress=rank == 0,
        )  # fmt: skip
        if fabric is not None:
            # Fabric's all_gather of a tensor is a tensor.
            bounds = gather_in_order(bounds.to(fabric.device), len(images), fabric.all_gather)  # type: ignore[arg-type]
        result = BitsPerDim.of(bounds[: len(images)])
        if rank == 0:
            print(f"images: {len(images)} ({source}); p(x_(t-1) | x_t): {process}", file=sys.stderr)
            print(bits_per_dim_line(result))
            print(
                f"  prior L_T {result.prior:.6f}, decoder L_0 {result.decoder:.4f}, "
                f"KL terms L_1..L_(T-1) {result.kl:.4f}"
            )
        if fabric is not None:
            fabric.barrier()
        return {**result.__dict__, "per_image": bounds[: len(images), 3]}


def bits_per_dim_line(result: BitsPerDim) -> str:
    """`bits/dim: B ± SE (standard error over images)`; one image has no spread to estimate an error from (its
    standard error is NaN), said so rather than as `± nan`."""
    if result.num_images == 1:
        return (
            f"bits/dim: {result.bits_per_dim:.5f} (one image: no standard error; pass --num_images 2 or more)"
        )
    return f"bits/dim: {result.bits_per_dim:.5f} ± {result.standard_error:.5f} (standard error over images)"


if __name__ == "__main__":  # the mode of evaluate's that --nll chooses
    from diffusion.cli.reporting import not_a_command

    not_a_command("evaluate the NLL with python -m diffusion.evaluate --nll --ckpt CKPT")
