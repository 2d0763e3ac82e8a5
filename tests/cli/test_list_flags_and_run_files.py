"""Round 14a's command-line findings. A list flag written with `=` is read as the same flag with a space (P1:
`--model.network.init_args.channel_mult=1,2` was the parser's "Expected a <class 'collections.abc.Sequence'>");
an empty list for a flag of one value or more is said on one line (P4: `--metrics []` was an IndexError in the
report's own code, "this is a bug in diffusion"); and a run's hparams.yaml (Lightning's record of the module's
arguments, with `!!python/tuple`) given as a config file is said to be that, with what the command takes instead
(P3: it was PyYAML's "could not determine a constructor for the tag" and "fix the YAML syntax").
"""

from pathlib import Path

import pytest
from helpers.parse_errors import a_parser, refused, train_line
from jsonargparse import ArgumentParser
from torch import nn

from diffusion.cli.flags import command_parser
from diffusion.cli.parse_errors import BadCommandLine, parse_command_line


# ---- P1: `--flag=a,b` as `--flag a,b` ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flag", "key", "expected"),
    [
        ("--metrics=fid,kid", "metrics", ["fid", "kid"]),
        ("--metrics=[fid, kid]", "metrics", ["fid", "kid"]),
        ("--sweep=0.1,0.2", "sweep", [0.1, 0.2]),
        ("--sweep=0.1", "sweep", [0.1]),
        ("--betas=0.5,0.6", "betas", (0.5, 0.6)),
        ("--lr=0.5", "lr", 0.5),  # no list: as written
    ],
)
def test_a_list_flag_written_with_an_equals_sign_is_read_as_with_a_space(flag, key, expected):
    assert parse_command_line(a_parser(), ["--out", "s", flag])[key] == expected


class Net(nn.Module):
    def __init__(self, channels: int = 8, channel_mult: tuple[int, ...] = (1, 2)) -> None:
        super().__init__()


def a_parser_of_networks() -> ArgumentParser:
    """A network chosen by class path, as train.py's `--model.network` (LightningCLI's subclass flags)."""
    parser = command_parser("python -m diffusion.example", "a network")
    parser.add_subclass_arguments(
        nn.Module, "network", default={"class_path": f"{__name__}.Net"}, required=False
    )
    return parser


@pytest.mark.parametrize("written", ["1,2,2", "1", "[1, 2, 2]"])
def test_a_classs_list_argument_written_with_an_equals_sign_is_read_as_with_a_space(written):
    with_a_space = parse_command_line(a_parser_of_networks(), ["--network.init_args.channel_mult", written])
    with_equals = parse_command_line(a_parser_of_networks(), [f"--network.init_args.channel_mult={written}"])
    assert with_equals.network.init_args.channel_mult == with_a_space.network.init_args.channel_mult


def test_a_bad_item_written_with_an_equals_sign_is_said_as_with_a_space():
    with pytest.raises(BadCommandLine) as refusal:
        parse_command_line(a_parser_of_networks(), ["--network.init_args.channel_mult=1,x"])
    assert str(refusal.value) == (
        "--network.init_args.channel_mult 1,x: its item x is not a valid int — pass a value of that type (see --help)"
    )


# ---- P4: an empty list where one value or more goes ------------------------------------------------------------
@pytest.mark.parametrize("words", [["--metrics", "[]"], ["--metrics=[]"], ["--metrics", ","]])
def test_an_empty_list_for_a_flag_of_one_value_or_more_is_said(words, in_a_folder_with_either_words):
    shown = " ".join(words).replace("=", " ")
    assert refused(["--out", "s", *words]) == (
        f"--metrics {shown.split(' ', 1)[1]} names nothing: --metrics takes one value or more — name some of fid kid "
        "(e.g. --metrics fid), or leave --metrics out for its default"
    )


# ---- P3: a run's hparams.yaml as a config file -------------------------------------------------------------------
HPARAMS = "lr: 0.001\nsample_shape: !!python/tuple\n- 1\n- 8\n- 8\n"


def a_command(*options: str) -> ArgumentParser:
    parser = command_parser("python -m diffusion.example", "a command that takes a run by these options")
    for option in options:
        parser.add_argument(f"--{option}", type=str | None, default=None)
    return parser


@pytest.mark.parametrize(
    ("options", "instead"),
    [
        (["run"], "pass the run folder as --run run"),
        (["ckpt"], "pass a checkpoint of the run as --ckpt run/checkpoints/last.ckpt"),
        (["ckpt_path"], "pass the run's config.yaml beside it: --config run/config.yaml"),
        ([], "pass a YAML file of this command's options (see --print_config)"),
    ],
    ids=["phema", "sample", "train", "evaluate"],
)
def test_a_runs_hparams_yaml_as_the_config_file_is_said_to_be_lightnings_record(
    options, instead, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    Path("run").mkdir()
    Path("run/hparams.yaml").write_text(HPARAMS)
    with pytest.raises(BadCommandLine) as refusal:
        parse_command_line(a_command(*options), ["--config", "run/hparams.yaml"])
    assert str(refusal.value) == (
        "--config run/hparams.yaml is Lightning's record of a run's module arguments (hparams.yaml), not a config "
        f"file — {instead}"
    )


def test_another_file_with_a_python_object_is_said_to_hold_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(HPARAMS)
    with pytest.raises(BadCommandLine) as refusal:
        parse_command_line(a_command(), ["--config", "run.yaml"])
    assert str(refusal.value) == (
        "--config run.yaml: line 2 holds a Python object (!!python/tuple), which a config file cannot hold — write "
        "the value as plain YAML (a list in brackets for a tuple)"
    )


def test_train_says_a_runs_hparams_yaml_is_no_config_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("run").mkdir()
    Path("run/hparams.yaml").write_text(HPARAMS)
    assert train_line(["--config", "run/hparams.yaml"], capsys) == (
        "--config run/hparams.yaml is Lightning's record of a run's module arguments (hparams.yaml), not a config "
        "file — pass the run's config.yaml beside it: --config run/config.yaml"
    )
