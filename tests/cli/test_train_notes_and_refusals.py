"""train.py's notes and refusals said of its flags: a class's note (an unused --ema.snapshot_every) as one line
`warning: ...` naming the flags as the user gave them, never Python's file:line and source line; the checkpoint's
save triggers given together refused naming both flags; a Lightning refusal of a checkpoint's setting pointing at
the --checkpoint flags; --print_config refusing another run's checkpoints folder as the run does; an option the data
sets (model.class_names, sample_shape, normalization) refused when written, naming the data."""

import sys
from datetime import timedelta
from pathlib import Path

import pytest
from helpers import QUICK, TINY_UNET, warm
from helpers.parse_errors import train_line
from helpers.user_errors import REPO, in_a_config_file, run_in_process, train_args
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from diffusion.cli.train import DiffusionCLI
from diffusion.cli.train import main as train
from diffusion.cli.train_warnings import CommandNote
from diffusion.cli.training_run import refused_by_the_trainer
from diffusion.errors import InvalidValue
from diffusion.training.callbacks import Checkpoint

NO_LOGGER = ["--trainer.logger", "false"]
UNUSED = ["--ema.snapshot_every", "5"]
SAID = (
    "snapshot_every 5 not used: options of the post-hoc EMA, which is off (--ema.post_hoc false) — pass "
    "--ema.post_hoc true to track its profiles and write their snapshots"
)


def notes_of(args: list[str]) -> list[str]:
    with pytest.warns(CommandNote) as caught:
        DiffusionCLI([*args, *NO_LOGGER])
    return [
        str(w.message) for w in caught if issubclass(w.category, CommandNote) and "snapshot" in str(w.message)
    ]


def test_a_class_note_is_said_of_the_flags_as_the_user_gave_them(tmp_path):
    assert notes_of([*TINY_UNET, *UNUSED]) == [f"--ema.{SAID}"]
    config = in_a_config_file(UNUSED, tmp_path)
    assert notes_of([*config, *TINY_UNET]) == [f"{tmp_path / 'run.yaml'}: ema.{SAID}"]


def test_a_note_is_one_line_without_pythons_file_and_source_line(tmp_path):
    result = warm.run(
        [sys.executable, str(REPO / "train.py"), *TINY_UNET, *QUICK, *UNUSED, *NO_LOGGER, "--print_config"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"warning: --ema.{SAID}" in result.stderr.splitlines()
    assert "UserWarning" not in result.stderr and "rank_zero_warn" not in result.stderr


def test_two_save_triggers_are_refused_naming_both(tmp_path, capsys):
    flags = ["--checkpoint.every_n_train_steps", "1", "--checkpoint.train_time_interval", "00:01:00"]
    line = run_in_process(train, train_args(flags, tmp_path, tmp_path / "runs"), tmp_path, capsys)
    assert line == (
        "error: --checkpoint.every_n_train_steps 1 and --checkpoint.train_time_interval 0:01:00 each say when to "
        "save a checkpoint, and only one may — keep one of them"
    )
    with pytest.raises(InvalidValue, match=r"^every_n_train_steps 1 and every_n_epochs 2 each say"):
        Checkpoint(every_n_train_steps=1, every_n_epochs=2)
    Checkpoint(every_n_train_steps=0, every_n_epochs=2, train_time_interval=None)
    Checkpoint(train_time_interval=timedelta(minutes=1))


def test_lightning_refusing_a_checkpoint_setting_points_at_the_checkpoint_flags():
    with pytest.raises(MisconfigurationException) as refused:
        ModelCheckpoint(save_top_k=2, monitor=None)
    assert str(refused_by_the_trainer(refused.value)).endswith(
        "— change the --checkpoint flags it names (see --help)"
    )
    planted = MisconfigurationException("planted")
    assert str(refused_by_the_trainer(planted)) == (
        "the Trainer refused these settings: planted — change the settings it names (see --help)"
    )


def test_print_config_refuses_another_runs_checkpoints_folder_as_the_run_does(tmp_path, capsys):
    checkpoints = tmp_path / "other" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "last.ckpt").write_bytes(b"a checkpoint")
    flags = ["--checkpoint.dirpath", str(checkpoints)]
    refused = (
        f"error: {checkpoints} holds another run's checkpoints (last.ckpt), which this new run would write over — "
        f"resume that run with --ckpt_path {checkpoints / 'last.ckpt'}, or pass a new, empty folder as "
        "--checkpoint.dirpath (or leave it out: the run folder's checkpoints/)"
    )
    for extra in ([], ["--print_config"]):
        args = train_args([*flags, *extra], tmp_path, tmp_path / "runs")
        assert run_in_process(train, args, tmp_path, capsys) == refused
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("key", "value", "what"),
    [
        ("model.class_names", "[a,b]", "the names of its classes"),  # was "argument <lambda>(data) --> ..."
        ("model.class_names", "a", "the names of its classes"),  # was "a is not a valid str"
        (
            "model.sample_shape",
            "[1,8,8]",
            "the shape of one sample",
        ),  # was: must be given via "data.sample_shape"
        ("model.normalization", "x", "the shift and scale"),  # was "x is not a valid dict"
    ],
)
def test_an_option_the_data_sets_is_refused_naming_the_data(key, value, what, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = train_line([f"--{key}", value], capsys)
    assert line.startswith(f"--{key} {value}: the data sets it ({what}") and line.endswith(
        f"— leave --{key} out"
    )
    group, name = key.split(".")
    Path("run.yaml").write_text(f"{group}:\n  {name}: {value}\n")
    assert train_line(["--config", "run.yaml"], capsys).startswith(f"run.yaml: {key} ")
