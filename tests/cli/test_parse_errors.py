"""A refused command line is said from the parser's declared types, not from jsonargparse's message.

Each case parses a bad flag twice: as jsonargparse words its refusal, and with that refusal's text replaced by
nonsense. The line must be the same both times (and the one the flag's type calls for): the commands read which
flag, its value and its type from the parser (diffusion/cli/parse_errors.py), so a jsonargparse release that
rewords its reports changes nothing a user sees. Each bad value written in a --config file gives the same line,
said of the file and its key; a file of the wrong shape is said as such. `--print_config` prints what the command
line as a whole would run, and the list flags take the forms users write. The commands' own lines are in
test_train_errors.py, test_sample_evaluate_errors.py and test_export_errors.py.
"""

from datetime import timedelta
from pathlib import Path
from typing import Literal
from unittest import mock

import pytest
import yaml
from jsonargparse import ActionYesNo, ArgumentError, ArgumentParser
from jsonargparse.typing import Path_fr, PositiveInt, restricted_number_type
from lightning.pytorch import LightningDataModule

from diffusion.cli.command_line import as_text, everything_written
from diffusion.cli.flags import command_parser
from diffusion.cli.parse_errors import BadCommandLine, check_one_name_each, flags_written, parse_command_line
from diffusion.errors import UserError

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
    assert lines[1].endswith(
        "--model.network.init_args.hidden_dim is not an option of UNet — see --help for the options (--print_config "
        "for a full config)"
    )


# ---- the same values in a --config file ------------------------------------------------------------------------
INTERNALS = ("NestedArg", "<class", "Parser key", "typing.", "Unexpected config", "Subtypes")


def refused(argv: list[str]) -> str:
    with pytest.raises(BadCommandLine) as refusal:
        parse_command_line(a_parser(), argv)
    line = str(refusal.value)
    assert not any(internal in line for internal in INTERNALS), line
    return line


@pytest.fixture(params=[False, True], ids=["jsonargparse_words", "reworded"])
def in_a_folder_with_either_words(request, tmp_path, monkeypatch) -> None:
    """In tmp_path, once with jsonargparse's own refusals and once with nonsense in their place: the lines must
    come from the declared types, not from its words."""
    if request.param:
        monkeypatch.setattr(ArgumentParser, "error", refused_with_nonsense)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(("flags", "expected"), CASES.values(), ids=CASES.keys())
def test_a_bad_value_in_a_config_file_is_said_as_the_flag_with_the_file(
    flags, expected, in_a_folder_with_either_words
):
    [(key, values)] = flags_written(flags)
    value = [yaml.safe_load(word) for word in values] if len(values) > 1 else yaml.safe_load(values[0])
    Path("run.yaml").write_text(yaml.safe_dump({key: value}))
    line = refused(["--out", "samples", "--config", "run.yaml"])
    assert line == expected.replace(f"--{key} {' '.join(values)}", f"run.yaml: {key} {as_text(value)}")


FILE_CASES = {  # id: (the file's text, the line)
    "a_list": ("- lr\n- 0.1\n", "--config run.yaml: the config file holds a list, not options — write its options "
                                "as key: value lines (see --print_config)"),
    "a_single_value": ("0.1\n", "--config run.yaml: the config file holds a single value (0.1), not options — "
                                "write its options as key: value lines (see --print_config)"),
    "empty": ("", "--config run.yaml: the config file is empty — write its options as key: value lines (see "
                  "--print_config)"),
    "not_yaml": ("lr: [1\n", "Problems parsing config run.yaml: expected ',' or ']', but got '<stream end>' at line "
                             "2, column 1 — fix the YAML syntax of the --config file"),
    "an_unknown_key": ("lrr: 0.1\n", "run.yaml: lrr is not an option of this command — see --help for the options "
                                     "(--print_config for a full config)"),
    "an_unknown_key_of_a_group": ("optimizer:\n  lrr: 0.1\n", "run.yaml: optimizer.lrr is not an option of this "
                                  "command — see --help for the options (--print_config for a full config)"),
    "a_name_where_a_group_goes": ("optimizer: adam\n", "run.yaml: optimizer adam: no such config file — pass a YAML "
                                  "file of these options (see --print_config)"),
    "a_value_of_a_group": ("optimizer:\n  schedule: linear\n", "run.yaml: optimizer.schedule linear is not one of "
                           "the choices — choose one of 'constant', 'cosine'"),
    "a_list_written_as_one_value": ("metrics: fid\n", "run.yaml: metrics fid is not a list — write a list in "
                                    "brackets, e.g. [fid]"),
    "a_class_of_another_kind": ("data: diffusion.UNet\n", "run.yaml: data diffusion.UNet: UNet is not a "
                                "LightningDataModule — pass the class path of a LightningDataModule (see --help)"),
}  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), FILE_CASES.values(), ids=FILE_CASES.keys())
def test_a_config_file_of_the_wrong_shape_or_key_is_said_as_such(
    text, expected, in_a_folder_with_either_words
):
    Path("run.yaml").write_text(text)
    assert refused(["--out", "samples", "--config", "run.yaml"]) == expected


def test_a_group_file_is_read_as_the_groups_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("optimizer.yaml").write_text("lr: fast\n")
    assert refused(["--out", "s", "--optimizer", "optimizer.yaml"]) == (
        "optimizer.yaml: optimizer.lr fast is not a valid float — pass a value of that type (see --help)"
    )


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
    ],
)
def test_print_config_refuses_what_the_command_refuses(flags, expected, capsys):
    assert refused(["--print_config", *flags]) == expected
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


# ---- train.py (LightningCLI): the same, through its own parse -------------------------------------------------
def train_line(argv: list[str], capsys) -> str:
    """train.py's one line for `argv`; a command line it let through fails at once instead of training."""
    from diffusion.cli import train

    took_it = AssertionError("train.py took the command line")
    with mock.patch.object(train, "fit", side_effect=took_it), pytest.raises(SystemExit) as exited:
        train.main([*argv, "--trainer.logger", "false"])
    assert exited.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert not any(internal in line for internal in INTERNALS), line
    return line.removeprefix("error: ")


def test_train_says_a_bad_value_of_its_config_file_with_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text("model:\n  lr: [1, 2]\n  network:\n    init_args:\n      channels: many\n")
    assert train_line(["--config", "run.yaml"], capsys) == (
        "run.yaml: model.lr [1, 2] is not a valid float — pass a value of that type (see --help)"
    )


def test_train_prints_the_config_of_the_whole_command_line(tmp_path, monkeypatch, capsys):
    from diffusion.cli.train import DEFAULT_CONFIG, main

    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text("model:\n  lr: 0.5\n")
    argv = ["--config", str(DEFAULT_CONFIG), "--print_config", "--config", "run.yaml", "--model.lr", "0.25"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"]["lr"] == 0.25
    assert train_line(["--print_config", "--model.lr", "abc"], capsys) == (
        "--model.lr abc is not a valid float — pass a value of that type (see --help)"
    )


def test_train_refuses_an_option_under_its_old_and_new_name_with_different_values(
    tmp_path, monkeypatch, capsys
):
    from diffusion.cli.train import DiffusionCLI

    monkeypatch.chdir(tmp_path)
    # A config saved since the rename holds both names, the old one null: not given, nothing to refuse.
    Path("saved.yaml").write_text("model:\n  compile: null\n  compile_training: false\n")
    with pytest.raises(SystemExit):
        DiffusionCLI(["--config", "saved.yaml", "--print_config", "--model.compile_training", "true"])
    assert yaml.safe_load(capsys.readouterr().out)["model"]["compile_training"] is True
    Path("old.yaml").write_text("model:\n  compile: true\n")
    assert train_line(["--config", "old.yaml", "--model.compile_training", "false"], capsys) == (
        "old.yaml: model.compile true and --model.compile_training false set one option (model.compile is the old "
        "name of model.compile_training) to different values — give it once, by its new name (--model.compile_training)"
    )


def test_train_says_a_withdrawn_flag_as_written(capsys):
    assert train_line(["--optimizer.lr", "0.1"], capsys).startswith(
        "--optimizer.lr 0.1: train.py takes no --optimizer; the model configures its own Adam"
    )


@pytest.mark.parametrize("form", [["0.5", "0.9"], ["0.5,0.9"], ["[0.5, 0.9]"]])
def test_train_takes_a_list_flag_in_the_forms_users_write(form, capsys):
    from diffusion.cli.train import DiffusionCLI

    with pytest.raises(SystemExit):  # parsed, then printed
        DiffusionCLI(["--print_config", "--model.adam_betas", *form, "--trainer.logger", "false"])
    assert yaml.safe_load(capsys.readouterr().out)["model"]["adam_betas"] == [0.5, 0.9]


def test_a_group_file_named_in_a_config_file_is_read_beside_it(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "run.yaml").write_text("optimizer: optimizer.yaml\n")
    (tmp_path / "configs" / "optimizer.yaml").write_text("lr: fast\n")
    monkeypatch.chdir(tmp_path)
    assert refused(["--out", "s", "--config", "configs/run.yaml"]) == (
        "configs/optimizer.yaml: optimizer.lr fast is not a valid float — pass a value of that type (see --help)"
    )
