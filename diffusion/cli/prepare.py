"""A data set prepared once: `python -m diffusion.prepare --config configs/cifar10.yaml --out DIR_OR_URL`.

Takes the data flags train.py takes (`--config FILE`, whose other sections are train.py's and left alone here, a
flag of theirs refused, and `--data.*`), reads the data as training would (an image folder, its class subfolders as
labels with `--data.conditional true`; a .npy array; MNIST, Fashion-MNIST, CIFAR-10, the digits, the toy vector
sets) and writes it to --out, a folder or object storage (s3://, gs://, az://), as a prepared set
(diffusion.data.prepared): litdata's chunks of uint8 images at the training size (or vectors in model units), their
labels and what a run needs to know, in --num_workers processes with a progress bar. Train on it with
`python train.py --config <the recipe> --data.dataset streaming --data.root DIR_OR_URL` (vectors: --data.path):
held on the device where it fits, streamed otherwise.

--encoding raw stores pixels as they are (decoded for free; the default up to 64 px), png losslessly compressed (the
default above), jpeg smaller still and lossy. The same source, --seed and --num_workers give the same chunks. An --out
that holds a prepared set (or what a stopped prepare left) is refused unless --overwrite, which replaces it: a
finished set in a folder is kept until the new one, written into --out/prepare.partial/ (the disk holds both until
then), is finished, so a prepare that fails leaves it as it was; an unfinished prepare's files, and a set in object
storage, go first. One that holds other files, or is, holds or lies inside the data it prepares, is refused whatever
the flags. A prepare stopped on the way leaves no prepared.json, so training refuses that set. A user error ends in
one line on stderr and exit status 2.
"""

import sys
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser
from jsonargparse.typing import PositiveInt

from diffusion.cli.command_line import Written, written_as
from diffusion.cli.config_files import as_text
from diffusion.cli.flags import add_flags, check_writable_folder, command_parser
from diffusion.cli.legacy import class_at
from diffusion.cli.parse_errors import flags_written, parsed_command_line
from diffusion.cli.reporting import reporting_user_errors
from diffusion.cli.train_checks import class_error_as_written
from diffusion.data import ImageDataModule, VectorDataModule
from diffusion.data.prepared import Encoding, is_url
from diffusion.data.preparing import named_out, prepare
from diffusion.errors import UserError

# The sections of a train.py config that are not data: a recipe's --config is read whole, these left alone.
TRAINING_SECTIONS = (
    "seed_everything",
    "trainer",
    "model",
    "ckpt_path",
    "ddp_timeout",
    "checkpoint",
    "ema",
    "sample_grid",
)
# A flag of those sections, refused: it would do nothing here.
LEFT_ALONE = "section, which prepare reads only from a train.py --config file, and leaves alone"
NOT_HERE = "drop it here and pass it to train.py; prepare takes --data.* and its own options (see --help)"
# Sets whose every sample has a class: stored with their labels, so one prepared set serves both kinds of run.
LABELLED_SOURCES = ("digits", "mnist", "fashion_mnist", "cifar10")


def build_parser() -> ArgumentParser:
    parser = command_parser("python -m diffusion.prepare", __doc__)
    parser.add_subclass_arguments(
        (ImageDataModule, VectorDataModule), "data", default={"class_path": "diffusion.data.ImageDataModule"},
        help="what to prepare, as train.py's --data (default: the digits)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=str, required=True, help="where to write it: a folder, or s3://, gs://, az://"
    )
    parser.add_argument(
        "--encoding", type=Encoding, default="auto",
        help="how images are stored: raw pixels, png (lossless) or jpeg (lossy); auto: raw up to 64 px, png above",
    )  # fmt: skip
    add_flags(
        parser, "seed", "overwrite",
        seed={"help": "the seed of the shuffle before the set is cut into chunks"},
        overwrite={"help": "replace the prepared set --out holds once the new one is finished (or an unfinished prepare's files), nothing else"},
    )  # fmt: skip
    parser.add_argument(
        "--num_workers", type=PositiveInt | None, default=None,
        help="processes that read and write the samples; default: the CPU count, at most 8",
    )  # fmt: skip
    group = parser.add_argument_group("train.py's sections of a --config, not used here")
    for section in TRAINING_SECTIONS:
        said = "read from a train.py --config file and left alone; refused as a flag"
        group.add_argument(f"--{section}", type=Any, default=None, help=said)
    return parser


def check_no_training_flag(argv: list[str]) -> None:
    """Refuse a flag of train.py's sections (`--model.lr 5`, `--trainer.max_steps 9`): prepare takes them only
    from a train.py --config file, to leave them alone, so the flag would do nothing without a word."""
    for key, values in flags_written(argv):
        section = key.split(".")[0]
        if section in TRAINING_SECTIONS:
            given = " ".join([f"--{key}", *values])
            raise UserError(
                f"{given}: not an option of this command (train.py's {section} {LEFT_ALONE})", NOT_HERE
            )


# The data module's options of the training loader, which a prepared set does not hold: given, each is noted unused.
LOADER_OPTIONS = {
    "batch_size": "the batch size is the training loader's — pass it to train.py",
    "num_workers": "it sets the training loader's workers — prepare's own --num_workers sets its processes",
    "on_device": "it says where training holds the data — pass it to train.py with the prepared set",
}


def note_training_loader_options(written: list[Written], options: Any) -> None:
    """A note for each training-loader option of --data the user gave: prepare writes the data set, and would take
    it without a word (`--data.num_workers 3` set nothing)."""
    for name, why in LOADER_OPTIONS.items():
        keys = (f"data.{name}", f"data.init_args.{name}")
        if any(item.key in keys for item in written):
            key = next(item.key for item in reversed(written) if item.key in keys)
            print(
                f"note: {written_as(written, key)} {as_text(options.get(name))} is not used: prepare writes the "
                f"data set, and {why}",
                file=sys.stderr,
            )


def main(argv: list[str] | None = None) -> str:
    """`python -m diffusion.prepare [flags]`: write the prepared set, return where it is."""
    with reporting_user_errors(argv):
        parser = build_parser()
        check_no_training_flag(sys.argv[1:] if argv is None else argv)
        command_line = parsed_command_line(parser, argv)
        args = command_line.config
        named_out(args.out)  # before anything is read: "" would be the current folder
        if not 0 <= args.seed < 2**64:  # prepare() would say it as its argument, seed=-4
            raise UserError(
                f"--seed {args.seed} is out of range (must be a whole number in [0, 2**64 - 1])",
                "pass a seed from 0 to 18446744073709551615: the order the samples are stored in",
            )
        args.out = args.out if is_url(args.out) else str(Path(args.out).expanduser())  # `out: ~/x`
        if not is_url(args.out):
            check_writable_folder(args.out, "--out")
        data = args.data
        dataset = data.init_args.get("dataset")
        if dataset == "streaming":
            raise UserError(
                "--data.dataset streaming is a prepared set already", "name the source it was prepared from"
            )
        # --data's class path names a class.
        data_class = class_at(data.class_path)
        if issubclass(data_class, ImageDataModule) and dataset in LABELLED_SOURCES:
            data.init_args.conditional = True
        # Built here, not by the parser: a check of the second class of --data's union was lost in its report.
        try:
            datamodule = data_class(**data.init_args.as_dict())
        except (
            ValueError,
            UserError,
        ) as error:  # the data module's own checks: said of its options as written
            named = class_error_as_written(error, {data_class: "data"}, command_line.written, args)
            if named is None:
                raise
            raise named from error
        note_training_loader_options(command_line.written, data.init_args)
        source = data.init_args.get("root") if dataset == "folder" else data.init_args.get("path") or dataset
        prepared = prepare(
            datamodule,
            args.out,
            args.encoding,
            args.seed,
            args.num_workers,
            args.overwrite,
            source=str(source),
            checked=command_line.print_config_if_asked,  # once the data is read: what would run
        )
        print(f"wrote {prepared.describe()}", file=sys.stderr)
        return prepared.root


if __name__ == "__main__":
    main()
