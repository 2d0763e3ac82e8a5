"""A list option's items written as one text, in a file or as a flag, are said "not a list" with the form that
works, made of the user's own items (round 7's M5: `sweep: '0.05 0.1'` was "not a valid float"); and a file of a
class's bare arguments (`--model.network net.yaml` holding `channels: many`, no class_path) is read as the
arguments of the class chosen before it (round 6a's J10: it was "no such class (No module named 'net')").
Through train.py's own parser: null where a class is needed, a choice of a class's argument where the class
goes, a list's item of another type (rounds 8 and 9).
"""

from pathlib import Path

import pytest
from helpers.parse_errors import a_parser, refused, train_line
from jsonargparse import ArgumentParser
from torch import nn

from diffusion.cli.flags import command_parser
from diffusion.cli.parse_errors import BadCommandLine, parse_command_line

IN_A_FILE = {  # id: (the line of run.yaml, the whole line but "error: ")
    "items_with_a_space": ("sweep: '0.05 0.1'", "run.yaml: sweep 0.05 0.1 is not a list — write a list in "
                           "brackets, e.g. [0.05, 0.1]"),
    "items_of_several_with_a_space": ("metrics: fid kid", "run.yaml: metrics fid kid is not a list — write a list "
                                      "in brackets, e.g. [fid, kid]"),
    "items_with_a_comma": ("metrics: 'fid, kid'", "run.yaml: metrics fid, kid is not a list — write a list in "
                           "brackets, e.g. [fid, kid]"),
    "a_list_in_quotes": ("metrics: '[fid, kid]'", "run.yaml: metrics [fid, kid] is not a list — write the list "
                         "without quotes: [fid, kid]"),
    "a_pair_with_a_space": ("betas: 0.5 0.6", "run.yaml: betas 0.5 0.6 is not a list — write a list in brackets, "
                            "e.g. [0.5, 0.6]"),
    "one_item": ("sweep: 0.1", "run.yaml: sweep 0.1 is not a list — write a list in brackets, e.g. [0.1]"),
}  # fmt: skip

AS_A_FLAG = {  # id: (the flag's words, the line)
    "one_quoted_word": (["--sweep", "0.05 0.1"], "--sweep '0.05 0.1' is one word, not a list — write its items "
                        "with commas, --sweep 0.05,0.1, or in brackets and quotes: --sweep \"[0.05, 0.1]\""),
    "one_quoted_word_of_several": (["--metrics", "fid kid"], "--metrics 'fid kid' is one word, not a list — write "
                                   "its items with commas, --metrics fid,kid, or in brackets and quotes: --metrics "
                                   "\"[fid, kid]\""),
    "brackets_the_shell_split": (["--sweep", "[0.05,", "0.1]"], "--sweep [0.05, 0.1]: the shell split the list at "
                                 "its spaces — write its items with commas, --sweep 0.05,0.1, or in brackets and "
                                 "quotes: --sweep \"[0.05, 0.1]\""),
    "brackets_of_several_the_shell_split": (["--metrics", "[fid,", "kid]"], "--metrics [fid, kid]: the shell split "
                                            "the list at its spaces — write its items with commas, --metrics "
                                            "fid,kid, or in brackets and quotes: --metrics \"[fid, kid]\""),
}  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), IN_A_FILE.values(), ids=IN_A_FILE.keys())
def test_a_lists_items_written_as_one_value_in_a_file_are_said_not_a_list(
    line, expected, in_a_folder_with_either_words
):
    Path("run.yaml").write_text(line + "\n")
    assert refused(["--out", "s", "--config", "run.yaml"]) == expected


@pytest.mark.parametrize(("words", "expected"), AS_A_FLAG.values(), ids=AS_A_FLAG.keys())
def test_a_lists_items_as_one_word_or_split_by_the_shell_are_said_not_a_list(
    words, expected, in_a_folder_with_either_words
):
    assert refused(["--out", "s", *words]) == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "run.yaml"],  # sweep: '[0.05, 0.1]', YAML's text, which a list type parses
        ["--sweep", "[0.05, 0.1]"],
        ["--metrics", "[fid, kid]"],
        ["--metrics", "fid,kid"],
        ["--sweep", "0.05,0.1"],
    ],
)
def test_the_forms_the_lines_give_parse(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text("sweep: '[0.05, 0.1]'\n")
    parse_command_line(a_parser(), ["--out", "s", *argv])


class Net(nn.Module):
    def __init__(self, channels: int = 8, channel_mult: tuple[int, ...] = (1, 2)) -> None:
        super().__init__()


def a_parser_of_networks(chosen: bool = True) -> ArgumentParser:
    """A network chosen by class path or by a file, as train.py's `--model.network` (LightningCLI's subclass
    flags), its class chosen by default (`chosen`) or by none."""
    parser = command_parser("python -m diffusion.example", "a network chosen by a file")
    default = {"class_path": f"{__name__}.Net"} if chosen else None
    parser.add_subclass_arguments(nn.Module, "network", default=default, required=False)
    return parser


def network_refused(argv: list[str], chosen: bool = True) -> str:
    with pytest.raises(BadCommandLine) as refusal:
        parse_command_line(a_parser_of_networks(chosen), argv)
    return str(refusal.value)


BARE_FILES = {  # id: (net.yaml, the line)
    "a_bad_value": ("channels: many\n", "net.yaml: network.init_args.channels many is not a valid int — pass a "
                    "value of that type (see --help)"),
    "an_unknown_key": ("chanels: 8\n", "net.yaml: network.init_args.chanels is not an option of Net — see --help "
                       "for the options (--print_config for a full config)"),
    "items_of_a_list_as_one_value": ("channel_mult: 1 2\n", "net.yaml: network.init_args.channel_mult 1 2 is not a "
                                     "list — write a list in brackets, e.g. [1, 2]"),
    "init_args_alone": ("init_args:\n  channels: many\n", "net.yaml: network.init_args.channels many is not a valid "
                        "int — pass a value of that type (see --help)"),
}  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), BARE_FILES.values(), ids=BARE_FILES.keys())
@pytest.mark.parametrize("named_in", ["a_flag", "a_config_file"])
def test_a_file_of_a_classs_bare_arguments_is_read_as_the_chosen_classs_arguments(
    text, expected, named_in, in_a_folder_with_either_words
):
    Path("net.yaml").write_text(text)
    Path("run.yaml").write_text("network: net.yaml\n")
    argv = ["--network", "net.yaml"] if named_in == "a_flag" else ["--config", "run.yaml"]
    assert network_refused(argv) == expected


def test_a_file_of_bare_arguments_with_no_class_chosen_is_said_to_name_none(in_a_folder_with_either_words):
    Path("net.yaml").write_text("channels: 16\n")
    assert network_refused(["--network", "net.yaml"], chosen=False) == (
        "--network net.yaml: the file names no class_path — write class_path: module.Class in it, its arguments "
        "under init_args:, or choose the class before it"
    )


def test_a_file_of_bare_arguments_parses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("net.yaml").write_text("channels: 16\nchannel_mult: [1, 2, 2]\n")
    config = parse_command_line(a_parser_of_networks(), ["--network", "net.yaml"])
    assert config.network.init_args.channels == 16


# ---- train.py's own parser: a class or a list said of what was written ---------------------------------------
def test_null_where_a_class_is_needed_is_said_so(tmp_path, monkeypatch, capsys):
    """`--model.network null` was `no such class (module 'diffusion' has no attribute 'null')`."""
    monkeypatch.chdir(tmp_path)
    needs = "this option needs a class — pass the class path of a class that exists, as module.Class"
    assert train_line(["--model.network", "null"], capsys).startswith(f"--model.network null: {needs}")
    Path("run.yaml").write_text("model:\n  network: null\n")
    assert train_line(["--config", "run.yaml"], capsys).startswith(f"run.yaml: model.network null: {needs}")


def test_a_choice_of_the_data_modules_argument_where_the_class_goes_is_said_so(tmp_path, monkeypatch, capsys):
    """Round 8's N7: `--data digits` was `no such class (module 'diffusion' has no attribute 'digits')`."""
    monkeypatch.chdir(tmp_path)
    assert train_line(["--data", "digits"], capsys) == (
        "--data digits: no class is named digits; digits is a choice of ImageDataModule's dataset — pass "
        "--data.dataset digits, or a class path as module.Class (see --help)"
    )
    assert train_line(["--model.network", "cosine"], capsys).startswith(  # a schedule's choice: no network's
        "--model.network cosine: no such class (diffusion has no class cosine) — pass the class path"
    )


def test_a_list_whose_item_is_of_another_type_names_the_item(tmp_path, monkeypatch, capsys):
    """Round 8's N5: `channel_mult "[1, 2.5]"` was "not a valid list — ... a list in brackets", which it was."""
    monkeypatch.chdir(tmp_path)
    flag = "--model.network.init_args.channel_mult"
    assert train_line([flag, "[1, 2.5]"], capsys) == (
        f"{flag} [1, 2.5]: its item 2.5 is not a valid int — pass a value of that type (see --help)"
    )
    Path("run.yaml").write_text("model:\n  network:\n    init_args:\n      channel_mult: [1, abc]\n")
    assert train_line(["--config", "run.yaml"], capsys) == (
        "run.yaml: model.network.init_args.channel_mult [1, abc]: its item abc is not a valid int — pass a value of "
        "that type (see --help)"
    )
