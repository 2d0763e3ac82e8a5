"""Checkpoint in, samples out: `python -m diffusion.sample --ckpt PATH --num_samples N --out DIR`.

Writes DIR/samples.npz (`arr_0`: uint8 N x H x W x C for images, the format guided-diffusion's and EDM's
evaluators read; float32 N x D in data units for vectors) and DIR/grid.png (a scatter plot for vectors).
A class-conditional checkpoint samples --class_label K (an index or a class name) or, by default, all classes
in turn (sample i of class i % num_classes, one grid row per class), guided by --guidance_scale;
samples.npz then also holds the labels as `arr_1` (guided-diffusion's format for class-conditional samples).
Sample i depends only on (--seed, i), so any --batch_size gives the same samples (up to float rounding).

`--devices D` (D > 1) samples on D processes per machine (DDP via Lightning Fabric: gloo on CPU, NCCL on
GPUs): with W processes in all, rank r draws samples r, r + W, r + 2W, ... (--batch_size at a time), and
rank 0 gathers them in index order, a chunk at a time, and writes the files once, so the output equals a
one-device run's.
Fabric re-runs this command line in D - 1 more processes, or joins the processes torchrun / srun started
(across machines: --num_nodes M, as for training).

Options can also come from a YAML file (--config FILE; --print_config writes one). Everything is checked
before any sampling time is spent: the checkpoint (its checksums, finite weights), the output folder, that
OUT/samples.npz and OUT/grid.png are not there already (--overwrite replaces them) and that the disk has room
for the samples. They are written as they are made, into OUT/samples.partial/, and moved into OUT only once all
are in; samples that are not finite stop the run with nothing written. A user error ends in one line on stderr and
exit status 2; --debug (or DIFFUSION_DEBUG=1) shows its traceback.
"""

import inspect
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import get_args

import torch
from jsonargparse import ArgumentParser
from jsonargparse.typing import PositiveInt

from diffusion.cli.flags import (
    add_flags,
    add_sampling_arguments,
    check_seed_flag,
    check_writable_folder,
    command_parser,
    cpu_mixed_precision_note,
    given_model,
    ranges_said_as_flags,
    requested_labels,
    resolve_device,
)
from diffusion.cli.parse_errors import parsed_command_line
from diffusion.cli.process_group import closing_process_group, launch_ranks
from diffusion.cli.reporting import reporting_user_errors
from diffusion.core.samplers.contract import Sampler
from diffusion.core.sampling import OPTION_OWNERS, SamplingOptions
from diffusion.errors import COMMAND, UserError, naming_a_full_disk
from diffusion.generation.precision import Precision, network_precision
from diffusion.generation.ranks import generate_in_chunks
from diffusion.generation.render import SamplesWriter, check_room_for_samples
from diffusion.training.loading import load_checkpoint
from diffusion.training.module import DiffusionModule

DEFAULT_SAMPLE_SHAPE = inspect.signature(DiffusionModule).parameters["sample_shape"].default


def build_parser() -> ArgumentParser:
    parser = command_parser("python -m diffusion.sample", __doc__)
    add_flags(parser, "ckpt")
    parser.add_argument("--num_samples", type=PositiveInt, default=64)
    parser.add_argument("--out", type=str, default="samples", help="output folder")
    add_flags(
        parser, "overwrite", "batch_size", "seed", "device", "devices", "num_nodes", "accelerator", "weights",
        overwrite={"help": "replace an existing OUT/samples.npz and OUT/grid.png"},
        device={
            "help": "with --devices 1: cpu, cuda, cuda:1, ...; default: the --accelerator's, else cuda if visible"
        },
        devices={"help": "processes to sample on (one per GPU)"},
    )  # fmt: skip
    add_sampling_arguments(parser)
    parser.add_argument(
        "--class_label", type=int | str | None, default=None,  # an int too: a config file's `class_label: 3`
        help="class-conditional checkpoints: a class (index or name) or 'all' (default): classes in turn",
    )  # fmt: skip
    parser.add_argument(
        "--precision", type=int | str, default="32",  # an int too: a config file's `precision: 32`
        help="32 (or 32-true), 16-mixed or bf16-mixed: the network under autocast, the sampler in "
        "float32. For CUDA GPUs, bf16-mixed on Ampere and newer; on a CPU both run the network in bf16, "
        "which is fast only with bf16 instructions (AVX512-BF16, AMX)",
    )  # fmt: skip
    return parser


def check_precision(precision: int | str) -> None:
    if str(precision) not in get_args(Precision):
        raise UserError(
            f"--precision {precision} is not supported for sampling",
            "choose 32, 16-mixed or bf16-mixed (true half precision would round the noise schedule)",
        )


def unused_options(sampler: Sampler, given: set[str]) -> str | None:
    """What the user gave that the chosen sampler has no option for (`--eta` of ddpm): said, not dropped silently."""
    unused = [name for name in OPTION_OWNERS if name in given and type(sampler) not in OPTION_OWNERS[name]]
    if not unused:
        return None
    takers = {name: ", ".join(owner.name for owner in OPTION_OWNERS[name]) for name in unused}
    return "; ".join(
        f"--{name} is no option of the {sampler.name} sampler: not used ({takers[name]} take it)"
        for name in unused
    )


def main(argv: list[str] | None = None) -> Path:
    """`python -m diffusion.sample [flags]`: write OUT/samples.npz and OUT/grid.png, return the .npz path."""
    with reporting_user_errors(argv), closing_process_group():
        command_line = parsed_command_line(build_parser(), argv)
        args = command_line.config
        check_seed_flag(args.seed)  # before the checkpoint is read and the ranks started
        with ranges_said_as_flags():
            options = SamplingOptions.taken_from(args)
        device: str | torch.device
        device, accelerator = resolve_device(args.device, args.accelerator)
        check_precision(args.precision)
        args.precision = str(args.precision)  # `precision: 32` in a file is YAML's int
        path = Path(args.out) / "samples.npz"
        check_writable_folder(args.out, "--out")
        for written in (path, path.with_name("grid.png")):  # what this command writes: keep the user's
            if written.exists() and not args.overwrite:
                raise UserError(f"{written} exists", "pass --overwrite to replace it, or another --out")
            # One that refuses a write (`chattr +i`) failed after sampling, the grid already replaced
            if written.is_file():
                with naming_a_full_disk(written), open(written, "r+b"):
                    pass
        args.ckpt, hparams = given_model(args.ckpt)
        num_classes = hparams["network"].get("init_args", {}).get("num_classes")
        # Labels repeat with the classes (`class_labels`): those of the first num_classes samples stand for all.
        labels = requested_labels(
            hparams,
            min(args.num_samples, num_classes or 1),
            args.class_label,
            args.guidance_scale is not None,
        )
        sample_shape = tuple(hparams.get("sample_shape") or DEFAULT_SAMPLE_SHAPE)
        check_room_for_samples(args.out, args.num_samples, sample_shape, labels is not None)
        # --steps beyond the checkpoint's schedule: refused here, before --print_config and the ranks start
        options.check_steps_fit(int(hparams.get("num_timesteps", 1000)), COMMAND, "steps")
        command_line.print_config_if_asked()  # once the command's checks have passed: what would run
        fabric, rank, world_size, device = launch_ranks(
            args.devices, args.num_nodes, accelerator, device, argv, "diffusion.sample"
        )
        if rank == 0:
            note = cpu_mixed_precision_note(args.precision, training=False)
            if note and torch.device(device).type == "cpu":
                print(f"note: {note}", file=sys.stderr)
        module = load_checkpoint(args.ckpt, weights=args.weights, map_location=device)
        sampler = module.model_sampling.sampler(options)  # the flags over the checkpoint's defaults, once
        note = unused_options(sampler, {item.key for item in command_line.written if item.values != (None,)})
        if note and rank == 0:
            print(f"note: {note}", file=sys.stderr)
        all_gather = None if fabric is None else (lambda tensor: fabric.all_gather(tensor.to(fabric.device)))
        with network_precision(module, args.precision), ExitStack() as stack:
            writer = None
            if rank == 0:  # rank 0 alone writes, as the chunks come
                writer = stack.enter_context(SamplesWriter(
                    args.out, args.num_samples, module.sample_shape, module.normalization, labels
                ))  # fmt: skip
            for chunk in generate_in_chunks(  # images as uint8: a quarter of the bytes to hold and gather
                module, args.num_samples, sampler=sampler, seed=args.seed, batch_size=args.batch_size,
                rank=rank, world_size=world_size, all_gather=all_gather,  # type: ignore[arg-type]  # of a tensor: a tensor
                progress=rank == 0, labels=labels,
            ):  # fmt: skip
                if writer is not None:
                    writer.write(chunk)
            if writer is not None:
                writer.finish()
                print(f"wrote {args.num_samples} samples to {path} and {Path(args.out) / 'grid.png'}")
        if fabric is not None:
            fabric.barrier()  # every rank returns only once the files exist
        return path


if __name__ == "__main__":
    main()
