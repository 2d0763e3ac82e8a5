"""The flags the commands share, declared once, and their checks before any time is spent.

Every command's parser has train.py's conventions: `--config FILE`, `--print_config` and `--debug`
(`command_parser`). The flags several commands take (`--ckpt`, `--device`, `--seed`, `--batch_size`,
`--overwrite`, ...) are declared once, in `FLAGS`, and added by name (`add_flags`), a command changing only what
differs for it (a default, the help); the sampling flags (`--sampler`, `--steps`, `--eta`, ...) are made from
`SamplingOptions`.
Their values are checked here too: the device, the output folder, the checkpoint, the class labels.
"""

import argparse
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser, DefaultHelpFormatter
from jsonargparse.typing import PositiveInt

from diffusion.cli.jsonargparse_internals import take_negative_numbers_as_values
from diffusion.core.sampling import SamplingOptions, option_help, sampler_help
from diffusion.data.file_in_folder import file_in_folder, url_given
from diffusion.data.labels import class_labels
from diffusion.errors import COMMAND, CallerError, OutOfRange, UserError, refusing_flag
from diffusion.generation.arguments import SEED_LIMIT, checked_seed
from diffusion.generation.ranks import SAMPLING_BATCH
from diffusion.training.checkpoint_files import CHECKPOINT
from diffusion.training.loading import Weights, model_hyperparameters, model_source

DEBUG_VARIABLE = "DIFFUSION_DEBUG"
Accelerator = Literal["auto", "cpu", "cuda", "gpu"]

FLAGS: dict[str, dict[str, Any]] = {
    "ckpt": {"type": str, "required": True, "help": "a checkpoint of train.py (e.g. .../last.ckpt)"},
    "weights": {"type": Weights, "default": "ema", "help": "EMA weights or raw ones"},
    "batch_size": {"type": PositiveInt, "default": SAMPLING_BATCH, "help": "how many at a time on each device"},
    "seed": {"type": int, "default": 0, "help": "the seed of the noise"},
    "overwrite": {
        "action": ActionYesNo, "nargs": "?", "default": False, "help": "replace what this command wrote before",
    },
    "device": {
        "type": str | None, "default": None, "help": "cpu, cuda, cuda:1, ...; default: cuda if visible, else cpu",
    },
    "devices": {"type": PositiveInt, "default": 1, "help": "processes to run on (one per GPU)"},
    "num_nodes": {"type": PositiveInt, "default": 1, "help": "machines, when started by torchrun / srun"},
    "accelerator": {
        "type": Accelerator, "default": "auto", "help": "cpu or cuda (gpu); default: the type of --device",
    },
}  # fmt: skip
"""The flags more than one command takes, by name: the keyword arguments of their `add_argument`."""


class _HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help (types, defaults) with the description's line breaks kept."""


def command_parser(prog: str, description: str) -> ArgumentParser:
    """A parser for `python -m <prog>` with train.py's conventions: `--config FILE`, `--print_config`, `--debug`.

    Parse errors raise (exit_on_error=False) so that `reporting_user_errors` prints them as one line. No flag is
    taken by a prefix of its name (allow_abbrev=False, as train.py): `--step 3` set --steps without a word, and a
    later flag sharing the prefix would have changed what an old command line means.
    """
    parser = ArgumentParser(
        prog=prog,
        description=description,
        exit_on_error=False,
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    take_negative_numbers_as_values(parser)  # `--eta -1e-1`
    parser.add_argument(
        "--config", action=ActionConfigFile, help="options from a YAML file (see --print_config)"
    )
    add_debug_flag(parser)
    return parser


class TakesArguments(Protocol):
    """A parser or a group of its arguments."""

    def add_argument(self, *args: Any, **kwargs: Any) -> Any: ...


def add_flags(parser: TakesArguments, *names: str, **changes: dict[str, Any]) -> None:
    """Add `--<name>` for each of `names` as `FLAGS` declares it, updated by `changes[name]` where the command
    differs, e.g. ``add_flags(parser, "seed", "device", seed={"help": "seed of the reference subset"})``."""
    unknown = set(changes) - set(names)
    if unknown:
        raise CallerError(f"changes to flags not added: {sorted(unknown)}")
    for name in names:
        parser.add_argument(f"--{name}", **{**FLAGS[name], **changes.get(name, {})})


def add_debug_flag(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--debug", action=ActionYesNo, nargs="?", default=False,
        help=f"show the traceback of a user error rather than one line (also: {DEBUG_VARIABLE}=1)",
    )  # fmt: skip


def debug_requested(argv: Sequence[str] | None = None) -> bool:
    """DIFFUSION_DEBUG set (not 0/false/no), or --debug on the command line (argv, or sys.argv)."""
    if os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no"):
        return True
    args = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(args):
        if arg in ("--debug=true", "--debug=yes"):
            return True
        if arg == "--debug":
            following = args[i + 1] if i + 1 < len(args) else ""
            # `--debug maybe` is a bad value, which the parser reports in one line
            return following.startswith("-") or following.lower() in ("", "true", "yes")
    return False


def add_sampling_arguments(parser: ArgumentParser) -> None:
    """A flag for every field of `SamplingOptions` (`--sampler`, `--steps`, `--eta`, ...: every registered
    sampler's options), with the registry's help; unset, each takes the checkpoint's value."""
    group = parser.add_argument_group("sampling (a flag left out takes the checkpoint's value)")
    for option in fields(SamplingOptions):
        text = sampler_help() if option.name == "sampler" else option_help(option.name)
        group.add_argument(f"--{option.name}", type=option.type, default=None, help=text)


def resolve_device(device: str | None, accelerator: str, processes: int = 1) -> tuple[str, str]:
    """(device of a one-device run, accelerator of a Fabric run): an explicit --accelerator decides both, and one
    that names another kind of device than an explicit --device is refused (one of them was dropped unsaid), as is
    one device by its index (`cuda:1`) for a run of more than one process (`processes`: --devices x --num_nodes),
    which would take devices 0..N-1 whatever the index."""
    if processes > 1 and device is not None and ":" in device:
        raise UserError(
            f"--device {device} names one device, and --devices/--num_nodes start {processes} processes, "
            "one per device (0, 1, ...): the index would not be used",
            "drop --device (choose the GPUs with CUDA_VISIBLE_DEVICES), or pass --devices 1 to run on that one",
        )
    explicit = accelerator in ("cpu", "cuda", "gpu")
    if explicit and device is not None and device.startswith("cuda") != (accelerator != "cpu"):
        raise UserError(
            f"--accelerator {accelerator} and --device {device} name different kinds of device",
            "give one of them: --device alone for one device (cpu, cuda, cuda:N), or --accelerator with --devices N",
        )
    if explicit and device is None:
        device = "cpu" if accelerator == "cpu" else "cuda"
    flag = f"--accelerator {accelerator}" if explicit else f"--device {device}"
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.device(device)
    except RuntimeError as err:
        raise UserError(f"--device {device} is not a device", "pass cpu, cuda or cuda:N") from err
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"{flag}: no CUDA GPU is visible here", f"use {flag.split()[0]} cpu")
    return device, "cuda" if device.startswith("cuda") else "cpu"


EMPTY_PATH_FIX = (
    "pass a path (an unset shell variable or a blank value in a config file gives an empty one, which would "
    "mean the current folder)"
)


def check_path_given(path: str | os.PathLike | None, flag: str) -> None:
    """Raise UserError for an empty (or blank) path: pathlib reads `""` as the current folder, so `--out ""`
    wrote there and `--ckpt ""` took the checkpoint it found there. None (an optional path left out) passes."""
    if path is not None and not str(path).strip():
        raise UserError(f'{flag} "{path}" is an empty path', EMPTY_PATH_FIX)


def check_paths_given(args: Any, *names: str) -> None:
    """`check_path_given` for each of a command's path flags `names` (`out`, `ckpt`, ...), as `--name`."""
    for name in names:
        check_path_given(getattr(args, name), f"--{name}")


def check_local_output(path: str | os.PathLike | None, flag: str, command: str) -> None:
    """Refuse an object-storage URL as an output path of a command that writes local files only (sample, export,
    phema, evaluate): pathlib read `s3://b/x` as the local folder `s3:/b/x`, written there and said to be "s3:/b/x"
    (prepare writes to object storage; train.py's folders go through Lightning's fsspec: `check_writable_folder`).
    Before the path is expanded, which collapses the `//`. None (an optional path left out) passes."""
    url = url_given(path)
    if url is not None:
        raise UserError(
            f"{flag} {url} is an object-storage URL, and {command} writes local files only",
            "pass a local path, and copy the result up with your storage's tool (python -m diffusion.prepare "
            "alone writes to s3://, gs://, az://)",
        )


def check_writable_folder(path: str | os.PathLike, flag: str, given: str | os.PathLike | None = None) -> None:
    """Raise UserError unless `path` is a folder this process can write into, or could create.

    Nothing is created: the nearest existing ancestor is tested by writing a temporary file there. `given`: the
    flag's value when `path` is the folder of it (a file's `--out`); the line quotes it, as the user typed it.
    An object-storage URL (train.py's folders, which Lightning writes through fsspec) is not probed: refused only
    where fsspec lacks the package for it (s3fs, gcsfs, adlfs), whose ImportError ended the run as a bug.
    """
    check_path_given(path if given is None else given, flag)
    url = url_given(path if given is None else given)
    if url is not None:
        check_fsspec_protocol(url, flag)
        return
    path = Path(path).expanduser()
    shown = path if given is None else given
    if given is None and path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a folder", "pass a folder (it is created if missing)")
    existing = next(p for p in [path, *path.absolute().parents] if p.exists())
    if not existing.is_dir():
        raise UserError(f"{flag} {shown}: {existing} is a file, not a folder", "pass a path through folders")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        if (
            reason := refusing_flag(existing)
        ) is not None:  # its mode bits allow it: "a folder you can write to"
            raise UserError(  # pointed nowhere
                f"{flag} {shown}: cannot write into {existing} ({reason})",
                f"check its attributes (lsattr -d {existing}; chattr -i clears an immutable flag), or pick "
                "another folder",
            ) from err
        raise UserError(
            f"{flag} {shown}: cannot write into {existing} ({err.strerror or err})",
            "pick a folder you can write to",
        ) from err


def check_fsspec_protocol(url: str, flag: str) -> None:
    """fsspec can write to `url` (the package of its storage is installed), as Lightning's loggers and checkpoints
    would: its ImportError's own words, said of the flag."""
    import fsspec  # Lightning's dependency

    try:
        fsspec.get_filesystem_class(url.split("://")[0])
    except (ImportError, ValueError) as err:
        raise UserError(
            f"{flag} {url} is an object-storage URL, which Lightning writes through fsspec, "
            f"and fsspec cannot write there ({err})",
            "install the package it names (s3fs, gcsfs or adlfs), or pass a local folder",
        ) from err


def cpu_mixed_precision_note(precision: str, training: bool) -> str | None:
    """What `--precision` 16-mixed or bf16-mixed means on a CPU (None for other precisions), for train.py and
    the sample CLI. Lightning has no fp16 autocast on a CPU: it runs 16-mixed as bf16-mixed (no GradScaler).
    Training steps under CPU autocast run about 10x slower than 32-bit; a sampling forward in bf16 took 0.5-0.8x
    the 32-bit time at batch 16-256 on an AVX512-BF16 CPU (CPUs without bf16 instructions convert, slower)."""
    if "mixed" not in precision:
        return None
    substitute = " (16-mixed runs as bf16-mixed: fp16 autocast needs CUDA)" if precision == "16-mixed" else ""
    if training:
        return (
            f"precision={precision} on CPU runs about 10x slower than 32-bit{substitute}; mixed precision pays off "
            "on CUDA GPUs. For CPU runs use --precision 32."
        )
    return (
        f"--precision {precision} on a CPU runs the network in bf16{substitute}: about as fast as 32 or faster with "
        "bf16 instructions (AVX512-BF16, AMX), slower without; mixed precision is meant for CUDA GPUs"
    )


def given_checkpoint(path: str, flag: str = "--ckpt") -> str:
    """The checkpoint file a flag names: a folder holding exactly one stands for it (`file_in_folder`)."""
    check_path_given(path, flag)
    return str(file_in_folder(path, flag, CHECKPOINT))


def given_model(path: str, flag: str = "--ckpt") -> tuple[str, dict]:
    """The model a flag names (a checkpoint, a folder holding one, an export or a diffusers folder: `model_source`)
    and its hyperparameters, read and checked before any time is spent."""
    check_path_given(path, flag)
    _, resolved = model_source(path, flag)
    return str(resolved), model_hyperparameters(resolved, flag)


def requested_labels(
    hparams: dict, num_samples: int, class_label: int | str | None, guidance: bool
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
    label = None if class_label is None else str(class_label)  # an index as a config file writes it: 3
    with ranges_said_as_flags():  # `{--class_label}` said as this command's flag
        return class_labels(num_samples, num_classes, label, hparams.get("class_names"))


def out_of_range(error: OutOfRange, shown: str, fix: str | None = None) -> UserError:
    """A range check said of the option as the user wrote it (`shown`: `--seed -1`, `run.yaml: data.batch_size
    0`), with the check's own requirement and fix (`fix`: that fix with its options said as flags)."""
    return UserError(f"{shown} is out of range (must be {error.requirement})", fix or error.fix)


def check_seed_flag(seed: Any, picks: str = "sample i's noise is a function of (seed, i)") -> None:
    """--seed is one torch takes as it is (`checked_seed`: a larger or negative one wraps to another seed);
    `picks`, what the seed decides in this command, said in the fix (sample's by default)."""
    try:
        checked_seed(seed)
    except OutOfRange as error:
        raise out_of_range(
            error, f"--seed {seed}", f"pass a seed from 0 to {SEED_LIMIT - 1}: {picks}"
        ) from error


@contextmanager
def ranges_said_as_flags() -> Iterator[None]:
    """A range check (OutOfRange) in the block said of the command's flag of the parameter's name: `--eta -1.0 is
    out of range (must be in [0, 1])` (the check's own words name a parameter: `eta=-1.0 must be ...`). A context,
    not a wrapper: the sampling walk stays three files (tests/cli/test_sample_cli.py)."""
    try:
        yield
    except OutOfRange as error:
        raise out_of_range(error, f"--{error.name} {error.value}") from error
    except (
        UserError
    ) as error:  # another check of the sampling options: its `{--name}` are this command's flags
        if error.owner is None:
            error.owner = COMMAND
        raise
