"""A refused command line is said from the parser's declared types, not from jsonargparse's message.

Each case parses a bad flag twice: as jsonargparse words its refusal, and with that refusal's text replaced by
nonsense. The line must be the same both times (and the one the flag's type calls for): the commands read which
flag, its value and its type from the parser (diffusion/cli/parse_errors.py), so a jsonargparse release that
rewords its reports changes nothing a user sees. The commands' own lines are in test_train_errors.py,
test_sample_evaluate_errors.py and test_export_errors.py, which stay as they were before this module existed.
"""

from datetime import timedelta
from typing import Literal

import pytest
from jsonargparse import ActionYesNo, ArgumentError, ArgumentParser
from jsonargparse.typing import Path_fr, PositiveInt, restricted_number_type
from lightning.pytorch import LightningDataModule

from diffusion.cli.flags import command_parser
from diffusion.cli.parse_errors import BadCommandLine, flags_written, parse_command_line

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
    parser.add_argument("--out", type=str, required=True)
    return parser


CASES = {  # id: (flags, the whole line but "error: ")
    "literal": (["--sampler", "ddqm"], "--sampler ddqm is not one of the choices — choose one of 'ddpm', 'ddim'"),
    # A union of Literals: every value once, 32 before '32' as declared.
    "literals": (
        ["--precision", "17"],
        "--precision 17 is not one of the choices — choose one of 32, 16, 'bf16-mixed'",
    ),
    "list_item": (["--metrics", "fid", "fd"], "--metrics fid fd is not one of the choices — choose one of 'fid', 'kid'"),
    "bound": (["--num_samples", "0"], "--num_samples 0 is out of range — pass a value > 0"),
    "bound_of_a_type_made_here": (["--subset=1"], "--subset 1 is out of range — pass a value >= 2"),
    "restricted_not_a_number": (["--num_samples", "many"], "--num_samples many is not a valid int — pass a value of that type (see --help)"),
    "kind": (["--lr", "abc"], "--lr abc is not a valid float — pass a value of that type (see --help)"),
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


@pytest.mark.parametrize("reworded", [False, True], ids=["jsonargparse_words", "reworded"])
@pytest.mark.parametrize(("flags", "expected"), CASES.values(), ids=CASES.keys())
def test_a_refused_flag_is_said_from_its_declared_type(flags, expected, reworded, monkeypatch):
    if reworded:
        monkeypatch.setattr(ArgumentParser, "error", refused_with_nonsense)
    with pytest.raises(BadCommandLine) as refused:
        parse_command_line(a_parser(), ["--out", "samples", *flags])
    assert str(refused.value) == expected


@pytest.mark.parametrize("reworded", [False, True], ids=["jsonargparse_words", "reworded"])
def test_a_missing_required_flag_is_named(reworded, monkeypatch):
    if reworded:
        monkeypatch.setattr(ArgumentParser, "error", refused_with_nonsense)
    with pytest.raises(BadCommandLine) as refused:
        parse_command_line(a_parser(), ["--lr", "0.1"])
    assert str(refused.value) == "--out is required — pass --out VALUE (see --help)"


def test_what_no_flag_explains_is_the_parsers_own_words_on_one_line(monkeypatch):
    with pytest.raises(BadCommandLine) as refused:
        parse_command_line(a_parser(), ["--out", "samples", "--temperature", "0.5"])
    assert str(refused.value).startswith("unrecognized arguments: --temperature 0.5 — see --help")


def test_flags_are_read_as_the_parser_reads_them():
    argv = ["--a", "1", "--b=x y", "--c", "d", "e", "--flag", "--f+=g", "-1"]
    assert list(flags_written(argv)) == [
        ("a", ["1"]),
        ("b", ["x y"]),
        ("c", ["d", "e"]),
        ("flag", []),
        ("f", ["g"]),
    ]


def test_a_flag_whose_check_reads_a_file_is_checked_anew_each_time(tmp_path, monkeypatch):
    """The report keeps the answers of checks that read only the value (a number, a choice); one that reads a
    file (a path type) or imports a class is asked again: the file may have been made since."""
    monkeypatch.chdir(tmp_path)
    parser = a_parser()
    parser.add_argument("--weights", type=Path_fr | None, default=None)
    argv = ["--out", "samples", "--weights", "w.pt", "--lr", "abc"]
    for _ in range(2):  # the same answer twice: the one about the path
        with pytest.raises(BadCommandLine) as refused:
            parse_command_line(parser, argv)
        assert str(refused.value).startswith("--weights w.pt ")
    (tmp_path / "w.pt").write_bytes(b"weights")
    with pytest.raises(BadCommandLine) as refused:  # the path fits now: the next flag is the one named
        parse_command_line(parser, argv)
    assert str(refused.value) == "--lr abc is not a valid float — pass a value of that type (see --help)"


def test_a_config_file_edited_between_two_reports_is_read_anew(tmp_path, monkeypatch, capsys):
    """The report reads a --config file once per version of it (diffusion/cli/parse_errors.py: by mtime and size):
    a notebook that fixes its config and runs again is told about the file as it is now."""
    from diffusion.cli.train import main

    monkeypatch.chdir(tmp_path)
    argv = ["--config", "run.yaml", "--model.network.init_args.hidden_dim", "abc", "--trainer.logger", "false"]  # fmt: skip
    lines = []
    for network in ("diffusion.models.MLP", "diffusion.models.UNet"):
        (tmp_path / "run.yaml").write_text(f"model:\n  network:\n    class_path: {network}\n")
        with pytest.raises(SystemExit):
            main(argv)
        lines.append(capsys.readouterr().err.strip().splitlines()[-1])
    # The MLP's hidden_dim is an int; the UNet has none.
    assert lines[0].endswith(
        "--model.network.init_args.hidden_dim abc is not a valid int — pass a value of that type (see --help)"
    )
    assert "'hidden_dim' is not accepted" in lines[1] and "not a valid int" not in lines[1]
