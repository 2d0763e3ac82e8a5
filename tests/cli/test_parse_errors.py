"""A refused command line is said from the parser's declared types, not from jsonargparse's message.

Each case parses a bad flag twice: as jsonargparse words its refusal, and with that refusal's text replaced by
nonsense. The line must be the same both times (and the one the flag's type calls for): the commands read which
flag, its value and its type from the parser (diffusion/cli/parse_errors.py), so a jsonargparse release that
rewords its reports changes nothing a user sees. `--print_config` prints what the command line as a whole would
run, and the list flags take the forms users write. The same bad values written in a --config file, and files of
the wrong shape: test_parse_errors_in_config_files.py; train.py's own parse: test_parse_errors_of_train.py. The
commands' own lines are in test_train_errors.py, test_sample_evaluate_errors.py and test_export_errors.py.
"""

from pathlib import Path

import pytest
import yaml
from helpers.parse_errors import CASES, a_parser, refused, refused_with_nonsense, train_line
from jsonargparse import ArgumentParser
from jsonargparse.typing import Path_fr

from diffusion.cli.command_line import Written, everything_written, said_as_written
from diffusion.cli.jsonargparse_internals import print_config_options
from diffusion.cli.parse_errors import BadCommandLine, check_one_name_each, flags_written, parse_command_line
from diffusion.errors import UserError


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


@pytest.mark.parametrize("reworded", [False, True], ids=["jsonargparse_words", "reworded"])
def test_a_flag_no_option_is_is_named(reworded, monkeypatch):
    if reworded:
        monkeypatch.setattr(ArgumentParser, "error", refused_with_nonsense)
    with pytest.raises(BadCommandLine) as refused:
        parse_command_line(a_parser(), ["--out", "samples", "--temperature", "0.5"])
    assert str(refused.value) == (
        "--temperature is not an option of this command — see --help for the options (--print_config for a full "
        "config)"
    )


@pytest.mark.parametrize("reworded", [False, True], ids=["jsonargparse_words", "reworded"])
def test_words_after_a_flags_one_value_are_said(reworded, monkeypatch):
    if reworded:
        monkeypatch.setattr(ArgumentParser, "error", refused_with_nonsense)
    with pytest.raises(BadCommandLine) as refused:
        parse_command_line(a_parser(), ["--out", "my samples", "--lr", "0.1", "0.2"])
    assert (
        str(refused.value)
        == "--lr 0.1 0.2: --lr takes one value — quote a value that holds spaces (see --help)"
    )


def test_what_nothing_written_explains_is_the_parsers_own_words_on_one_line(monkeypatch):
    monkeypatch.setattr(ArgumentParser, "error", refused_with_nonsense)
    with pytest.raises(BadCommandLine) as refused:
        parse_command_line(a_parser(), ["positional", "--out", "samples"])
    assert (
        str(refused.value)
        == "Xq9 unreadable report — see --help for the options (--print_config for a full config)"
    )


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


# ---- what is printed is what runs ------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["first", "between", "last"])
def test_print_config_prints_the_whole_command_line_wherever_it_is(where, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text("lr: 0.5\nnum_samples: 8\n")
    argv = ["--config", "run.yaml", "--lr", "0.25", "--out", "s"]
    argv.insert({"first": 0, "between": 2, "last": len(argv)}[where], "--print_config")
    with pytest.raises(SystemExit) as exited:
        parse_command_line(a_parser(), argv)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert exited.value.code == 0
    assert (printed["lr"], printed["num_samples"], printed["out"]) == (0.25, 8, "s")


# What this jsonargparse's --print_config takes (releases rename them: skip_null, skip_unset; comments with ruamel).
PRINT_CONFIG_OPTIONS = ", ".join(print_config_options(a_parser()) or ["?"])


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--out", "s", "--lr", "abc"],
            "--lr abc is not a valid float — pass a value of that type (see --help)",
        ),
        (
            ["--lr", "0.5"],
            "--out is required — pass --out VALUE (see --help)",
        ),  # jsonargparse printed it, exit 0
        (
            [
                "--out",
                "s",
            ],  # its options written as a value: taken as --config's by train.py, which has one first
            "--print_config skip_default: --print_config takes its options after an '=' — write "
            f"--print_config=skip_default ({PRINT_CONFIG_OPTIONS}; several comma-separated)",
        ),
    ],
)
def test_print_config_refuses_what_the_command_refuses(flags, expected, capsys):
    options = ["skip_default"] if "skip_default" in expected else []
    assert refused(["--print_config", *options, *flags]) == expected
    assert capsys.readouterr().out == ""


def test_print_config_says_the_options_it_takes(capsys):
    """`--print_config=comments` (no ruamel.yaml here) was `Invalid option "comments" for --print_config — see
    --help ... (--print_config for a full config)`: a fix that sent the user back to the flag."""
    assert refused(["--print_config=skip_default,bogus", "--out", "s"]) == (
        f"--print_config=skip_default,bogus: bogus is not an option of --print_config — pass some of "
        f"{PRINT_CONFIG_OPTIONS}; several comma-separated"
    )
    assert capsys.readouterr().out == ""


def test_an_option_given_under_its_old_and_its_new_name_is_refused_if_they_differ():
    parser = a_parser()
    renamed = {"num_samples": "subset"}  # as if --num_samples were --subset's old name
    for argv in (["--num_samples", "3", "--subset", "4"], ["--subset", "3", "--num_samples", "3"]):
        argv = ["--out", "s", *argv]
        config = parse_command_line(parser, argv)
        written = list(everything_written(parser, argv))
        if config.num_samples == config.subset:
            check_one_name_each(written, config, renamed)  # the same value twice: nothing to choose
            continue
        with pytest.raises(UserError) as refusal:
            check_one_name_each(written, config, renamed)
        assert str(refusal.value) == (
            "--num_samples 3 and --subset 4 set one option (num_samples is the old name of subset) to different "
            "values — give it once, by its new name (--subset)"
        )


@pytest.mark.parametrize(
    ("before", "in_the_file", "replaced"),
    [
        (["--lr", "0.5"], {"lr": 0.001}, "lr 0.001"),
        (["--metrics", "fid"], {"metrics": ["fid", "kid"]}, "metrics [fid, kid]"),
        (["--optimizer.lr", "0.5"], {"optimizer": {"lr": 0.2}}, "optimizer.lr 0.2"),
        (["--sweep", "0.1", "0.2"], {"sweep": [0.1]}, "sweep [0.1]"),
        (
            ["--data", "ImageDataModule"],
            {"data": {"class_path": "diffusion.data.VectorDataModule"}},
            "data diffusion.data.VectorDataModule",
        ),
    ],
)
def test_a_flag_a_later_config_file_replaces_is_refused(before, in_the_file, replaced, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(in_the_file))
    with pytest.raises(UserError) as refusal:  # the file's value would win: the flag would do nothing
        parse_command_line(a_parser(), ["--out", "s", *before, "--config", str(config)])
    assert str(refusal.value) == (
        f"--{' '.join(before)[2:]} is replaced by {config}: {replaced}, which comes after it (the last value wins) "
        f"— put {before[0]} after --config {config}, or give it once"
    )
    # After the file, the flag is the documented way to change one of its options.
    parse_command_line(a_parser(), ["--out", "s", "--config", str(config), *before])


@pytest.mark.parametrize(
    ("before", "in_the_file"),
    [
        (["--lr", "1e-3"], {"lr": 0.001}),  # one value, two spellings
        (["--metrics", "fid", "kid"], {"metrics": ["fid", "kid"]}),
        (["--metrics", "[fid, kid]"], {"metrics": ["fid", "kid"]}),
        (["--out", "s"], {"out": "s"}),
        (["--lr", "0.5"], {"subset": 3}),  # another option
        (["--data", "VectorDataModule"], {"data": {"class_path": "diffusion.data.VectorDataModule"}}),
    ],
)
def test_a_flag_a_later_file_repeats_or_leaves_alone_is_taken(before, in_the_file, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(in_the_file))
    parse_command_line(a_parser(), ["--out", "s", *before, "--config", str(config)])


def test_config_files_one_after_another_layer_as_documented(tmp_path):
    base, override = tmp_path / "base.yaml", tmp_path / "override.yaml"
    base.write_text("lr: 0.5\nsubset: 3\n")
    override.write_text("lr: 0.25\n")
    config = parse_command_line(a_parser(), ["--out", "s", "--config", str(base), "--config", str(override)])
    assert (config.lr, config.subset) == (0.25, 3)


# ---- list flags: the forms users write -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "key", "expected"),
    [
        (["--metrics", "fid", "kid"], "metrics", ["fid", "kid"]),
        (["--metrics", "[fid, kid]"], "metrics", ["fid", "kid"]),
        (["--metrics", "fid,kid"], "metrics", ["fid", "kid"]),
        (["--metrics", "fid"], "metrics", ["fid"]),
        (["--sweep", "[0.1, 0.2]"], "sweep", [0.1, 0.2]),
        (["--sweep", "0.1", "0.2"], "sweep", [0.1, 0.2]),
        (["--sweep", "0.1,0.2"], "sweep", [0.1, 0.2]),
        (["--sweep", "0.1"], "sweep", [0.1]),
        (["--betas", "0.5", "0.6"], "betas", (0.5, 0.6)),
        (["--betas", "0.5,0.6"], "betas", (0.5, 0.6)),
    ],
)
def test_a_list_flag_takes_the_forms_users_write(flags, key, expected):
    assert parse_command_line(a_parser(), ["--out", "s", *flags])[key] == expected


def test_a_bad_item_of_a_list_flag_says_the_forms_it_takes():
    assert refused(["--out", "s", "--metrics", "fid,fd"]) == (
        "--metrics fid,fd is not one of the choices — choose one of 'fid', 'kid'; several as fid kid, [fid, kid] "
        "or fid,kid"
    )


@pytest.mark.parametrize("argv", [["--max_stepz", "3"], ["--print_config", "--devicez", "2"]])
def test_a_near_miss_of_a_shorthand_of_train_py_names_the_shorthand(argv, capsys):
    # Round 23a (noted): `--max_stepz 3` got no "did you mean" where `--trainer.max_stepz 3` did
    meant = {"--max_stepz": "--max_steps", "--devicez": "--devices"}[argv[-2]]
    assert train_line(argv, capsys) == (
        f"{argv[-2]} is not an option of this command — write {meant} if that is what was meant, or see --help for "
        "the options (--print_config for a full config)"
    )


def test_a_typed_number_is_said_as_typed_not_as_parsed(capsys):
    # Round 23a (noted): `--model.lr -1` was said as `--model.lr -1.0 is out of range`
    assert train_line(["--model.lr", "-1"], capsys).startswith("--model.lr -1 is out of range (must be")
    assert train_line(["--model.sampling.eta=-1"], capsys).startswith(
        "--model.sampling.eta -1 is out of range"
    )
    typed = [Written("model.lr", ("-1",))]
    fix = "— pass e.g. --model.lr 2e-4"  # another number after the flag: left as it is
    assert (
        said_as_written(f"--model.lr -1.0 is out of range {fix}", typed)
        == f"--model.lr -1 is out of range {fix}"
    )
    in_a_file = [Written("model.lr", (-1.0,), "run.yaml")]  # a file's value is said as the file's key
    assert said_as_written("--model.lr -1.0 is bad", in_a_file) == "run.yaml: model.lr -1.0 is bad"
