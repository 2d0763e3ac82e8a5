"""Checkpoint in, samples out: `python -m diffusion.sample --ckpt PATH --num_samples N --out DIR`.

Writes DIR/samples.npz (`arr_0`: uint8 N x H x W x C for images, the format guided-diffusion's and EDM's
evaluators read; float32 N x D in data units for vectors) and DIR/grid.png (a scatter plot for vectors).
A class-conditional checkpoint samples --class_label K (an index or a class name) or, by default, all classes
in turn (sample i of class i % num_classes, one grid row per class), guided by --guidance_scale;
samples.npz then also holds the labels as `arr_1` (guided-diffusion's format for class-conditional samples).
Sample i depends only on (--seed, i), so any --batch_size gives the same samples (up to float rounding).

`--devices D` (D > 1) samples on D processes per machine (DDP via Lightning Fabric: gloo on CPU, NCCL on
GPUs): with W processes in all, rank r draws samples r, r + W, r + 2W, ... (--batch_size at a time), and
rank 0 gathers them in index order and writes the files once, so the output equals a one-device run's.
Fabric re-runs this command line in D - 1 more processes, or joins the processes torchrun / srun started
(across machines: --num_nodes M, as for training).

Options can also come from a YAML file (--config FILE; --print_config writes one). Everything is checked
before any sampling time is spent: the checkpoint, the output folder, and that OUT/samples.npz and
OUT/grid.png are not there already (--overwrite replaces them). A user error ends in one line on stderr and
exit status 2; --debug (or DIFFUSION_DEBUG=1) shows its traceback.
"""

import sys
from pathlib import Path
from typing import Literal, get_args

import torch
from jsonargparse import ActionYesNo, ArgumentParser
from jsonargparse.typing import PositiveInt

from diffusion.cli.checks import check_writable_folder, cpu_mixed_precision_note
from diffusion.cli.parsing import add_sampling_arguments, command_parser, options_from_flags
from diffusion.cli.process_group import closing_process_group, launch_ranks
from diffusion.cli.reporting import reporting_user_errors
from diffusion.data.labels import class_labels
from diffusion.errors import UserError
from diffusion.generation.precision import Precision, network_precision
from diffusion.generation.ranks import gather_in_order, generate
from diffusion.generation.render import write_samples
from diffusion.training.checkpoint_files import check_written_by_train, read_checkpoint
from diffusion.training.loading import Weights, load_checkpoint

Accelerator = Literal["auto", "cpu", "cuda", "gpu"]


def build_parser() -> ArgumentParser:
    parser = command_parser("python -m diffusion.sample", __doc__)
    parser.add_argument(
        "--ckpt", type=str, required=True, help="a checkpoint of train.py (e.g. .../last.ckpt)"
    )
    parser.add_argument("--num_samples", type=PositiveInt, default=64)
    parser.add_argument("--out", type=str, default="samples", help="output folder")
    parser.add_argument(
        "--overwrite",
        action=ActionYesNo,
        nargs="?",
        default=False,
        help="replace an existing OUT/samples.npz and OUT/grid.png",
    )
    parser.add_argument("--batch_size", type=PositiveInt, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", type=str | None, default=None,
        help="with --devices 1: cpu, cuda, cuda:1, ...; default: the --accelerator's, else cuda if visible",
    )  # fmt: skip
    parser.add_argument("--devices", type=PositiveInt, default=1, help="processes to sample on (one per GPU)")
    parser.add_argument(
        "--num_nodes", type=PositiveInt, default=1, help="machines, when started by torchrun / srun"
    )
    parser.add_argument(
        "--accelerator",
        type=Accelerator,
        default="auto",
        help="cpu or cuda (gpu); default: the type of --device",
    )
    parser.add_argument("--weights", type=Weights, default="ema", help="EMA weights or raw ones")
    add_sampling_arguments(parser)
    parser.add_argument(
        "--class_label", type=str | None, default=None,
        help="class-conditional checkpoints: a class (index or name) or 'all' (default): classes in turn",
    )  # fmt: skip
    parser.add_argument(
        "--precision", type=str, default="32",
        help="32 (or 32-true), 16-mixed or bf16-mixed: the network under autocast, the sampler in "
        "float32. For CUDA GPUs, bf16-mixed on Ampere and newer; on a CPU both run the network in bf16, "
        "which is fast only with bf16 instructions (AVX512-BF16, AMX)",
    )  # fmt: skip
    return parser


def check_precision(precision: str) -> None:
    if precision not in get_args(Precision):
        raise UserError(
            f"--precision {precision} is not supported for sampling",
            "choose 32, 16-mixed or bf16-mixed (true half precision would round the noise schedule)",
        )


def resolve_device(device: str | None, accelerator: str) -> tuple[str, str]:
    """(device of a one-device run, accelerator of a Fabric run): an explicit --accelerator decides both."""
    if accelerator == "cpu":
        device = "cpu"
    elif accelerator in ("cuda", "gpu") and not (device or "").startswith("cuda"):
        device = "cuda"
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.device(device)
    except RuntimeError as err:
        raise UserError(f"--device {device} is not a device", "pass cpu, cuda or cuda:N") from err
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA GPU is visible here", "use --device cpu")
    return device, "cuda" if device.startswith("cuda") else "cpu"


def check_sampling_checkpoint(path: str) -> dict:
    """The checkpoint can be read and holds what sampling needs; returns its hyperparameters."""
    return check_written_by_train(read_checkpoint(path, "--ckpt"), path, "--ckpt")


def requested_labels(
    hparams: dict, num_samples: int, class_label: str | None, guidance: bool
) -> torch.Tensor | None:
    """The label of every sample (`diffusion.data.labels.class_labels`) from a checkpoint's hyperparameters, checked
    before any sampling time is spent; None for an unconditional checkpoint, which takes neither a class nor
    guidance."""
    num_classes = hparams["network"].get("init_args", {}).get("num_classes")
    if num_classes is None and (class_label is not None or guidance):
        flag = "--class_label" if class_label is not None else "--guidance_scale"
        raise UserError(
            f"{flag}: this checkpoint is unconditional (trained without --data.conditional)",
            "sample it without --class_label and --guidance_scale, or pass a class-conditional checkpoint",
        )
    return class_labels(num_samples, num_classes, class_label, hparams.get("class_names"))


def main(argv: list[str] | None = None) -> Path:
    """`python -m diffusion.sample [flags]`: write OUT/samples.npz and OUT/grid.png, return the .npz path."""
    with reporting_user_errors(argv), closing_process_group():
        args = build_parser().parse_args(argv)
        options = options_from_flags(args)
        device, accelerator = resolve_device(args.device, args.accelerator)
        check_precision(args.precision)
        path = Path(args.out) / "samples.npz"
        check_writable_folder(args.out, "--out")
        for written in (path, path.with_name("grid.png")):  # what this command writes: keep the user's
            if written.exists() and not args.overwrite:
                raise UserError(f"{written} exists", "pass --overwrite to replace it, or another --out")
        hparams = check_sampling_checkpoint(args.ckpt)
        labels = requested_labels(
            hparams, args.num_samples, args.class_label, args.guidance_scale is not None
        )
        fabric, rank, world_size, device = launch_ranks(
            args.devices, args.num_nodes, accelerator, device, argv, "diffusion.sample"
        )
        if rank == 0:
            note = cpu_mixed_precision_note(args.precision, training=False)
            if note and torch.device(device).type == "cpu":
                print(f"note: {note}", file=sys.stderr)
        module = load_checkpoint(args.ckpt, weights=args.weights, map_location=device)
        with network_precision(module, args.precision):
            samples = generate(  # images as uint8 (N, C, H, W): a quarter of the bytes to hold and gather
                module, args.num_samples, seed=args.seed, batch_size=args.batch_size, options=options,
                rank=rank, world_size=world_size, progress=rank == 0, uint8_images=True, labels=labels,
            )  # fmt: skip
        if fabric is not None:
            samples = gather_in_order(samples.to(fabric.device), args.num_samples, fabric.all_gather)
        if rank == 0:
            write_samples(samples, module.normalization, args.out, labels=labels)
            print(f"wrote {args.num_samples} samples to {path} and {Path(args.out) / 'grid.png'}")
        if fabric is not None:
            fabric.barrier()  # every rank returns only once the files exist
        return path


if __name__ == "__main__":
    main()
