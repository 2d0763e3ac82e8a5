"""What the tests of refused command lines share (tests/cli/test_parse_errors*.py): a parser with flags of every kind
the commands declare, the line each kind's bad value gets, jsonargparse's refusals replaced by nonsense, and a
refusal read as its one line."""

from datetime import timedelta
from typing import Literal
from unittest import mock

import pytest
from jsonargparse import ActionYesNo, ArgumentError, ArgumentParser
from jsonargparse.typing import PositiveInt, restricted_number_type
from lightning.pytorch import LightningDataModule

from diffusion.cli.flags import command_parser
from diffusion.cli.parse_errors import BadCommandLine, parse_command_line

AtLeastTwo = restricted_number_type("AtLeastTwo", int, (">=", 2))


def a_parser() -> ArgumentParser:
    parser = command_parser("python -m diffusion.example", "flags of every kind the commands declare")
    parser.add_argument("--sampler", type=Literal["ddpm", "ddim"] | None, default=None)
    parser.add_argument(
        "--precision", type=Literal[32, 16] | Literal["32", "bf16-mixed"] | None, default=None
    )
    parser.add_argument("--metrics", type=Literal["fid", "kid"], nargs="+", default=None)
    parser.add_argument("--num_samples", type=PositiveInt, default=64)
    parser.add_argument("--subset", type=AtLeastTwo, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--overwrite", action=ActionYesNo, nargs="?", default=False)
    parser.add_argument("--interval", type=timedelta | None, default=None)
    parser.add_argument("--betas", type=tuple[float, float], default=(0.9, 0.999))
    parser.add_argument("--seed", type=bool | int, default=0)
    parser.add_argument("--data", type=LightningDataModule | None, default=None)
    parser.add_argument("--sweep", type=list[float] | None, default=None)
    parser.add_argument("--out", type=str, required=True)
    parser.add_class_arguments(Optimizer, "optimizer")  # a group: --optimizer FILE, --optimizer.lr
    return parser


class Optimizer:
    def __init__(self, lr: float = 0.1, schedule: Literal["constant", "cosine"] = "constant") -> None:
        pass


CASES = {  # id: (flags, the whole line but "error: ")
    "literal": (["--sampler", "ddqm"], "--sampler ddqm is not one of the choices — choose one of 'ddpm', 'ddim'"),
    # A union of Literals: every value once, 32 before '32' as declared.
    "literals": (
        ["--precision", "17"],
        "--precision 17 is not one of the choices — choose one of 32, 16, 'bf16-mixed'",
    ),
    "list_item": (
        ["--metrics", "fid", "fd"],
        "--metrics fid fd is not one of the choices — choose one of 'fid', 'kid'; several as fid kid, [fid, kid] or "
        "fid,kid",
    ),
    "bound": (["--num_samples", "0"], "--num_samples 0 is out of range — pass a value > 0"),
    "bound_of_a_type_made_here": (["--subset=1"], "--subset 1 is out of range — pass a value >= 2"),
    "restricted_not_a_number": (["--num_samples", "many"], "--num_samples many is not a valid int — pass a value of that type (see --help)"),
    "kind": (["--lr", "abc"], "--lr abc is not a valid float — pass a value of that type (see --help)"),
    # A float, but none the parser takes: it was said "not a valid float"
    "not_finite": (["--lr", "nan"], "--lr nan: NaN and infinity are no values of this option — pass a finite number (see --help)"),
    "not_finite_in_a_list": (["--sweep", "[0.1, nan]"], "--sweep [0.1, nan]: NaN and infinity are no values of this option — pass a finite number (see --help)"),
    "bool": (["--overwrite", "maybe"], "--overwrite maybe is not a valid bool — pass true or false"),
    "so_many_items": (
        ["--betas", "[1, 2, 3]"],
        "--betas [1, 2, 3] is not a valid list of 2 floats — pass a value of that type: a list in brackets, e.g. [1, 2]",
    ),
    "union": (["--seed", "x"], "--seed x is not a valid bool or int — pass a value of one of these types (see --help)"),
    "timedelta": (
        ["--interval", "30min"],
        "--interval 30min is not a valid timedelta — pass a value of that type: h:m:s, e.g. 0:30:00",
    ),
    "class_path": (
        ["--data", "nope.Data"],
        "--data nope.Data: no such class (No module named 'nope') — pass the class path of a class that exists, "
        "as module.Class (see --help for the accepted classes)",
    ),
}  # fmt: skip


def refused_with_nonsense(self, message, ex=None):
    raise ArgumentError(None, "Xq9 unreadable report") from ex


# Words of jsonargparse's own structure: no refusal the user reads may hold them.
INTERNALS = ("NestedArg", "<class", "Parser key", "typing.", "Unexpected config", "Subtypes")


def refused(argv: list[str]) -> str:
    with pytest.raises(BadCommandLine) as refusal:
        parse_command_line(a_parser(), argv)
    line = str(refusal.value)
    assert not any(internal in line for internal in INTERNALS), line
    return line


def train_line(argv: list[str], capsys, logger: str | None = "false") -> str:
    """train.py's one line for `argv`; a command line it let through fails at once instead of training. `logger`:
    the --trainer.logger after it (None: the one `argv` chooses)."""
    from diffusion.cli import train

    took_it = AssertionError("train.py took the command line")
    with mock.patch.object(train, "fit", side_effect=took_it), pytest.raises(SystemExit) as exited:
        train.main([*argv, *(["--trainer.logger", logger] if logger else [])])
    assert exited.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert not any(internal in line for internal in INTERNALS), line
    return line.removeprefix("error: ")
