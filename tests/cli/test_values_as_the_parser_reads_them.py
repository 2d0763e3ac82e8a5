"""Values the parser reads one way and a check read another (round 12a): a negative number in e-notation after a
space (W2: argparse took `-1e-3` for an option, and the line said "not a valid float"), a group file that holds a
list or a single value (W1: "no such class (No module named ...)"), an empty logger folder (W5: the run went to
the current folder without a word) and evaluate's `nll: "true"` (W6: taken for the sample-quality mode)."""

from pathlib import Path

import pytest
from helpers.parse_errors import a_parser, train_line

from diffusion.cli import evaluate, sample
from diffusion.cli.command_line import flags_written
from diffusion.cli.evaluate_notes import nll_requested
from diffusion.cli.parse_errors import BadCommandLine, parse_command_line

LR_BELOW_ZERO = (
    "--model.lr -1e-3 is out of range (must be a finite number > 0) — pass e.g. --model.lr 2e-4 (Ho et al.)"
)


@pytest.mark.parametrize("word", ["-1e-3", "-1E-3", "-1.0e-3", "-.1e-2", "-0.001"])
def test_a_negative_number_in_e_notation_is_a_flags_value(word):
    assert parse_command_line(a_parser(), ["--out", "samples", "--lr", word]).lr == -0.001
    assert list(flags_written(["--lr", word, "--out", "x"])) == [("lr", [word]), ("out", ["x"])]
    # a refusal of another flag checks this one alone too: it was said instead, "not a valid float"
    with pytest.raises(BadCommandLine) as refused:
        parse_command_line(a_parser(), ["--out", "samples", "--lr", word, "--num_samples", "0"])
    assert str(refused.value) == "--num_samples 0 is out of range — pass a value > 0"


def test_a_negative_number_in_e_notation_is_said_by_its_range_in_every_command(capsys):
    assert train_line(["--model.lr", "-1e-3", "--print_config"], capsys) == LR_BELOW_ZERO
    assert (
        train_line(["--print_config", "--model.lr", "-1e-4", "--model.lr", "-1e-3"], capsys) == LR_BELOW_ZERO
    )
    assert parse_command_line(sample.build_parser(), ["--ckpt", "x.ckpt", "--eta", "-1e-1"]).eta == -0.1


@pytest.mark.parametrize(
    ("flag", "text", "said"),
    [
        ("--data", "[1, 2]\n", "a list"),
        ("--model.network", "hello\n", "a single value (hello)"),
        ("--data", "5\n", "a single value (5)"),
    ],
)
def test_a_group_file_that_is_no_mapping_is_said_as_what_it_holds(
    flag, text, said, in_a_folder_with_either_words, capsys
):
    Path("group.yaml").write_text(text)
    assert train_line([flag, "group.yaml"], capsys) == (
        f"{flag} group.yaml: the file holds {said}, not a mapping of a class's options — write class_path: "
        "module.Class in it, and its arguments under init_args: (see --print_config)"
    )
    Path("run.yaml").write_text("data: group.yaml\n")
    assert train_line(["--config", "run.yaml"], capsys).startswith(
        "run.yaml: data group.yaml: the file holds "
    )


def test_a_group_file_that_is_empty_or_a_folder_is_said_as_a_config_file(
    in_a_folder_with_either_words, capsys
):
    Path("empty.yaml").write_text("")
    assert train_line(["--data", "empty.yaml"], capsys) == (
        "--data empty.yaml: the config file is empty — write its options as key: value lines (see --print_config)"
    )
    Path("folder.yaml").mkdir()
    assert train_line(["--data", "folder.yaml"], capsys).startswith(
        "--data folder.yaml is a folder, not a config file"
    )


EMPTY_PATH = (
    "is an empty path — pass a path (an unset shell variable or a blank value in a config file gives an empty one, "
    "which would mean the current folder)"
)


def test_an_empty_logger_folder_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    flag = "--trainer.logger.init_args.save_dir"
    assert train_line([flag, "", "--print_config"], capsys, logger=None) == f'{flag} "" {EMPTY_PATH}'
    Path("run.yaml").write_text("trainer:\n  logger:\n    init_args:\n      save_dir: ' '\n")
    assert train_line(["--config", "run.yaml"], capsys, logger=None) == (
        f'run.yaml: trainer.logger.save_dir " " {EMPTY_PATH}'
    )
    assert not list(tmp_path.glob("*/version_*"))


def test_an_empty_checkpoint_folder_or_data_root_is_refused(tmp_path, monkeypatch, capsys):
    # Lightning saved the checkpoints into the current folder; the data module read it as the data's folder
    monkeypatch.chdir(tmp_path)
    assert train_line(["--checkpoint.dirpath", "", "--print_config"], capsys) == (
        f'--checkpoint.dirpath "" {EMPTY_PATH}'
    )
    assert train_line(["--data.root", " ", "--print_config"], capsys).startswith(
        "--data.root ' ' is an empty path, which would mean the current folder — pass the path of the folder"
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("value", "nll"),
    [("true", True), ('"true"', True), ('"YES"', True), ("on", True), ('"false"', False), ('"1"', False),
     ('"on"', False), ("1", False)],
)  # fmt: skip
def test_evaluates_mode_is_read_from_a_config_file_as_the_parser_reads_it(value, nll, tmp_path):
    (tmp_path / "run.yaml").write_text(f"nll: {value}\n")
    assert nll_requested(["--config", str(tmp_path / "run.yaml")]) is nll
    assert nll_requested(["--config", str(tmp_path / "run.yaml"), "--nll", "no"]) is False


def test_a_quoted_nll_true_runs_the_nll_mode(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text('nll: "true"\nckpt: missing.ckpt\nnum_images: 4\n')
    with pytest.raises(SystemExit):
        evaluate.main(["--config", "run.yaml"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: run.yaml: ckpt: no checkpoint at "), line  # was "... add --nll"
    Path("bad.yaml").write_text('nll: "1"\nckpt: missing.ckpt\n')
    with pytest.raises(SystemExit):
        evaluate.main(["--config", "bad.yaml"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: bad.yaml: nll 1 is not a valid bool — pass true or false"
    )
