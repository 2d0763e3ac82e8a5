"""The sample-quality family of `python -m diffusion.evaluate`: FID, KID and IS of a samples file against a
reference, and the FID statistics of a reference (--save_stats). The flags, which metrics a request allows,
and the printed lines live here; the computation is `diffusion.metrics.sample_quality`, the one the FID
callback runs during training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

import numpy as np
from jsonargparse import ArgumentParser, Namespace
from jsonargparse.typing import restricted_number_type

from diffusion.cli.command_line import Written
from diffusion.cli.config_files import as_text
from diffusion.cli.evaluate_notes import note_kid_subsets, note_unused, note_unused_options
from diffusion.cli.flags import add_flags, check_local_output, check_paths_given
from diffusion.data.file_in_folder import FileKind, file_in_folder
from diffusion.data.folder_lock import writing_alone
from diffusion.data.images import ImageDatasetName
from diffusion.errors import COMMAND, MissingFile, UserError
from diffusion.metrics.features import Features, distance_name, feature_size
from diffusion.metrics.image_sets import load_npz_images, load_reference
from diffusion.metrics.inception_score import IS_SPLITS
from diffusion.metrics.reference_stats import FeatureStatistics, check_new_statistics_file, save_statistics
from diffusion.metrics.sample_quality import KID_SUBSET_SIZE, QualityMetric, SampleQuality, feed_images

INCEPTION_WEIGHTS = FileKind(
    "weights file", ("*.pth",), "torch-fidelity's releases hold weights-inception-2015-12-05-6726825d.pth"
)
AtLeastTwo = restricted_number_type("AtLeastTwo", int, (">=", 2), docstring="int restricted to be >=2")


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--samples", type=str | None, default=None, help="samples.npz (arr_0: uint8 N x H x W x C)"
    )
    parser.add_argument(
        "--reference", type=str | None, default=None,
        help=f"a dataset {get_args(ImageDatasetName)}, an .npz of images, or an .npz of FID statistics (mu, sigma)",
    )  # fmt: skip
    parser.add_argument("--features", type=Features, default="inception")
    parser.add_argument(
        "--metrics", type=QualityMetric, nargs="+", default=None,
        help="some of fid kid is (default: all that the features and the reference allow)",
    )  # fmt: skip
    parser.add_argument(
        "--kid_subset_size", type=AtLeastTwo, default=KID_SUBSET_SIZE,
        help="KID subset size (capped at the image counts)",
    )  # fmt: skip
    parser.add_argument(
        "--num_reference", type=AtLeastTwo | None, default=None, help="a fixed random subset of the reference"
    )
    parser.add_argument(
        "--data_root", type=str, default="data", help="download folder of torchvision datasets; folder root"
    )
    parser.add_argument(
        "--image_size", type=AtLeastTwo | None, default=None,
        help="the size a dataset reference is rendered at (default: the samples', else the dataset's own)",
    )  # fmt: skip
    parser.add_argument(
        "--inception_weights", type=str | None, default=None, help="a local copy of the InceptionV3 weights"
    )
    parser.add_argument(
        "--save_stats", type=str | None, default=None,
        help="write the FID statistics (mu, sigma) of --reference to this .npz, for later --reference FILE",
    )  # fmt: skip
    add_flags(parser, "overwrite", overwrite={"help": "replace an existing --save_stats file"})


def check_reference_count(reference: object, num_reference: int | None, name: str) -> None:
    """--num_reference N of a reference holding fewer images was all of them, without a word (statistics saved
    for "N" stood for fewer): refused, once the reference is read and before any feature is computed."""
    if num_reference is not None and isinstance(reference, np.ndarray) and len(reference) < num_reference:
        raise UserError(
            f"--num_reference {num_reference}: the reference {name} holds only {len(reference)} images",
            f"pass --num_reference {len(reference)} or fewer, or leave it out for all of them",
        )


def run(
    args: Namespace, device: str, checked: Callable[[], None] = lambda: None, written: Sequence[Written] = ()
) -> dict[str, float] | None:
    """FID, KID and IS of --samples (those --metrics asks for) and --save_stats, printed; None when neither
    --samples nor --save_stats is given. `checked` is called once the inputs are read and checked, before the
    features are computed (the command's --print_config: what would run); `written`, the command line's options
    (a note names those given that do nothing here)."""
    check_paths_given(args, "samples", "reference", "save_stats", "data_root", "inception_weights")
    check_local_output(args.save_stats, "--save_stats", "evaluate")
    if args.metrics is not None and not args.metrics:  # a file's `metrics: []`: nothing computed, exit 0
        raise UserError(
            "--metrics [] names no metric",
            "name some of fid kid is, or leave --metrics out for all that the features and the reference allow",
        )
    for key in (
        "samples",
        "save_stats",
    ):  # `save_stats: ~/x.npz` in a config file: the home folder, as sample reads it
        if args[key] is not None:
            args[key] = str(Path(args[key]).expanduser())
    if args.samples is None and args.save_stats is None:
        return None
    if args.save_stats is None:
        return scored(args, device, checked, written)
    for flag in ("samples", "reference"):  # --overwrite replaced the user's samples by the statistics
        given = args[flag]
        if (
            given is not None
            and Path(given).is_file()
            and Path(given).resolve() == Path(args.save_stats).resolve()
        ):
            raise UserError(
                f"--save_stats {args.save_stats} is the --{flag} file itself, which it would replace",
                "pass another file name for the statistics, e.g. --save_stats reference_stats.npz",
            )
    # Held from here: a second evaluate writing --save_stats is refused at once, naming the first ("--save_stats
    # FILE is being written by another evaluate"): two at once both said they wrote it, and it held one of them.
    check_new_statistics_file(args.save_stats, args.overwrite)  # before any time is spent, or a folder made
    with writing_alone(args.save_stats, "evaluate", statistics_lock(args.save_stats), "save_stats"):
        check_new_statistics_file(args.save_stats, args.overwrite)  # again, held: another may have written it
        return scored(args, device, checked, written)


def statistics_lock(path: str) -> Path:
    """Where an evaluate writing the statistics file `path` holds its lock: `.NAME.lock` beside it."""
    absolute = Path(path).absolute()
    return absolute.parent / f".{absolute.name}.lock"


def scored(
    args: Namespace, device: str, checked: Callable[[], None], written: Sequence[Written]
) -> dict[str, float] | None:
    """`run`'s work once --save_stats (if any) is held and checked: the inputs read and checked, then scored."""
    samples = None if args.samples is None else load_npz_images(args.samples)
    if args.reference is None:
        if args.save_stats is not None:
            raise UserError(
                "--save_stats writes the statistics of --reference, and none is given",
                "pass --reference with a dataset name or an .npz of images",
            )
        if args.metrics is None or {"fid", "kid"} & set(args.metrics):
            raise UserError(
                "FID and KID compare the samples with a --reference, and none is given",
                "pass --reference with a dataset name or an .npz (images or FID statistics), or --metrics is",
            )
    note_unused_options(args, samples, written)
    reference = None
    if args.reference is not None:
        size = args.image_size or (None if samples is None else samples.shape[1])
        channels = None if samples is None else samples.shape[-1]
        reference = load_reference(
            args.reference, size, channels, args.data_root, args.num_reference, args.seed
        )
        check_reference_count(reference, args.num_reference, args.reference)
    if isinstance(reference, FeatureStatistics) and args.save_stats is not None:
        raise UserError(
            f"--reference {args.reference} holds FID statistics already, and --save_stats writes those of images",
            "pass a dataset name or an .npz of images as --reference",
        )
    metrics: list[QualityMetric]
    notes: dict[str, str]
    if samples is None:
        metrics, notes = ["fid"], {}  # the reference's statistics alone: no other metric's state to fill
        if args.metrics is not None:
            note_unused(
                written, "metrics", " ".join(args.metrics),
                "without --samples nothing is scored, and --save_stats writes FID statistics (mu, sigma), "
                "which serve FID alone (KID and IS need images: pass --samples to score them)",
            )  # fmt: skip
    else:
        metrics, notes = choose_metrics(args.metrics, args.features, args.reference, reference, samples)
    check_comparable(samples, reference, args.features, args.reference)
    checked()
    images = samples if samples is not None else reference
    # One of them is an array: load_samples_and_reference reads the reference as images when there are no samples.
    quality = build_quality(args, metrics, images.shape[-1], reference)  # type: ignore[union-attr]
    quality.to(device)
    values: dict[str, float] = {}
    if isinstance(reference, np.ndarray):
        feed_images(
            quality, reference, True, args.batch_size, device, f"{args.features} features of the reference"
        )
        values["num_real"] = len(reference)
    saved = None
    if args.save_stats is not None:
        size = reference.shape[1:3]  # type: ignore[union-attr]  # images: --save_stats is checked to need them
        saved = save_statistics(args.save_stats, quality.real_statistics(image_size=size))
    if samples is not None:
        feed_images(
            quality, samples, False, args.batch_size, device, f"{args.features} features of the samples"
        )
        values.update(quality.compute(args.seed))
        if "kid_mean" in values:
            note_kid_subsets(args.kid_subset_size, samples, reference, written)
    if "kid_mean" not in values:
        note_unused(written, "kid_subset_size", args.kid_subset_size, "no KID is computed (see --metrics)")
    lines = describe(args, samples, reference) + result_lines(values, notes, args.features)
    if "fid" in values and samples is not None:
        size = feature_size(args.features, samples.shape[-1])
        lines += too_few_for_a_covariance(image_counts(samples, reference), size)
    if saved is not None:
        lines.append(f"wrote the FID statistics of {args.reference} ({args.features} features) to {saved}")
    print("\n".join(lines))
    return values


def describe(
    args: Namespace, samples: np.ndarray | None, reference: np.ndarray | FeatureStatistics | None
) -> list[str]:
    """What was compared: the samples, the reference, the features."""
    lines = []
    if samples is not None:
        lines.append(
            f"samples:   {args.samples} ({len(samples)} images, {samples.shape[1]}x{samples.shape[2]})"
        )
    if isinstance(reference, FeatureStatistics):
        count = "an unknown number of" if reference.num_images is None else str(reference.num_images)
        lines.append(f"reference: {args.reference} (FID statistics of {count} images)")
    elif reference is not None:
        lines.append(f"reference: {args.reference} ({len(reference)} images)")
    return [*lines, f"features:  {args.features}"]


def choose_metrics(
    requested: list[QualityMetric] | None,
    features: Features,
    reference_name: str | None,
    reference: np.ndarray | FeatureStatistics | None,
    samples: np.ndarray | None,
) -> tuple[list[QualityMetric], dict[str, str]]:
    """The metrics to compute, and for each left out by default a note why. What --metrics asks for and cannot
    be computed is a user error."""
    num_samples = 0 if samples is None else len(samples)
    reasons = {
        "kid": (
            f"{reference_name} holds FID statistics (a mean and a covariance), and KID needs the reference "
            "images' features"
            if isinstance(reference, FeatureStatistics) else None
        ),
        "is": (
            f"the Inception Score needs Inception features (the classifier's logits), and --features {features} "
            "has none" if features != "inception"
            else f"the Inception Score needs at least {IS_SPLITS} samples ({IS_SPLITS} splits), got {num_samples}"
            if num_samples < IS_SPLITS else None
        ),
    }  # fmt: skip
    fixes = {
        "kid": "pass reference images (a dataset name or an .npz of images) as --reference, or leave kid out of "
        "--metrics",
        "is": "pass --features inception, or leave is out of --metrics"
        if features != "inception"
        else "evaluate more samples, or leave is out of --metrics",
    }
    if requested is not None:
        once = list(dict.fromkeys(requested))
        if len(once) < len(requested):  # computed once: the repeat was dropped without a word
            raise UserError(
                f"--metrics {as_text(list(requested))} names a metric more than once",
                f"name each metric once: --metrics {' '.join(once)}",
            )
        for name in once:
            if reasons.get(name):
                raise UserError(f"--metrics {name}: {reasons[name]}", fixes[name])
        return once, {}
    chosen = [name for name in get_args(QualityMetric) if not reasons.get(name)]
    return chosen, {name: reason for name, reason in reasons.items() if reason}


def check_comparable(
    samples: np.ndarray | None,
    reference: np.ndarray | FeatureStatistics | None,
    features: Features,
    name: str | None,
) -> None:
    """The samples can be scored against the reference: same channels; for Inception, the same size."""
    if samples is None or reference is None:
        return
    size = (samples.shape[1], samples.shape[2])
    if isinstance(reference, FeatureStatistics):
        reference.check_fits(features, feature_size(features, samples.shape[-1]), size, f"--reference {name}")
        return
    if samples.shape[-1] != reference.shape[-1]:
        raise UserError(
            f"samples have {samples.shape[-1]} channel(s) but the reference has {reference.shape[-1]}",
            "compare images with the same channel count",
        )
    if features == "inception" and size != reference.shape[1:3]:
        raise UserError(
            f"samples are {size[0]}x{size[1]} but the reference is {reference.shape[1]}x{reference.shape[2]}",
            "Inception FID needs one size (pass a dataset name as --reference to render it at the samples' size, "
            "or use --features pixels, which pools both to 8x8)",
        )


@contextmanager
def named_as_flags() -> Iterator[None]:
    """SampleQuality's options (features, metrics, kid_subset_size, inception_weights) are this command's flags of
    the same names: a check inside it that names them (`{--features}`) with no class says them as the flags."""
    try:
        yield
    except UserError as error:
        if error.owner is None:
            error.owner = COMMAND
        raise


def build_quality(
    args: Namespace,
    metrics: list[QualityMetric],
    channels: int,
    reference: np.ndarray | FeatureStatistics | None,
) -> SampleQuality:
    """`SampleQuality` from the flags, with a bad --inception_weights file reported as one line that names it."""
    fix = (
        "pass torch-fidelity's weights-inception-2015-12-05-6726825d.pth (github.com/toshas/torch-fidelity "
        "releases), or leave --inception_weights out to download it"
    )
    weights = args.inception_weights
    if args.features == "inception" and weights is not None:
        weights = str(file_in_folder(weights, "--inception_weights", INCEPTION_WEIGHTS))
        if not Path(weights).is_file():
            raise MissingFile(f"--inception_weights {weights} does not exist", fix)
    options: dict[str, Any] = dict(
        channels=channels,
        kid_subset_size=args.kid_subset_size if "kid" in metrics else KID_SUBSET_SIZE,  # else noted unused, above
        inception_weights=weights if args.features == "inception" else None,  # else noted unused
        reference=reference if isinstance(reference, FeatureStatistics) else None,
    )  # fmt: skip
    with named_as_flags():  # a damaged or foreign weights file is said by SampleQuality, as the flag
        return SampleQuality(args.features, metrics, **options)


def image_counts(samples: np.ndarray | int, reference: np.ndarray | FeatureStatistics | None) -> list[int]:
    """How many images each side of a distance has: the samples (or their count), and a reference of images (a
    reference of statistics holds no images to count)."""
    return [samples if isinstance(samples, int) else len(samples)] + (
        [len(reference)] if isinstance(reference, np.ndarray) else []
    )


def too_few_for_a_covariance(counts: list[int], size: int) -> list[str]:
    """A note when a set has no more images (`counts`, `image_counts`) than the features have dimensions: its
    covariance is singular, and the distance mostly the noise of its estimate (the figure would be taken at face
    value; a phema --sweep's "best" too)."""
    if min(counts) > size:
        return []
    return [
        f"note: {min(counts)} images for {size}-d features: their covariance is singular, so this distance is "
        f"mostly the noise of its estimate — compare more than {size} images of each (an FID is taken on 10,000 "
        "or 50,000)"
    ]


def result_lines(values: dict[str, float], notes: dict[str, str], features: Features) -> list[str]:
    """`FID: ...` (`FD of pixels (not an FID): ...` of pixel features), `KID: mean ± std`, `IS: mean ± std`,
    and for a metric left out, why."""
    lines = []
    if "fid" in values:
        lines.append(f"{distance_name(features)}: {values['fid']:.4f}")
    if "kid_mean" in values:
        lines.append(f"KID: {values['kid_mean']:.6f} ± {values['kid_std']:.6f}")
        if values["kid_mean"] < 0:  # a figure below 0 read as a fault, or as better than the reference itself
            lines.append(
                "note: KID is below 0: its unbiased estimate of a distance smaller than its noise at these image "
                "counts — read it as about 0, within its ± std, or compare more images"
            )
    elif "kid" in notes:
        lines.append(f"KID: not computed — {notes['kid']}")
    if "is_mean" in values:
        lines.append(f"IS:  {values['is_mean']:.4f} ± {values['is_std']:.4f} ({IS_SPLITS} splits)")
    elif "is" in notes:
        lines.append(f"IS:  not computed — {notes['is']}")
    return lines


if __name__ == "__main__":  # a part of evaluate's, not a command
    from diffusion.cli.reporting import not_a_command

    not_a_command("evaluate samples with python -m diffusion.evaluate --samples FILE --reference ...")
