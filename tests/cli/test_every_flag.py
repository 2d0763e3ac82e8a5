"""Every flag of every command, given bad values: one line, exit status 2, no traceback, the user's files unchanged.

The flags are read from the commands' parsers, so a new flag is covered without a word here; the bad values come
from its type: a wrong type and a value out of its range for numbers, a choice that does not exist, and for a path
a missing file, a folder, an empty file and a file of another kind (a wanted folder: missing, a file, an empty
folder; an output: a path under a file). A string flag of no known kind gets ``nope`` and must refuse it: a new
one joins FILE_FLAGS, FOLDER_FLAGS or OUTPUT_FLAGS, or refuses what it cannot use. The line must name the flag or
the value. Each command runs in this process, from a good command line plus the one bad flag, through its real
entry point; a bad value fails before any sampling or scoring time is spent.
"""

import shutil
import sys
import types
import typing
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_run
from helpers.user_errors import run_in_process
from jsonargparse import ActionYesNo
from PIL import Image

from diffusion.cli import evaluate, evaluate_nll, export, phema, sample

FILE_FLAGS = {"ckpt", "samples", "reference", "data.path", "inception_weights"}
FOLDER_FLAGS = {"run", "data_root"}
OUTPUT_FLAGS = {"out", "save_stats"}
NOT_CHECKED = {  # flags with no bad value, and why
    "help": "prints the help", "print_config": "prints the config", "config": "test_train_errors' config cases",
}  # fmt: skip
CONTEXT = {  # what a flag needs beside it to be used at all
    "inception_weights": ["--features", "inception"],
    "data_root": ["--reference", "folder"],
}

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
    "phema": (phema.main, phema.build_parser, ["--run", "{user}/runs/phema/version_0", "--sweep", "[0.1]",
                                               "--num_samples", "4", "--sampler", "ddim", "--steps", "2",
                                               "--reference", SAMPLES, "--device", "cpu"]),
}  # fmt: skip


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
            values |= {"not_a_number": "abc", "not_an_integer": "1.5"}
            values |= {"PositiveInt": {"zero": "0"}, "NonNegativeInt": {"negative": "-1"},
                       "AtLeastTwo": {"one": "1"}}.get(text, {})  # fmt: skip
        elif kind is float:
            values |= {"not_a_number": "abc", "infinite": "inf"}
        elif kind is bool:
            values["not_a_bool"] = "maybe"
        elif typing.get_origin(kind) is list:
            values["not_a_list"] = "abc"
        elif kind is str and not values:
            values["nope"] = "nope"
    return values


def flag_cases() -> list:
    cases = []
    for command, (_, build_parser, _) in COMMANDS.items():
        for action in build_parser()._actions:
            name = action.dest
            if name in NOT_CHECKED or not action.option_strings:
                continue
            typehint = bool if isinstance(action, ActionYesNo) else getattr(action, "_typehint", action.type)
            values = bad_values(name, typehint)
            assert values, (
                f"{command} --{name} ({typehint}): no bad value known; add one or say why in NOT_CHECKED"
            )
            cases += [
                pytest.param(command, name, value, id=f"{command}--{name}-{kind}")
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
    return user


@pytest.mark.parametrize(("command", "name", "value"), flag_cases())
def test_a_bad_value_of_any_flag_is_one_line(command, name, value, home, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["python"])
    main, _, good = COMMANDS[command]
    fill = {"user": home, "bad": home / "bad", "tmp": tmp_path}
    value = value.format(**fill)
    args = [arg.format(**fill) for arg in good] + CONTEXT.get(name, []) + [f"--{name}", value]
    line = run_in_process(main, args, home, capsys)
    assert f"--{name}" in line or value in line, line
