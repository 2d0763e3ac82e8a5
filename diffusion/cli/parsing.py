"""What every command's parser shares with `train.py`'s: `--config FILE`, `--print_config` and `--debug`; and the
sampling flags of the commands that sample (`--sampler`, `--steps`, `--eta`, ...), made from `SamplingOptions`."""

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import fields

from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser, DefaultHelpFormatter, Namespace

from diffusion.core.sampling import SamplingOptions, option_help, sampler_help

DEBUG_VARIABLE = "DIFFUSION_DEBUG"


class _HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help (types, defaults) with the description's line breaks kept."""


def command_parser(prog: str, description: str) -> ArgumentParser:
    """A parser for `python -m <prog>` with train.py's conventions: `--config FILE`, `--print_config`, `--debug`.

    Parse errors raise (exit_on_error=False) so that `reporting_user_errors` prints them as one line.
    """
    parser = ArgumentParser(
        prog=prog, description=description, exit_on_error=False, formatter_class=_HelpFormatter
    )
    parser.add_argument(
        "--config", action=ActionConfigFile, help="options from a YAML file (see --print_config)"
    )
    add_debug_flag(parser)
    return parser


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
        if arg in ("--debug", "--debug=true", "--debug=yes"):
            following = args[i + 1] if i + 1 < len(args) else ""
            return following.lower() not in ("false", "no")
    return False


def add_sampling_arguments(parser: ArgumentParser) -> None:
    """A flag for every field of `SamplingOptions` (`--sampler`, `--steps`, `--eta`, ...: every registered
    sampler's options), with the registry's help; unset, each takes the checkpoint's value."""
    group = parser.add_argument_group("sampling (a flag left out takes the checkpoint's value)")
    for option in fields(SamplingOptions):
        text = sampler_help() if option.name == "sampler" else option_help(option.name)
        group.add_argument(f"--{option.name}", type=option.type, default=None, help=text)


def options_from_flags(args: Namespace) -> SamplingOptions:
    """The `SamplingOptions` of the flags `add_sampling_arguments` added, checked."""
    return SamplingOptions(**{option.name: args[option.name] for option in fields(SamplingOptions)})
