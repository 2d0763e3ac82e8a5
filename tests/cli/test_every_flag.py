"""Every flag of every command, given bad values: one line, exit status 2, no traceback, the user's files unchanged.

The flags are read from the commands' parsers, so a new flag is covered without a word here; the bad values come
from its type: a wrong type and a value out of its range for numbers, a choice that does not exist, a class that
does not exist, and for a path a missing file, a folder, an empty file and a file of another kind (a wanted
folder: missing, a file, an empty folder; an output: a path under a file). A string flag of no known kind gets
``nope`` and must refuse it: a new one joins FILE_FLAGS, FOLDER_FLAGS or OUTPUT_FLAGS, or refuses what it cannot
use. The line must name the flag, and match a row of docs/troubleshooting.md's table of messages. A value the parser
itself refuses (a kind in PARSER_KINDS) is also written in a --config file, whose line must be the flag's with
`--flag value` said as `FILE: flag value`.
Each command runs in this process, from a good command line plus the one bad flag, through its real entry point;
a bad value fails before any training, sampling or scoring time is spent. train.py's flags are those its parser
holds, and the options of each class it can be given for the data and the network (``--data.init_args.*``,
``--model.network.init_args.*``, read from the class's signature as LightningCLI reads it), each from a command
line that chooses that class; an integer option of theirs also gets a negative value (none of them means
anything below zero).
"""

import contextlib
import shutil
import sys
import types
import typing
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import yaml
from helpers import QUICK, TINY_MLP, TINY_UNET, tiny_run
from helpers.troubleshooting import matches_a_row
from helpers.user_errors import run_in_process
from jsonargparse import ArgumentParser
from PIL import Image

from diffusion.cli import evaluate, evaluate_nll, export, parse_errors, phema, prepare, sample
from diffusion.cli.command_line import plain_key
from diffusion.cli.jsonargparse_internals import (
    actions,
    declared_type,
    is_jsonargparse_own,
    loads_a_group_file,
)
from diffusion.cli.prepare import TRAINING_SECTIONS
from diffusion.cli.train import DiffusionCLI
from diffusion.cli.train import main as train
from diffusion.cli.training_run import DEFAULT_CONFIG, with_default_config
from diffusion.data import ImageDataModule, VectorDataModule
from diffusion.models import MLP, UNet

FILE_FLAGS = {
    "ckpt",
    "samples",
    "reference",
    "data.path",
    "inception_weights",
    "ckpt_path",
    "model.init_from",
    "data.init_args.path",
    "data.init_args.labels",
}
FOLDER_FLAGS = {"run", "data_root"}
OUTPUT_FLAGS = {"out", "save_stats", "trainer.default_root_dir", "checkpoint.dirpath"}
NOT_CHECKED = {  # flags with no bad value, and why
    "help": "prints the help", "print_config": "prints the config", "config": "test_train_errors' config cases",
    "checkpoint.filename": "any file name is one", "trainer.model_registry": "any name is one",
    "data.init_args.root": "where mnist and cifar10 download to (made if missing); digits reads none; the folder "
                           "dataset's missing or empty root: test_train_errors",
    **{f"prepare--{section}": "train.py's section of a --config, left alone by prepare (refused as a flag: test_prepare_command_line)" for section in TRAINING_SECTIONS},
}  # fmt: skip
CONTEXT = {  # what a flag needs beside it to be used at all
    "inception_weights": ["--features", "inception"],
    "data_root": ["--reference", "folder"],
    "trainer.default_root_dir": ["--trainer.logger", "false"],  # a logger's save_dir is the run's folder
    "data.init_args.labels": ["--data.init_args.path", "{user}/points.npy"],  # labels name a file's points
}


def train_parser() -> ArgumentParser:
    """train.py's parser as LightningCLI builds it (stopped before it parses)."""
    found = []

    def keep(cli, parser, args):
        found.append(parser)
        raise StopIteration

    with mock.patch.object(DiffusionCLI, "parse_arguments", keep), contextlib.suppress(StopIteration):
        DiffusionCLI(with_default_config([]))
    return found[0]


GOOD = "{user}/runs/digits/version_0/checkpoints/last.ckpt"
SAMPLES = "{user}/samples/samples.npz"
COMMANDS = {  # name: (entry point, parser, a good command line)
    "sample": (sample.main, sample.build_parser, ["--ckpt", GOOD, "--out", "{tmp}/s", "--num_samples", "2",
                                                  "--sampler", "ddim", "--steps", "2", "--device", "cpu"]),
    "evaluate": (evaluate.main, evaluate.build_parser, ["--samples", SAMPLES, "--reference", SAMPLES,
                                                        "--features", "pixels", "--device", "cpu"]),
    "evaluate_nll": (evaluate.main, evaluate_nll.build_parser, ["--nll", "--ckpt", GOOD, "--data.path", SAMPLES,
                                                                "--num_images", "1", "--device", "cpu"]),
    "export": (export.main, export.build_parser, ["--ckpt", GOOD, "--format", "safetensors", "--out", "{tmp}/e"]),
    "train": (train, train_parser, ["--trainer.logger.init_args.save_dir", "{tmp}/runs", *TINY_UNET, *QUICK]),
    "prepare": (prepare.main, prepare.build_parser, ["--out", "{tmp}/prepared", "--num_workers", "1"]),
    "phema": (phema.main, phema.build_parser, ["--run", "{user}/runs/phema/version_0", "--sweep", "[0.1]",
                                               "--num_samples", "4", "--sampler", "ddim", "--steps", "2",
                                               "--reference", SAMPLES, "--device", "cpu"]),
}  # fmt: skip


TRAIN_TOY = ["--config", str(Path(__file__).parents[2] / "configs" / "toy2d.yaml"), *COMMANDS["train"][2][:2],
             *TINY_MLP, *QUICK]  # fmt: skip
CLASSES = {  # train.py's classes for the data and the network: (group, class, a good command line choosing it)
    "images": ("data", ImageDataModule, COMMANDS["train"][2]),
    "vectors": ("data", VectorDataModule, TRAIN_TOY),
    "unet": ("model.network", UNet, COMMANDS["train"][2]),
    "mlp": ("model.network", MLP, TRAIN_TOY),
}


def bad_values(name: str, typehint: object) -> dict[str, str]:
    """kind of bad value -> the value, for a flag of this name and type."""
    if name in FILE_FLAGS:
        return {"missing": "{user}/nope.ckpt", "a_folder": "{bad}/empty_folder", "empty": "{bad}/empty",
                "another_kind": "{bad}/picture.png"}  # fmt: skip
    if name in FOLDER_FLAGS:
        return {"missing": "{user}/nope", "a_file": "{bad}/picture.png", "empty_folder": "{bad}/empty_folder"}
    if name in OUTPUT_FLAGS:
        return {"under_a_file": "{bad}/picture.png/out"}
    union = typing.get_origin(typehint) in (typing.Union, types.UnionType)
    kinds = [t for t in (typing.get_args(typehint) if union else [typehint]) if t is not type(None)]
    values = {}
    if any(typing.get_origin(t) is typing.Literal for t in kinds):
        values["not_a_choice"] = "nope"
    for kind in kinds:
        text = getattr(kind, "__name__", str(kind))
        if text in ("PositiveInt", "NonNegativeInt", "AtLeastTwo") or kind is int:
            values["not_a_number"] = "abc"
            values |= {"PositiveInt": {"zero": "0"}, "NonNegativeInt": {"negative": "-1"},
                       "AtLeastTwo": {"one": "1"}}.get(text, {})  # fmt: skip
        elif kind is float:
            values |= {"not_a_number": "abc", "infinite": "inf"}
        elif kind is bool:
            values["not_a_bool"] = "maybe"
        elif typing.get_origin(kind) in (list, tuple, dict):
            values["not_a_list"] = "abc"
        elif isinstance(kind, type) and kind.__module__ not in ("builtins", "pathlib", "datetime"):
            values["no_such_class"] = "nope.Nope"  # a class path: --trainer.logger, --model.network, ...
    return values or {"nope": "nope"}


def flag_cases() -> list:
    cases = []
    for command, (_, build_parser, _) in COMMANDS.items():
        for action in actions(build_parser()):
            name = action.dest
            # Its --name.help and the values linked from --data, which are not the user's to set.
            skipped = is_jsonargparse_own(action) or name in NOT_CHECKED
            skipped = skipped or f"{command}--{name}" in NOT_CHECKED
            if skipped or not action.option_strings:
                continue
            if loads_a_group_file(action):  # --model FILE.yaml: the group's options from a file
                cases.append(pytest.param(command, name, "{user}/nope.yaml", id=f"{command}--{name}-missing"))
                continue
            typehint = declared_type(action)
            values = bad_values(name, typehint)
            assert values, (
                f"{command} --{name} ({typehint}): no bad value known; add one or say why in NOT_CHECKED"
            )
            cases += [
                pytest.param(command, name, value, id=f"{command}--{name}-{kind}")
                for kind, value in values.items()
            ]
    for chosen, (group, cls, _) in CLASSES.items():
        parser = ArgumentParser()
        parser.add_class_arguments(cls)  # as LightningCLI reads --data / --model.network's init_args
        for action in actions(parser):
            if not action.option_strings or action.dest == "help":
                continue
            name = f"{group}.init_args.{action.dest}"
            if name in NOT_CHECKED:
                continue
            typehint = declared_type(action)
            values = bad_values(name, typehint)
            if "not_a_number" in values and "infinite" not in values:  # an integer
                values["negative"] = "-3"
            cases += [
                pytest.param(chosen, name, value, id=f"train[{chosen}]--{name}-{kind}")
                for kind, value in values.items()
            ]
    return cases


@pytest.fixture(scope="module")
def home(user, tmp_path_factory) -> Path:
    """The user's folder with a run that wrote post-hoc EMA snapshots, and the bad files and folders."""
    run = tmp_path_factory.mktemp("runs")
    tiny_run(run, "--ema.post_hoc", "true", "--ema.snapshot_every", "2")
    shutil.copytree(run / "digits" / "version_0", user / "runs" / "phema" / "version_0", dirs_exist_ok=True)
    bad = user / "bad"
    (bad / "empty_folder").mkdir(parents=True, exist_ok=True)
    (bad / "empty").write_bytes(b"")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(bad / "picture.png")
    np.save(user / "points.npy", np.random.default_rng(0).normal(size=(64, 2)).astype(np.float32))
    return user


# The kinds of bad value the parser itself refuses (the others are refused by the checks after it, which name the
# flag of the option whatever wrote it).
# jsonargparse's words for its own structure, which no line shows.
PARSER_INTERNALS = (
    "NestedArg",
    "<class",
    "Parser key",
    "typing.",
    "Unexpected config",
    "Subtypes",
    "Namespace(",
)
PARSER_KINDS = (
    "not_a_choice",
    "not_a_number",
    "not_a_bool",
    "not_a_list",
    "no_such_class",
    "zero",
    "one",
    "missing",
)


def bad_command_line(command: str, name: str, value: str, fill: dict) -> tuple:
    """(the command's main, its good command line and context, the bad value filled in)."""
    if command in CLASSES:
        main, good = train, CLASSES[command][2]
    else:
        main, _, good = COMMANDS[command]
    return main, [arg.format(**fill) for arg in [*good, *CONTEXT.get(name, [])]], value.format(**fill)


def without_flags(argv: list[str], names: set[str]) -> list[str]:
    """`argv` less each `--name value ...` of `names` (a bare switch, such as evaluate's `--nll`, stays)."""
    kept, index = [], 0
    while index < len(argv):
        end = index + 1
        while end < len(argv) and not argv[end].startswith("--"):
            end += 1
        flag = argv[index]
        if not (flag.startswith("--") and end > index + 1 and flag[2:].partition("=")[0] in names):
            kept += argv[index:end]
        index = end
    return kept


@pytest.mark.parametrize(("command", "name", "value"), flag_cases())
def test_a_bad_value_of_any_flag_is_one_line(
    command, name, value, home, tmp_path, capsys, monkeypatch, request
):
    monkeypatch.setattr(sys, "argv", ["python"])
    refusals, what_is_wrong = [], parse_errors.what_is_wrong

    def recorded(*args):  # the parser refused the command line (not a check after it)
        refusals.append(what_is_wrong(*args))
        return refusals[-1]

    monkeypatch.setattr(parse_errors, "what_is_wrong", recorded)  # every command's parse, train.py's too
    fill = {"user": home, "bad": home / "bad", "tmp": tmp_path}
    main, good, value = bad_command_line(command, name, value, fill)
    if main is train:  # the default recipe first, as without a --config of the user's
        good = ["--config", str(DEFAULT_CONFIG), *good]
    # The flag as written, as its group's shorthand (--model.network.channels) or as train.py's (--devices).
    written = {name, name.replace(".init_args.", "."), name.removeprefix("trainer.")}
    # The good command line less the flag itself: the same option given twice otherwise (a shorthand and its long
    # form, a flag before a --config file that sets it) is refused before its value is looked at.
    good = without_flags(good, written | {plain_key(flag) for flag in written})
    line = run_in_process(main, [*good, f"--{name}", value], home, capsys)
    assert any(f"--{flag} " in line or f"--{flag}:" in line for flag in written), line
    assert matches_a_row(line), f"not in docs/troubleshooting.md's table: {line}"
    assert not any(internal in line for internal in PARSER_INTERNALS), line
    if not request.node.callspec.id.endswith(PARSER_KINDS) or name in FILE_FLAGS | FOLDER_FLAGS:
        return
    # The same value in a config file: where the parser refused it, the same line said of the file and its key; a
    # check after the parser says it of the file and its key too (the flag said as the key).
    options: object = yaml.safe_load(value)
    for part in reversed(name.split(".")):
        options = {part: options}
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(options))
    refusals.clear()
    line_of_the_file = run_in_process(main, [*good, "--config", str(config)], home, capsys)
    said_of_the_file = line.replace(f"--{name} {value}", f"{config}: {name} {value}")
    # A check after the parse: the flag said as the file's key where the line goes on with its value.
    checked_after = [said_of_the_file] + [
        line.replace(f"--{flag}", f"{config}: {key}", 1)
        for flag in written
        for key in (name, plain_key(name))
    ]
    assert line_of_the_file == said_of_the_file if refusals else line_of_the_file in checked_after, (
        line_of_the_file
    )
    assert refusals or str(config) in line_of_the_file, line_of_the_file
    assert not any(internal in line_of_the_file for internal in PARSER_INTERNALS), line_of_the_file
