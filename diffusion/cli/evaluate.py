"""Numbers of generated samples that a paper can be checked against: `python -m diffusion.evaluate`.

    python -m diffusion.evaluate --samples samples.npz --reference cifar10       # FID, KID and IS
    python -m diffusion.evaluate --reference cifar10 --save_stats cifar10.npz    # FID statistics, written once
    python -m diffusion.evaluate --samples samples.npz --reference cifar10.npz   # FID and IS against them

--reference is a dataset of `diffusion.data.ImageDataModule` (``digits``, ``mnist``, ``fashion_mnist``,
``cifar10``; ``--data_root`` for the downloaded ones, ``folder`` with ``--data_root DIR``): its whole train
split (or a fixed random ``--num_reference`` of it) rendered at the samples' image size; or an .npz of images
(``arr_0``: uint8 N x H x W x C, the samples-file format); or an .npz of FID statistics (``mu``, ``sigma``:
pytorch-fid's format; ``--save_stats`` writes one), which holds no images and so gives no KID.

--metrics picks among ``fid``, ``kid`` and ``is`` (the Inception Score, of the samples alone); by default all
that the features and the reference allow, with one line saying what was left out and why.
``--features inception`` (default) are the papers' features (torch-fidelity's InceptionV3, weights
downloaded on first use); ``--features pixels`` is the offline pixel-space FD of the digits benchmark (no
IS). Image sizes must match for Inception features: comparing two resolutions would score the resizing.
Pixel features area-average both sets to 8x8, so they accept different sizes (e.g. 16x16 samples against
the 8x8 originals); channel counts must always match. Feature extraction shows a progress bar on a terminal.

``--nll --ckpt CKPT`` evaluates a checkpoint's bits/dim on held-out images instead
(`diffusion.cli.evaluate_nll`).

Options can also come from a YAML file (--config FILE; --print_config writes one). A user error ends in one
line on stderr and exit status 2; --debug (or DIFFUSION_DEBUG=1) shows its traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jsonargparse import ActionYesNo, ArgumentParser, Namespace

from diffusion.cli import evaluate_nll, evaluate_quality
from diffusion.cli.command_line import Written
from diffusion.cli.evaluate_notes import nll_requested, refuse_the_other_modes_options
from diffusion.cli.flags import add_flags, check_seed_flag, command_parser, resolve_device
from diffusion.cli.parse_errors import parsed_command_line
from diffusion.cli.reporting import reporting_user_errors
from diffusion.errors import UserError
from diffusion.metrics.sample_quality import FEATURE_BATCH

# A metric family: the flags it adds, and what it runs given the parsed flags, the device, what to call once its
# inputs are checked (--print_config) and what the command line wrote (for its notes of options it does not use),
# returning its values (None when its flags did not ask for it). Each lives in its own module of diffusion/cli/ and
# computes through diffusion/metrics/; a new family is one more entry here.
Family = tuple[
    Callable[[ArgumentParser], None],
    Callable[[Namespace, str, Callable[[], None], Sequence[Written]], "dict[str, float] | None"],
]
FAMILIES: list[Family] = [
    (evaluate_quality.add_arguments, evaluate_quality.run),  # FID, KID, IS; FID statistics
]


def build_parser() -> ArgumentParser:
    parser = command_parser("python -m diffusion.evaluate", __doc__)
    # The mode: `--nll false` (or `nll: false` in a file) is this one, sample quality; --nll is evaluate_nll's.
    parser.add_argument(
        "--nll", action=ActionYesNo, nargs="?", default=False,
        help="the bits/dim of a checkpoint instead (--nll --ckpt CKPT; --nll --help for its options)",
    )  # fmt: skip
    for add_arguments, _ in FAMILIES:
        add_arguments(parser)
    add_flags(
        parser, "batch_size", "device", "seed",
        batch_size={"default": FEATURE_BATCH, "help": "images per feature batch"},
        seed={"help": "seed of the reference subset and KID's subsets"},
    )  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> dict[str, float]:
    """`python -m diffusion.evaluate [flags]`: print and return the values of every metric family asked for."""
    # --nll scores a checkpoint, not samples, on 1..N devices: a command of its own with its own flags.
    if nll_requested(argv):
        return evaluate_nll.main(argv, other_mode=build_parser)
    with reporting_user_errors(argv):
        parser = build_parser()
        refuse_the_other_modes_options(parser, evaluate_nll.build_parser(), argv, nll=False)
        command_line = parsed_command_line(parser, argv)
        args = command_line.config
        check_seed_flag(args.seed, "it picks the reference subset and KID's subsets")
        device, _ = resolve_device(args.device, "auto")
        results: dict[str, float] = {}
        ran = False
        for _, run in FAMILIES:
            values = run(args, device, command_line.print_config_if_asked, command_line.written)
            if values is not None:
                results.update(values)
                ran = True
        if not ran:
            raise UserError(
                "nothing to evaluate",
                "pass --samples samples.npz --reference REF, or --reference REF --save_stats FILE.npz",
            )
    return results


if __name__ == "__main__":
    main()
