"""A flag that wants a file, handed a folder (`diffusion.data.file_in_folder`): the one file of its kind in it is
taken with a note, several are listed with the flag to pass one with, none are refused naming the command that
writes one; the same rule for every such flag of every command (a folder of several checkpoints given to --ckpt
and --ckpt_path: the `a_folder` cases of the error tables)."""

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.user_errors import run_in_process, train_args

from diffusion.cli import evaluate, export, sample
from diffusion.cli.train import main as train
from diffusion.data.file_in_folder import FileKind, file_in_folder
from diffusion.errors import UserError

ARRAYS = FileKind("NumPy file", ("*.npz", "*.npy"), "np.save writes one")


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_the_one_file_of_its_kind_is_taken_and_named(tmp_path, capsys):
    wanted = touch(tmp_path / "out" / "samples.npz")
    touch(tmp_path / "out" / "grid.png")
    touch(tmp_path / "out" / ".samples.npz.tmp")  # a write in progress: hidden
    touch(tmp_path / "out" / "samples.partial" / "samples.npz")  # a sampling run still writing
    assert file_in_folder(tmp_path / "out", "--samples", ARRAYS) == wanted
    assert capsys.readouterr().err.strip() == (
        f"note: --samples {tmp_path / 'out'} is a folder: using {wanted}, the one NumPy file in it"
    )
    # a command's flag as its readers name it (evaluate's image sets): said as the flag, not as the placeholder
    assert file_in_folder(tmp_path / "out", "{command:--samples}", ARRAYS) == wanted
    assert capsys.readouterr().err.strip() == (
        f"note: --samples {tmp_path / 'out'} is a folder: using {wanted}, the one NumPy file in it"
    )
    assert file_in_folder(wanted, "--samples", ARRAYS) == wanted  # a file: itself, silently
    assert file_in_folder(tmp_path / "nope", "--samples", ARRAYS) == tmp_path / "nope"  # its reader says
    assert capsys.readouterr().err == ""


def test_several_are_listed_and_none_named_with_the_command_that_writes_one(tmp_path):
    for i in range(7):
        touch(tmp_path / "many" / f"run{i}" / "samples.npz")
    with pytest.raises(UserError) as many:
        file_in_folder(tmp_path / "many", "--samples", ARRAYS)
    assert re.fullmatch(
        r"--samples .*many is a folder holding 7 NumPy files \(run0/samples.npz, .*, run4/samples.npz and 2 "
        r"more\) — pass the one you mean as --samples .*run0/samples.npz \(or another of them\)",
        str(many.value),
    )
    touch(tmp_path / "deep" / "a" / "b" / "c" / "d" / "samples.npz")  # deeper than any layout we write
    with pytest.raises(UserError) as none:
        file_in_folder(tmp_path / "deep", "--samples", ARRAYS)
    assert str(none.value) == (
        f"--samples {tmp_path / 'deep'} is a folder, and it holds no NumPy file (*.npz or *.npy) — pass the path of "
        "a NumPy file as --samples; np.save writes one"
    )


def test_sample_and_export_take_the_one_checkpoint_of_a_folder(user, tmp_path, capsys):
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    shutil.copy(good, touch(tmp_path / "kept" / "last.ckpt"))
    written = sample.main(["--ckpt", str(tmp_path / "kept"), "--out", str(tmp_path / "s"), "--num_samples", "2",
                           "--sampler", "ddim", "--steps", "2", "--device", "cpu"])  # fmt: skip
    assert np.load(written)["arr_0"].shape == (2, 8, 8, 1)
    assert f"using {tmp_path / 'kept' / 'last.ckpt'}, the one checkpoint in it" in capsys.readouterr().err
    out = export.main(
        ["--ckpt", str(tmp_path / "kept"), "--format", "safetensors", "--out", str(tmp_path / "e")]
    )
    assert (out / "model.safetensors").is_file()


def test_evaluate_takes_the_samples_file_of_a_sample_commands_folder(user, capsys):
    values = evaluate.main(["--samples", str(user / "samples"), "--reference", str(user / "samples"),
                            "--features", "pixels", "--metrics", "fid"])  # fmt: skip
    assert "fid" in values
    assert capsys.readouterr().err.count("the one NumPy file in it") == 2


FOLDER_CASES = {  # id: (command, flags, what the line must say)
    "sample_ckpt_without_one": (
        sample.main, ["--ckpt", "{user}/samples"],
        r"--ckpt .*samples is a folder, and it holds no checkpoint \(\*.ckpt\) — pass the path of a checkpoint as --ckpt; "
        r"train.py writes them into runs/<name>/version_N/checkpoints/",
    ),
    "evaluate_samples_without_one": (
        evaluate.main, ["--samples", "{user}/grid_only", "--reference", "digits", "--features", "pixels"],
        r"--samples .*grid_only is a folder, and it holds no NumPy file .* python -m diffusion.sample writes "
        r"OUT/samples.npz",
    ),
    "evaluate_reference_of_several": (
        evaluate.main, ["--samples", "{user}/samples/samples.npz", "--reference", "{user}/stats",
                        "--features", "pixels"],
        r"--reference .*stats is a folder holding 4 NumPy files \(of_inception.npz, only_mu.npz",
    ),
    "nll_ckpt_without_one": (
        evaluate.main, ["--nll", "--ckpt", "{user}/images"], r"--ckpt .*images is a folder, and it holds no",
    ),
    "train_init_from_without_one": (
        train, ["--model.init_from", "{user}/samples"], r"--model.init_from .*samples is a folder, and it holds no",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("command", "flags", "expected"), FOLDER_CASES.values(), ids=FOLDER_CASES.keys())
def test_a_folder_without_the_one_file_is_one_line(command, flags, expected, user, tmp_path, capsys):
    flags = [flag.format(user=user) for flag in flags]
    if command is train:
        args = train_args(flags, user, tmp_path / "runs")
    elif command is sample.main:
        args = [*flags, "--out", str(tmp_path / "s")]
    else:
        args = flags
    assert re.search(expected, run_in_process(command, args, user, capsys))
