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
for the samples. One sample at a time writes OUT: a second is refused at once, naming the first (`sampling_alone`).
The samples are written as they are made, into OUT/samples.partial/, and moved into OUT only once all are in;
samples that are not finite stop the run with nothing written. A user error ends in one line on stderr and exit
status 2; --debug (or DIFFUSION_DEBUG=1) shows its traceback.
"""

import contextlib
import inspect
import shutil
import sys
import warnings
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, get_args

import torch
from jsonargparse import ArgumentParser
from jsonargparse.typing import PositiveInt

from diffusion.cli.command_line import Written
from diffusion.cli.flags import (
    add_flags,
    add_sampling_arguments,
    check_local_output,
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
from diffusion.cli.process_group import check_other_machines_named, closing_process_group, launch_ranks
from diffusion.cli.reporting import reporting_user_errors
from diffusion.core.samplers.contract import Sampler
from diffusion.core.sampling import SamplingOptions, UnusedSamplingOption, unused_options
from diffusion.data.folder_lock import writing_alone
from diffusion.errors import COMMAND, UserError
from diffusion.generation.precision import Precision, network_precision
from diffusion.generation.ranks import generate_in_chunks
from diffusion.generation.render import SamplesWriter, samples_file_bytes
from diffusion.training.atomic_writes import check_can_replace
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


SAMPLE_LOCK = ".sample.lock"  # in --out while a sample writes there: "<pid> <host> <started>" of that sample


def sampling_alone(out: str) -> contextlib.AbstractContextManager[None]:
    """Hold `out` (its `SAMPLE_LOCK`: `writing_alone`) while the block checks the files this sample replaces and
    writes them, or refuse at once where another sample holds it ("--out DIR is being written by another sample
    (pid N ...)"): two samples into one folder shared its samples.partial/, and one of them failed after its
    sampling. The folders made for `out` go again on the way out where they are empty (a refused or failed
    sample's)."""
    return writing_alone(out, "sample", Path(out) / SAMPLE_LOCK)


def check_replaced(out: str, overwrite: bool) -> None:
    """The files this command writes, where they exist already: kept unless --overwrite, and then each one that
    would refuse to be replaced (`chattr +i`: it failed after the sampling, the grid replaced already) refused
    now, said as the file where its folder takes files (`check_can_replace`)."""
    for written in (Path(out) / "samples.npz", Path(out) / "grid.png"):
        if (
            written.is_dir()
        ):  # --overwrite would replace a folder: the OS's IsADirectoryError, grid.png moved in
            raise UserError(
                f"--out {out}: {written} is a folder, where the file {written.name} goes",
                "move that folder away, or pass another --out",
            )
        if written.exists() and not overwrite:
            raise UserError(f"{written} exists", "pass --overwrite to replace it, or another --out")
        check_can_replace(written)


def check_precision(precision: int | str) -> None:
    if str(precision) not in get_args(Precision):
        raise UserError(
            f"--precision {precision} is not supported for sampling",
            "choose 32, 16-mixed or bf16-mixed (true half precision would round the noise schedule)",
        )


def in_bytes(num_bytes: int) -> str:
    """A size in the unit that shows it: bytes, kB, MB or GB (decimal units, as `df -H` says them)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= size:
            return f"{num_bytes / size:,.1f} {unit}"
    return f"{num_bytes:,} bytes"


def check_room(out: str, num_samples: int, sample_shape: tuple[int, ...], conditional: bool) -> None:
    """Refuse before any sampling time is spent unless the disk holding `out` (or its nearest existing parent) has
    room for the samples file. What --overwrite replaces is no room: the new files are written beside the old
    ones (OUT/samples.partial/), which go only once the new ones are complete."""
    needed = samples_file_bytes(num_samples, sample_shape, conditional)
    existing = next(p for p in [Path(out), *Path(out).absolute().parents] if p.exists())
    free = shutil.disk_usage(existing).free
    if needed <= free:
        return
    shown_needed, shown_free = in_bytes(needed), in_bytes(free)
    if shown_needed == shown_free:  # rounded to the same: the bytes say which is larger
        shown_needed, shown_free = f"{needed:,} bytes", f"{free:,} bytes"
    replaced = [p for p in (Path(out) / "samples.npz", Path(out) / "grid.png") if p.is_file()]
    kept = ""
    if replaced:
        names = " and ".join(p.name for p in replaced)
        kept = (
            f" (the {names} it replaces, {in_bytes(sum(p.stat().st_size for p in replaced))}, stay until the new "
            "samples are complete)"
        )
    raise UserError(
        f"{{command:--num_samples}} {num_samples}: the samples would take {shown_needed} and {{command:--out}} "
        f"{out} has {shown_free} free{kept}",
        "sample fewer ({command:--num_samples}), or write to a disk with room ({command:--out})",
    )


def chosen_sampler(
    module: Any, options: SamplingOptions, written: Sequence[Written]
) -> tuple[Sampler, str | None]:
    """The sampler of the flags over the checkpoint's defaults, and a note of each option written that it has no
    option for (`--eta` of ddpm), said as the flag: the API's warning of the same (`UnusedSamplingOption`) would
    say it a second time, in Python's words."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedSamplingOption)
        with ranges_said_as_flags():  # a sampling check (guidance the model never learnt) said of the flags
            sampler = module.model_sampling.sampler(options)
    given = {item.key for item in written if item.values != (None,)}
    notes = [
        f"--{name} is no option of the {sampler.name} sampler: not used ({takers} {'take' if ',' in takers else 'takes'} it)"
        for name, takers in unused_options(sampler, given).items()
    ]
    # The steps the checkpoint chose for its own sampler, taken by another: `--sampler ddpm` ran 20 DDPM steps where
    # the user may have expected all of the schedule's (a recipe's comment once promised them).
    default = module.sampling
    if (
        "sampler" in given
        and "steps" not in given
        and default.steps is not None
        and sampler.name != default.sampler
    ):
        notes.append(
            f"--sampler {sampler.name} takes the checkpoint's --steps {default.steps} (chosen for its sampler "
            f"{default.sampler}); pass --steps N for another number (the schedule has "
            f"{module.schedule.num_timesteps})"
        )
    # Vectors are standardized by default (std 3 per feature in model units, configs/toy2d.yaml), not bounded to
    # [-1, 1]: clipped, every x_0 prediction was squeezed to within a third of a standard deviation of the mean
    if (
        "clip_denoised" in given
        and getattr(sampler, "clip_denoised", False)
        and len(module.sample_shape) == 1
    ):
        notes.append(
            "--clip_denoised true clips each predicted x_0 to [-1, 1], where vectors lie only if trained with "
            "--data.normalize minmax (standardized, the default, they spread beyond it): the samples would be "
            "squeezed toward the mean — leave --clip_denoised false unless this model's data were min-max scaled"
        )
    return sampler, "; ".join(notes) or None


def main(argv: list[str] | None = None) -> Path:
    """`python -m diffusion.sample [flags]`: write OUT/samples.npz and OUT/grid.png, return the .npz path."""
    with reporting_user_errors(argv), closing_process_group(), ExitStack() as held:
        command_line = parsed_command_line(build_parser(), argv)
        args = command_line.config
        check_seed_flag(args.seed)  # before the checkpoint is read and the ranks started
        with ranges_said_as_flags():
            options = SamplingOptions.taken_from(args)
        device: str | torch.device
        device, accelerator = resolve_device(args.device, args.accelerator, args.devices * args.num_nodes)
        check_precision(args.precision)
        check_other_machines_named(args.num_nodes)  # before --print_config; it waited for them without end
        args.precision = str(args.precision)  # `precision: 32` in a file is YAML's int
        check_local_output(args.out, "--out", "sample")
        check_writable_folder(args.out, "--out")
        # As export's: `out: ~/x` in a file wrote into a folder named ~
        args.out = str(Path(args.out).expanduser())
        path = Path(args.out) / "samples.npz"
        one_process = args.devices == 1 and args.num_nodes == 1
        if one_process:  # --out held from here: its files checked are the files it replaces
            held.enter_context(sampling_alone(args.out))
        check_replaced(args.out, args.overwrite)
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
        check_room(args.out, args.num_samples, sample_shape, labels is not None)
        # --steps beyond the checkpoint's schedule: refused here, before --print_config and the ranks start
        options.check_steps_fit(int(hparams.get("num_timesteps", 1000)), COMMAND, "steps")
        command_line.print_config_if_asked()  # once the command's checks have passed: what would run
        fabric, rank, world_size, device = launch_ranks(
            args.devices, args.num_nodes, accelerator, device, argv, "diffusion.sample"
        )
        if rank == 0 and not one_process:  # the other ranks re-ran the checks: rank 0 alone holds --out
            held.enter_context(sampling_alone(args.out))
            # Again, held: another sample may have written them since
            check_replaced(args.out, args.overwrite)
        if rank == 0:
            note = cpu_mixed_precision_note(args.precision, training=False)
            if note and torch.device(device).type == "cpu":
                print(f"note: {note}", file=sys.stderr)
        with ranges_said_as_flags():  # its `{--weights}` said as this command's flag
            module = load_checkpoint(args.ckpt, weights=args.weights, map_location=device)
        sampler, note = chosen_sampler(module, options, command_line.written)  # once, over the defaults
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
