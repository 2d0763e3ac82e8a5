"""A data module's check of an option said where the user wrote it (a flag, or a config file's key), a --seed's
fix of what the seed picks in that command, and a library module of diffusion/cli run with -m refused in one line
(tester round 16a: E1-E3); a range check of a network said of its flag from the check's fields."""

import runpy
import subprocess
import sys

import pytest
from helpers.parse_errors import train_line
from torch import nn

from diffusion.cli import evaluate, prepare
from diffusion.cli.train_checks import naming_the_flag
from diffusion.errors import OutOfRange

NOT_DIGITS = "does not fit dataset 'digits', whose images have 1 channel — leave the channels unset"


def prepare_line(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        prepare.main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1].removeprefix("error: ")


def test_prepare_says_a_channel_count_that_does_not_fit_as_the_flag_or_the_files_key(tmp_path, capsys):
    out = ["--out", str(tmp_path / "out")]
    line = prepare_line(["--data.dataset", "digits", "--data.channels", "3", *out], capsys)
    assert line.startswith(f"--data.channels 3 {NOT_DIGITS}"), line
    (tmp_path / "data.yaml").write_text("dataset: digits\nchannels: 3\n")
    line = prepare_line(["--data", str(tmp_path / "data.yaml"), *out], capsys)
    assert line.startswith(f"{tmp_path / 'data.yaml'}: data.channels 3 {NOT_DIGITS}"), line
    assert "--data.channels" not in line, line


def test_train_says_a_channel_count_that_does_not_fit_as_the_flag_or_the_files_key(tmp_path, capsys):
    line = train_line(["--data.dataset", "digits", "--data.channels", "3"], capsys)
    assert line.startswith(f"--data.channels 3 {NOT_DIGITS}"), line
    (tmp_path / "run.yaml").write_text("data:\n  init_args:\n    dataset: digits\n    channels: 3\n")
    line = train_line(["--config", str(tmp_path / "run.yaml")], capsys)
    assert line.startswith(f"{tmp_path / 'run.yaml'}: data.channels 3 {NOT_DIGITS}"), line


def test_a_validation_count_of_a_file_is_said_as_its_key(tmp_path, capsys):
    (tmp_path / "data.yaml").write_text("dataset: digits\nval_from_train: 5000\nval_fraction: 0\n")
    line = prepare_line(["--data", str(tmp_path / "data.yaml"), "--out", str(tmp_path / "out")], capsys)
    assert line.startswith(f"{tmp_path / 'data.yaml'}: data.val_from_train 5000 is more than the 1797"), line
    line = prepare_line(["--data.val_from_train", "5", "--out", str(tmp_path / "out")], capsys)
    assert line.startswith("--data.val_from_train 5 validates on training samples and holds nothing out, yet "
                           "--data.val_fraction 0.05 (its default) holds some out"), line  # fmt: skip
    line = prepare_line(["--data.val_from_train", "5", "--data.val_fraction", "0.1", "--out", str(tmp_path / "o")],
                        capsys)  # fmt: skip
    assert "yet --data.val_fraction 0.1 holds some out" in line, line


@pytest.mark.parametrize(
    ("mode", "picks"),
    [
        ([], "it picks the reference subset and KID's subsets"),
        (["--nll"], "the noise of every term is a function"),
    ],
)
def test_evaluates_seed_out_of_range_says_what_evaluates_seed_picks(mode, picks, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        evaluate.main([*mode, "--seed", "-1", "--samples" if not mode else "--ckpt", str(tmp_path / "nope")])
    assert exited.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: --seed -1 is out of range"), line
    assert line.endswith(
        f"pass a seed from 0 to 18446744073709551615: {picks}" + ("" if not mode else " of it")
    ), line
    assert "sample i's noise" not in line


# Parts of the commands whose names read like commands: run with -m, each says the command to run instead.
LIBRARY = ["evaluate_nll", "evaluate_quality", "to_diffusers", "train"]


@pytest.mark.filterwarnings(
    "ignore:.*found in sys.modules:RuntimeWarning"
)  # runpy's, of a module imported before
@pytest.mark.parametrize("name", LIBRARY)
def test_a_library_module_run_with_dash_m_is_refused_in_one_line(name, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [f"diffusion/cli/{name}.py", "--out", "somewhere"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module(f"diffusion.cli.{name}", run_name="__main__", alter_sys=True)
    assert exited.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: diffusion.cli.{name} is a library module, not a command — "), line
    assert "\n" not in line


def test_to_diffusers_run_with_dash_m_names_the_export_command(tmp_path):
    argv = [
        sys.executable,
        "-m",
        "diffusion.cli.to_diffusers",
        "--ckpt",
        "x.ckpt",
        "--out",
        str(tmp_path / "d"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "error: diffusion.cli.to_diffusers is a library module, not a command — export a diffusers folder with "
        "python -m diffusion.export --ckpt CKPT --format diffusers --out DIR"
    )
    assert not (tmp_path / "d").exists()


def test_a_range_check_is_said_of_its_flag_from_its_fields_and_owner_not_its_words():
    class Network(nn.Module):
        pass

    class Part(nn.Module):
        pass

    built = {Network: "model.network"}
    # Words no pattern would read, wrapped as jsonargparse wraps a class's error in a union of types.
    check = OutOfRange("width", [3, 0], "a list; of powers of two, got it?", "pass [64, 128]", owner=Network)
    wrapped = ValueError("Does not validate against any of the Union subtypes")
    wrapped.__cause__ = check
    named = naming_the_flag(wrapped, built)
    assert str(named) == (
        "--model.network.width [3, 0] is out of range (must be a list; of powers of two, got it?) — pass [64, 128]"
    )
    # A check of one of the network's parts, or of no class, is no flag of the user's: left as it is.
    assert naming_the_flag(OutOfRange("width", 0, ">= 1", owner=Part), built) is None
    assert naming_the_flag(OutOfRange("width", 0, ">= 1"), built) is None
    assert naming_the_flag(ValueError("width must be >= 1, got 0"), built) is None
