"""A model that leaves the project: `python -m diffusion.export --ckpt PATH --format FORMAT --out DIR`.

--format safetensors: DIR/model.safetensors (the network's weights) and DIR/config.json (the network's settings,
the noise schedule, the prediction type, the sample shape, the normalization, the class names, the sampling
defaults). `diffusion.training.loading.load_checkpoint(DIR)` rebuilds the model from it, and so can a few lines
with `diffusion.models.UNet` (docs/export.md); reading it runs no code.

--format diffusers: a diffusers DDPMPipeline (UNet2DModel + DDPMScheduler, `save_pretrained`), which
`DDPMPipeline.from_pretrained(DIR)` loads in a Python that has diffusers and not this package. For an
unconditional UNet with channel_mult[0] = 1 predicting what it is fed (no learned variances); other models are
refused in one line (export them with --format safetensors). Needs `pip install diffusers`.

The EMA weights by default (--weights raw: the raw ones; a run without EMA has only raw weights). DIR must be
new or empty: --overwrite replaces what an earlier export wrote there. The files are written to a temporary
folder next to DIR (in DIR where that is another filesystem: a mount point) and moved in once complete. One
export at a time writes DIR: a second is refused at once, naming the first (`export_lock`). A user error ends in
one line on stderr and exit status 2; --debug (or DIFFUSION_DEBUG=1) shows its traceback.
"""

import os
import shutil
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Literal

from jsonargparse import ArgumentParser

from diffusion.cli.flags import (
    add_flags,
    check_local_output,
    check_path_given,
    check_writable_folder,
    command_parser,
)
from diffusion.cli.parse_errors import parsed_command_line
from diffusion.cli.reporting import reporting_user_errors
from diffusion.cli.to_diffusers import check_pipeline_fits, import_diffusers, save_pipeline
from diffusion.data.folder_lock import writing_alone
from diffusion.errors import UserError, naming_a_full_disk
from diffusion.training.atomic_writes import EXPORT_ENTRIES, move_into, staging_folder
from diffusion.training.checkpoint_files import check_written_by_train, read_checkpoint
from diffusion.training.exported import write_export
from diffusion.training.loading import is_export_without_config, load_checkpoint, model_source
from diffusion.training.run_folders import POST_HOC_EMA, part_of_a_run

Format = Literal["safetensors", "diffusers"]


def build_parser() -> ArgumentParser:
    parser = command_parser("python -m diffusion.export", __doc__)
    add_flags(parser, "ckpt")
    parser.add_argument(
        "--format", type=Format, required=True,
        help="safetensors (this project's, every model) or diffusers (a DDPMPipeline)",
    )  # fmt: skip
    parser.add_argument("--out", type=str, required=True, help="output folder (new or empty)")
    add_flags(
        parser, "weights", "overwrite",
        overwrite={"help": "write into a folder that is not empty, replacing an earlier export's files"},
    )  # fmt: skip
    return parser


# Names of files, not folders: an export is a folder (config.json and model.safetensors, or a diffusers pipeline).
FILE_SUFFIXES = (".ckpt", ".safetensors", ".pt", ".pth", ".bin", ".npz")


def check_out(out: str) -> None:
    check_local_output(out, "--out", "export")
    check_writable_folder(out, "--out")
    path = Path(out).expanduser()
    if (
        path.suffix in FILE_SUFFIXES and not path.is_dir()
    ):  # `--out x.ckpt` made a folder that looks a checkpoint
        raise UserError(
            f"--out {out} names a file, and an export is a folder (config.json and model.safetensors, or a diffusers "
            "pipeline)",
            f"pass a folder: --out {path.with_suffix('')}",
        )
    # A run's folder, its checkpoints, post-hoc EMA snapshots or sample grids: --overwrite mixed an export into
    # them, said "not empty" of an export that was not there
    holds = part_of_a_run(path)
    if holds:
        raise UserError(
            f"--out {out} holds {holds}, and an export is a folder of its own",
            f"pass a new folder, e.g. --out {path.parent / (path.name + '_export')}",
        )


EXPORT_LOCK = ".export.lock"  # in --out, where its parent cannot be written (`export_lock`)


def export_lock(out: Path) -> Path:
    """Where an export into the folder `out` holds its lock (`writing_alone`): beside the folder, `.OUT.lock` in its
    parent, so that the folder users copy and load never holds it, and an --out made by a refused or failed export
    is empty still; in `out` itself (`EXPORT_LOCK`, which `check_empty` passes over, as loading does: it reads
    config.json and model.safetensors) where the parent cannot be written (a mount point's, a shared one's)."""
    real = out.resolve()  # a link to the folder and the folder: one lock
    if real.parent.exists() and not os.access(real.parent, os.W_OK | os.X_OK):
        return real / EXPORT_LOCK
    return real.parent / f".{real.name}.lock"


def check_empty(out: str, overwrite: bool) -> None:
    """An --out with files is replaced with --overwrite only; checked with --out held (`export_lock`): another
    export may have written it since the command began."""
    path = Path(out).expanduser()
    there = sorted(p.name for p in path.iterdir() if p.name != EXPORT_LOCK) if path.is_dir() else []
    if there and not overwrite:
        if not any(name in EXPORT_ENTRIES for name in there):  # "replace an export there" of a user's files
            shown = ", ".join(there[:3]) + (f" and {len(there) - 3} more" if len(there) > 3 else "")
            raise UserError(
                f"--out {path} is not empty, and holds no export ({shown})",
                "pass a new --out (--overwrite writes the export among those files)",
            )
        raise UserError(
            f"--out {path} is not empty", "pass --overwrite to replace an export there, or a new --out"
        )


def training_checkpoint(path: str) -> str:
    """The checkpoint file --ckpt names (a folder holding exactly one stands for it). An export or a diffusers
    folder, which sample's --ckpt and load_checkpoint take, is refused as what it is (`model_source` tells them
    apart, as for train.py's --model.init_from): it holds one set of weights, not the training checkpoint's raw and
    EMA ones and network settings an export is written from, and "it holds no checkpoint" would call it empty."""
    check_path_given(path, "--ckpt")
    given = Path(path).expanduser()
    snapshot = given.exists() and POST_HOC_EMA in (given.name, given.parent.name)  # no model of its own yet
    if snapshot:
        raise UserError(
            f"--ckpt {path} is a post-hoc EMA snapshot{'s folder' if given.name == POST_HOC_EMA else ''}, which "
            "holds one profile's averages, not a model",
            "reconstruct a model from the snapshots first (python -m diffusion.phema --run RUN --sigma_rel S "
            "--out OUT.ckpt), then export OUT.ckpt",
        )
    # An export that lost its config.json is an export still: not a folder without a checkpoint, nor one to copy
    # again whole (`model_source`'s line) when a checkpoint is what export wants.
    partial = is_export_without_config(path)
    kind, source = ("export", Path(path)) if partial else model_source(path, "--ckpt")
    if kind != "checkpoint":
        what = "is a diffusers folder" if kind == "diffusers" else "is an export (python -m diffusion.export)"
        if partial:
            what = "is an export's model.safetensors without its config.json (python -m diffusion.export)"
        taken = "" if partial else "; python -m diffusion.sample and load_checkpoint take it as it is"
        raise UserError(
            f"--ckpt {path} {what}, which holds one set of weights and no training state",
            "export converts training checkpoints: pass the checkpoint it was exported from "
            f"(runs/<name>/version_N/checkpoints/*.ckpt){taken}",
        )
    return str(source)


def weights_written(asked: str | None, checkpoint: dict) -> str:
    """Which weights `load_checkpoint(weights=asked)` loaded, as the export records them: the EMA ones unless the
    raw ones were asked for (None asks for the EMA, as load_checkpoint reads it); a run without EMA keeps only raw
    weights, under "state_dict", which every choice loads."""
    return "raw" if asked == "raw" or "current_model_state" not in checkpoint else "ema"


def main(argv: list[str] | None = None) -> Path:
    """`python -m diffusion.export [flags]`: write the export into OUT and return OUT."""
    with reporting_user_errors(argv), ExitStack() as held:
        command_line = parsed_command_line(build_parser(), argv)
        args = command_line.config
        check_out(args.out)
        # Held from here, before the checkpoint is read: a second export into --out is refused at once, in one
        # line ("--out DIR is being written by another export (pid N ...)"); two at once both said they wrote it.
        held.enter_context(writing_alone(args.out, "export", export_lock(Path(args.out).expanduser())))
        check_empty(args.out, args.overwrite)
        args.ckpt = training_checkpoint(args.ckpt)
        checkpoint = read_checkpoint(args.ckpt, "--ckpt")
        network = check_written_by_train(checkpoint, args.ckpt, "--ckpt")["network"]
        if args.format == "diffusers":
            import_diffusers()  # before any time is spent: one line if it is missing
        module = load_checkpoint(args.ckpt, weights=args.weights)
        if args.format == "diffusers":
            check_pipeline_fits(module)  # refused before anything is written
        command_line.print_config_if_asked()  # once the checks have passed: what would run
        weights = weights_written(args.weights, checkpoint)
        out = Path(args.out).expanduser()
        made_out = not out.exists()
        out.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=staging_folder(out)))
        try:
            with naming_a_full_disk(out / "the export", "free space there, or pass another --out"):
                if args.format == "diffusers":
                    save_pipeline(module, staged)
                else:
                    write_export(module, network, staged, weights)
                move_into(staged, out)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)  # before `out` is looked at: it may be staged in there
            if made_out and not any(out.iterdir()):
                out.rmdir()  # a failed export leaves no folder of its own behind
            raise
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        print(f"wrote the {weights} weights of {args.ckpt} to {out} ({args.format})")
        return out


if __name__ == "__main__":
    main()
