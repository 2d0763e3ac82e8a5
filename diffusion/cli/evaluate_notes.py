"""evaluate's notes on options given where they do nothing in the combination given (`--inception_weights` with
pixel features, `--overwrite` without `--save_stats`, `--data_root` with the bundled digits, a
`--kid_subset_size` where no KID is computed, ...): one way of saying them, `note: --key VALUE is not used: WHY`,
the option said as the command line wrote it (a config file's key where a file set it). A setting that cannot
hold in the combination (an `--image_size` Inception features would compare with samples of another size) is
refused instead.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import get_args

import numpy as np
from jsonargparse import ArgumentParser, Namespace

from diffusion.cli.command_line import (
    Written,
    everything_written,
    flags_written,
    has_keys_under,
    without_print_config,
    written_as,
)
from diffusion.cli.config_files import read_config_file
from diffusion.cli.jsonargparse_internals import action_of
from diffusion.data.images import ImageDatasetName
from diffusion.errors import UserError
from diffusion.metrics.features import PIXEL_SIZE
from diffusion.metrics.reference_stats import FeatureStatistics


def note_unused(written: Sequence[Written], key: str, value: object, why: str) -> None:
    """evaluate's one way of saying an option given that does nothing in the combination given: `note: --key
    VALUE is not used: WHY` on stderr (`run.yaml: key VALUE` where a config file set it; VALUE None: a bare
    `--overwrite`), and nothing when the command line did not write it."""
    if any(item.key == key for item in written):
        shown = "" if value is None else f" {value}"
        print(f"note: {written_as(written, key)}{shown} is not used: {why}", file=sys.stderr)


def note_unused_options(args: Namespace, samples: np.ndarray | None, written: Sequence[Written]) -> None:
    """Notes of --image_size, --data_root, --inception_weights and --overwrite given where they do nothing, and
    of --image_size under pixel features (which compare every image at 8x8); an --image_size that would have
    Inception features compare two sizes is refused, before the reference is read."""
    datasets = get_args(ImageDatasetName)
    said = written_as(written, "reference")
    reference = (
        f"no {said} is given" if args.reference is None
        else f"{said} digits is bundled (scikit-learn's 8x8 digits)" if args.reference == "digits"
        else f"{said} {args.reference} is a file, not a dataset" if args.reference not in datasets else None
    )  # fmt: skip
    if args.image_size is not None and args.reference not in datasets:
        note_unused(
            written, "image_size", args.image_size,
            f"it is the size a dataset {said} is rendered at, and {reference} (its images are used as they are)",
        )  # fmt: skip
    elif args.image_size is not None and samples is not None and args.image_size != samples.shape[1]:
        asked = f"{written_as(written, 'image_size')} {args.image_size} renders the reference at "
        asked += f"{args.image_size}x{args.image_size}"
        shape = f"{samples.shape[1]}x{samples.shape[2]}"
        if args.features == "inception":
            raise UserError(
                f"{asked}, and the samples are {shape}",
                "Inception features compare images of one size: leave --image_size out (a dataset reference is "
                "rendered at the samples' size), or pass --features pixels, which pools both to 8x8",
            )
        pooled = f"{PIXEL_SIZE}x{PIXEL_SIZE}"
        compared = (
            f"the {shape} samples and the reference are compared at {pooled} whatever the reference's size"
        )
        print(
            f"note: {asked}, and pixel features area-average every image to {pooled}: {compared}",
            file=sys.stderr,
        )
    if reference is not None:
        read = ", ".join(name for name in datasets if name != "digits")
        note_unused(
            written, "data_root", args.data_root,
            f"it is the folder a dataset {said} ({read}) is downloaded to or read from, and {reference}",
        )  # fmt: skip
    if args.inception_weights is not None and args.features != "inception":
        features = f"{written_as(written, 'features')} {args.features}"
        why = f"{features} computes no Inception features (the file is not read)"
        note_unused(written, "inception_weights", args.inception_weights, why)
    if args.overwrite and args.save_stats is None:
        bare = [item for item in written if item.key == "overwrite"][-1:] == [Written("overwrite", ())]
        note_unused(
            written, "overwrite", None if bare else "true",
            "it replaces an existing --save_stats file, and no --save_stats is given",
        )  # fmt: skip


def note_kid_subsets(
    subset_size: int,
    samples: np.ndarray,
    reference: np.ndarray | FeatureStatistics | None,
    written: Sequence[Written],
) -> None:
    """A note when a --kid_subset_size the user gave was capped at the image counts: KIDs of different subset
    sizes would be compared as alike (the default's capping is said by --help)."""
    if not any(item.key == "kid_subset_size" for item in written):
        return
    counts = {"samples": len(samples)} | (
        {"reference": len(reference)} if isinstance(reference, np.ndarray) else {}
    )
    which = min(counts, key=counts.__getitem__)
    if subset_size > counts[which]:
        print(
            f"note: {written_as(written, 'kid_subset_size')} {subset_size} is more than the {counts[which]} "
            f"images of the {which}: KID uses subsets of {counts[which]}",
            file=sys.stderr,
        )


def _yes_or_no(value: object) -> bool:
    return _as_bool(value) is not None


def _as_bool(value: object) -> bool | None:
    """A --nll value as the parser reads it (ActionYesNo): YAML's bools, and true/yes/false/no as text in any case
    (`nll: "true"` in a file too); None for a value it refuses (`1`, `"on"`)."""
    if isinstance(value, bool):
        return value
    return {"true": True, "yes": True, "false": False, "no": False}.get(str(value).lower())


def nll_requested(argv: Sequence[str] | None = None) -> bool:
    """Whether evaluate runs its --nll mode: the last --nll flag, or `nll:` of a --config file after it, read as
    the parser reads it (`nll: "true"` was taken for the quality mode, whose line then said "add --nll"). A value
    the parser refuses chooses the quality mode, which says it first (`refuse_the_other_modes_options`)."""
    asked = False
    for key, values in flags_written(sys.argv[1:] if argv is None else argv):
        if key == "nll":
            asked = not values or _as_bool(values[-1]) is True
        elif key == "config" and values:
            try:
                options = read_config_file(values[-1])  # not YAML (a SyntaxError returned): the parse says so
            except OSError:  # unreadable: the parse says so
                continue
            if isinstance(options, dict) and "nll" in options:
                asked = _as_bool(options["nll"]) is True
    return asked


def _takes(parser: ArgumentParser, key: str) -> bool:
    return action_of(parser, key) is not None or has_keys_under(parser, key)


def refuse_the_other_modes_options(
    parser: ArgumentParser, other: ArgumentParser, argv: Sequence[str] | None, nll: bool
) -> None:
    """evaluate has two modes, sample quality (`parser` when not `nll`) and --nll, the bits/dim of a checkpoint,
    each with options of its own: an option of the `other` mode's, a flag or a config file's key, is refused
    naming the mode it belongs to and both ways out (the parse would call it no option of the command, which it
    is). Before the parse; a config file that does not read is the parse's to say."""
    written, _ = without_print_config(sys.argv[1:] if argv is None else argv)
    try:
        items = list(everything_written(parser, written))
    except (SyntaxError, OSError, ValueError):
        return
    for item in items:  # `--nll maybe` chose no mode: said first, in the parser's words for a bool
        if item.key == "nll" and item.values and not _yes_or_no(item.values[-1]):
            raise UserError(f"{item.shown()} is not a valid bool", "pass true or false")
    for item in items:
        if _takes(parser, item.key) or not _takes(other, item.key):
            continue
        where = f"{item.file}: {item.key}" if item.file else f"--{item.key}"
        drop = f"{item.key} from {item.file}" if item.file else f"--{item.key}"
        if not nll:
            raise UserError(
                f"{where} is an option of --nll (bits/dim of a checkpoint), and this is a sample-quality run",
                f"add --nll, or drop {drop}",
            )
        chosen = [written for written in items if written.key == "nll"][-1:]
        mode = f"nll from {chosen[0].file}" if chosen and chosen[0].file else "--nll"
        raise UserError(
            f"{where} is an option of sample quality (FID, KID, IS), not of --nll (bits/dim)",
            f"drop {mode}, or drop {drop}",
        )
