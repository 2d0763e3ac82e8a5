"""A bad value written in a --config file gives the line the same flag gets on the command line
(test_parse_errors.py's cases), said of the file and its key; a file of the wrong shape or key is said as such, a
group's own file as the group's keys, and a file edited between two reports as it is now.
"""

from pathlib import Path

import pytest
import yaml
from helpers.parse_errors import CASES, refused
from jsonargparse import ArgumentParser
from lightning.pytorch import LightningDataModule

from diffusion.cli.command_line import said_as_written
from diffusion.cli.config_files import as_text
from diffusion.cli.flags import command_parser
from diffusion.cli.parse_errors import BadCommandLine, flags_written, parsed_command_line


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
    # a key near an option names it (keys and flags are not taken by a prefix of their name)
    "an_unknown_key": ("lrr: 0.1\n", "run.yaml: lrr is not an option of this command — write lr if that is what was "
                                     "meant, or see --help for the options (--print_config for a full config)"),
    "an_unknown_key_of_a_group": ("optimizer:\n  lrr: 0.1\n", "run.yaml: optimizer.lrr is not an option of this "
                                  "command — write optimizer.lr if that is what was meant, or see --help for the "
                                  "options (--print_config for a full config)"),
    # Round 17 (noted): train.py's `sampling:` mapping copied into sample's config said only "not an option"
    "the_commands_own_options_under_a_group": ("sampling:\n  sampler: ddim\n  lr: 0.1\n", "run.yaml: sampling is "
                                               "not an option of this command — write sampler, lr (its own "
                                               "options, at the top level of the file), or see --help for the "
                                               "options (--print_config for a full config)"),
    "an_unknown_key_far_from_any": ("bogus: 1\n", "run.yaml: bogus is not an option of this command — see --help for "
                                    "the options (--print_config for a full config)"),
    "a_name_where_a_group_goes": ("optimizer: adam\n", "run.yaml: optimizer adam: no such config file — pass a YAML "
                                  "file of these options (see --print_config)"),
    "a_value_of_a_group": ("optimizer:\n  schedule: linear\n", "run.yaml: optimizer.schedule linear is not one of "
                           "the choices — choose one of 'constant', 'cosine'"),
    "a_list_written_as_one_value": ("metrics: fid\n", "run.yaml: metrics fid is not a list — write a list in "
                                    "brackets, e.g. [fid]"),
    # A list type (not a flag of several values): its one item was said "not a valid float"
    "a_list_type_written_as_one_value": ("sweep: 0.1\n", "run.yaml: sweep 0.1 is not a list — write a list in "
                                         "brackets, e.g. [0.1]"),
    # The parser let these through, and the command met them deep in its work (a TypeError, an AttributeError).
    "a_null_where_no_null_goes": ("lr: null\n", "run.yaml: lr null: this option takes a float, not null — remove "
                                  "the line for the default (0.001), or write a value"),
    "a_group_as_one_value": ("optimizer: 5\n", "run.yaml: optimizer 5: optimizer is a group of options, not one "
                             "value — write its options under it as name: value lines, or the path of a YAML file "
                             "of them"),
    # Round 10's S1: jsonargparse failed inside on it ("dictionary changed size"), said as a bug of ours
    "a_mapping_where_choices_go": ("metrics: {fid: true}\n", "run.yaml: metrics {fid: true} is not one of the "
                                   "choices — choose one of 'fid', 'kid'; several as fid kid, [fid, kid] or fid,kid"),
    "a_mapping_where_a_list_goes": ("sweep: {0.05: 1}\n", "run.yaml: sweep {0.05: 1} is a mapping, not a list — "
                                    "write a list in brackets, e.g. [1, 2]"),
    # A required option left blank (`ckpt:`): it was argparse's "the following arguments are required", no file.
    "a_required_option_left_blank": ("out:\n", "run.yaml: out is blank, and it is required — write its value "
                                     "after 'out:'"),
    "a_number_where_text_goes": ("out: 8\n", "run.yaml: out 8 is a number, not text — write it in quotes: '8'"),
    "init_args_as_a_list": ("data:\n  class_path: diffusion.data.ImageDataModule\n  init_args: [8]\n",
                            "run.yaml: data.init_args [8]: init_args holds the arguments of the class, by name — "
                            "write them under it as name: value lines (e.g. channels: 64)"),
    "not_text": ("\udcb4\udc80 binary", "--config run.yaml: the config file is not text (a checkpoint, an image, "
                                        "...?) — pass a YAML file of these options (see --print_config)"),
    # YAML 1.1 reads a leading zero as octal: `num_samples: 010` sampled 8, silently
    "an_octal_number": ("lr: 0.1\nnum_samples: 010\n", "--config run.yaml: 010 at line 2 is an octal number to YAML "
                        "(8), not 10 — write it without the leading zero (in quotes, for text)"),
    "a_class_of_another_kind": ("data: diffusion.UNet\n", "run.yaml: data diffusion.UNet: UNet is not a "
                                "LightningDataModule — pass the class path of a LightningDataModule (see --help)"),
    # A list where one text goes: its text passed as a str, and the parser's union report was the line.
    "a_list_where_one_value_goes": ("out: [a, b]\n", "run.yaml: out [a, b] is a list, not a str — write one value "
                                    "(see --help)"),
    # YAML takes the last of two, silently; the parser never sees the first.
    "a_key_given_twice": ("lr: 0.1\nsteps: 2\nlr: 0.5\n", "--config run.yaml: lr is given twice (lines 1 and 3) — "
                          "keep one of them (YAML would take the last without a word)"),
    # Round 5a's H9: jsonargparse's "Option 'print_config' is not accepted" named neither the file nor the flag.
    "print_config_in_a_file": ("print_config: true\n", "run.yaml: print_config is a flag of the command line, not "
                               "an option of a config file — remove the line, and pass --print_config on the "
                               "command line"),
    "print_config_with_its_options_in_a_file": ("print_config: skip_null\n", "run.yaml: print_config is a flag of "
                                                "the command line, not an option of a config file — remove the "
                                                "line, and pass --print_config=skip_null on the command line"),
    "help_in_a_file": ("lr: 0.1\nhelp: true\n", "run.yaml: help is a flag of the command line, not an option of a "
                       "config file — remove the line, and pass --help on the command line"),
    "a_nested_key_given_twice": ("optimizer:\n  schedule: cosine\n  schedule: constant\n", "--config run.yaml: "
                                 "schedule is given twice (lines 2 and 3) — keep one of them (YAML would take the "
                                 "last without a word)"),
}  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), FILE_CASES.values(), ids=FILE_CASES.keys())
def test_a_config_file_of_the_wrong_shape_or_key_is_said_as_such(
    text, expected, in_a_folder_with_either_words
):
    Path("run.yaml").write_bytes(text.encode("utf-8", "surrogateescape"))  # bytes that are no UTF-8 too
    assert refused(["--out", "samples", "--config", "run.yaml"]) == expected


def test_a_folder_given_as_the_config_file_is_said_as_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("runs").mkdir()
    assert refused(["--out", "samples", "--config", "runs"]) == (
        "--config runs is a folder, not a config file — pass a YAML file of these options (see --print_config)"
    )


def test_a_group_file_is_read_as_the_groups_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("optimizer.yaml").write_text("lr: fast\n")
    assert refused(["--out", "s", "--optimizer", "optimizer.yaml"]) == (
        "optimizer.yaml: optimizer.lr fast is not a valid float — pass a value of that type (see --help)"
    )


def test_a_group_file_named_in_a_config_file_is_read_beside_it(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "run.yaml").write_text("optimizer: optimizer.yaml\n")
    (tmp_path / "configs" / "optimizer.yaml").write_text("lr: fast\n")
    monkeypatch.chdir(tmp_path)
    assert refused(["--out", "s", "--config", "configs/run.yaml"]) == (
        "configs/optimizer.yaml: optimizer.lr fast is not a valid float — pass a value of that type (see --help)"
    )


def a_parser_of_class_files() -> ArgumentParser:
    """A class chosen by a file of its options, as train.py's `--data data.yaml` (LightningCLI's subclass flags)."""
    parser = command_parser("python -m diffusion.example", "a class chosen by a file")
    parser.add_subclass_arguments(LightningDataModule, "data")
    return parser


@pytest.mark.parametrize("batch_size", ["abc", "-3"])
def test_a_class_file_named_in_a_config_file_is_read_as_its_keys(batch_size, tmp_path, monkeypatch):
    """Round 5a's H5 and H6: `data: data.yaml` in configs/run.yaml (read from its folder), with a bad value in
    data.yaml, said "data data.yaml: no such class (No module named 'data')", and a check after the parse (a data
    module's range) `--data.batch_size -3`, naming no file: both are said as `--data configs/data.yaml` says them,
    with data.yaml's key."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "run.yaml").write_text("data: data.yaml\n")
    (tmp_path / "configs" / "data.yaml").write_text(
        f"class_path: diffusion.data.ImageDataModule\ninit_args:\n  batch_size: {batch_size}\n"
    )
    monkeypatch.chdir(tmp_path)
    for argv in (["--config", "configs/run.yaml"], ["--data", "configs/data.yaml"]):
        if batch_size == "abc":  # the parser's refusal
            with pytest.raises(BadCommandLine) as refusal:
                parsed_command_line(a_parser_of_class_files(), argv)
            assert str(refusal.value) == (
                "configs/data.yaml: data.init_args.batch_size abc is not a valid int — pass a value of that type "
                "(see --help)"
            )
        else:  # a check after the parse, said where every command reports
            written = parsed_command_line(a_parser_of_class_files(), argv).written
            assert said_as_written("--data.batch_size -3 is out of range (must be >= 1)", written) == (
                "configs/data.yaml: data.batch_size -3 is out of range (must be >= 1)"
            )


def test_a_config_file_named_in_a_config_file_is_read_as_its_keys(tmp_path, monkeypatch):
    """`config: base.yaml` in a config file (the parser reads it, from that file's folder): a bad value in it was
    said in jsonargparse's words (`Parser key "lr": Expected a <class 'float'>`); a loop of them is the parser's
    to say, without reading them forever."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "run.yaml").write_text("config: base.yaml\n")
    (tmp_path / "configs" / "base.yaml").write_text("lr: abc\n")
    monkeypatch.chdir(tmp_path)
    assert refused(["--out", "s", "--config", "configs/run.yaml"]) == (
        "configs/base.yaml: lr abc is not a valid float — pass a value of that type (see --help)"
    )
    (tmp_path / "configs" / "base.yaml").write_text("config: run.yaml\n")
    assert refused(["--out", "s", "--config", "configs/run.yaml"]).startswith("Config file loop detected")


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


def test_a_group_file_named_in_a_config_file_from_the_working_directory_is_said_where_it_was_looked_for(
    tmp_path, monkeypatch
):
    """The parser reads a path in a config file from that file's folder: `optimizer: configs/optimizer.yaml` in
    configs/run.yaml is configs/configs/optimizer.yaml, even where the path as written is a file from the working
    directory (the parser's own words were the line)."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "run.yaml").write_text("optimizer: configs/optimizer.yaml\n")
    (tmp_path / "configs" / "optimizer.yaml").write_text("lr: 0.1\n")
    monkeypatch.chdir(tmp_path)
    assert refused(["--out", "s", "--config", "configs/run.yaml"]) == (
        "configs/run.yaml: optimizer configs/optimizer.yaml (read from its folder: configs/configs/optimizer.yaml): "
        "no such config file — write its path from configs/, the folder of configs/run.yaml, or an absolute path"
    )


def test_the_start_of_one_option_names_it():
    # Round 18a (noted): `--guidance` for --guidance_scale said only "not an option"
    assert refused(["--out", "o", "--num_sample", "3"]).startswith(  # near --num_samples, by difflib
        "--num_sample is not an option of this command — write --num_samples if that is what was meant"
    )
    assert refused(["--out", "o", "--inter", "3"]).startswith(
        "--inter is not an option of this command — write --interval if that is what was meant"
    )
    assert refused(["--out", "o", "--s", "3"]).endswith(
        "— see --help for the options (--print_config for a full config)"
    )


def test_a_flag_of_the_command_written_under_a_group_it_lacks_names_the_flag():
    # `--sampling.sampler ddim` (train.py's --model.sampling.sampler, cut short) for sample's --sampler
    assert refused(["--out", "o", "--sampling.sampler", "ddim"]) == (
        "--sampling.sampler is not an option of this command — write --sampler (its own option), or see --help for "
        "the options (--print_config for a full config)"
    )
    # a near miss of an option is said as that option first: `--optimizer.bogus.lr` is near --optimizer.lr
    assert refused(["--out", "o", "--optimizer.bogus.lr", "1"]).startswith(
        "--optimizer.bogus.lr is not an option of this command — write --optimizer.lr if that is what was meant"
    )
