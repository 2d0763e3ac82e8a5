"""train.py's options that do nothing in the combination given, said in its flags: an option of the logger with
the logger turned off (refused where the parser cannot take it, noted where the run goes on without it), a
`logger: false` in a config file taken, --checkpoint.save_top_k above 1 without a monitor refused naming the fix,
and a note's default value said as the default, not as a flag the user never gave."""

import warnings

import pytest
from helpers import TINY_UNET
from helpers.parse_errors import train_line

from diffusion.cli.train import DiffusionCLI
from diffusion.cli.train_warnings import CommandNote
from diffusion.cli.training_run import DEFAULT_CONFIG

NAME = ["--trainer.logger.init_args.name", "foo"]
OFF = ["--trainer.logger", "false"]
NAME_UNUSED = (
    "--trainer.logger.init_args.name foo sets an option of the logger, and --trainer.logger false turns it off — "
    "drop one of them"
)


def notes(args: list[str]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DiffusionCLI(args)
    return [str(w.message) for w in caught if issubclass(w.category, CommandNote)]


@pytest.mark.usefixtures("in_a_folder_with_either_words")
def test_an_option_of_the_logger_after_the_logger_turned_off_is_refused_in_its_flags(capsys, tmp_path):
    assert train_line([*OFF, *NAME], capsys, logger=None) == NAME_UNUSED
    null = train_line(["--trainer.logger", "null", "--trainer.logger.name", "foo"], capsys, logger=None)
    assert null == NAME_UNUSED.replace("init_args.", "").replace("false", "null")
    (tmp_path / "off.yaml").write_text("trainer:\n  logger: false\n")
    (tmp_path / "name.yaml").write_text("trainer:\n  logger:\n    init_args: {name: foo}\n")
    assert train_line(["--config", "off.yaml", *NAME], capsys, logger=None) == NAME_UNUSED.replace(
        "--trainer.logger false", "off.yaml: trainer.logger false"
    )
    assert train_line(["--config", "off.yaml", "--config", "name.yaml"], capsys, logger=None) == (
        "name.yaml: trainer.logger.init_args.name foo sets an option of the logger, and off.yaml: trainer.logger "
        "false turns it off — drop one of them"
    )


def test_an_option_of_the_logger_before_the_logger_turned_off_is_noted_in_the_same_words(tmp_path):
    assert NAME_UNUSED in notes([*TINY_UNET, *NAME, *OFF])
    # The default recipe's logger name under --trainer.logger false: the user wrote no option of the logger
    assert not [
        note for note in notes(["--config", str(DEFAULT_CONFIG), *TINY_UNET, *OFF]) if "logger" in note
    ]


def test_a_logger_turned_off_in_a_config_file_is_taken(tmp_path):
    (tmp_path / "off.yaml").write_text(
        "trainer:\n  logger: false\n"
    )  # was: "a group of options, not one value"
    cli = DiffusionCLI(["--config", str(tmp_path / "off.yaml"), *TINY_UNET])
    assert cli.config.trainer.logger is False and not cli.trainer.loggers


def test_a_checkpoint_kept_by_rank_without_a_monitor_is_refused_naming_the_flags(capsys, tmp_path):
    fix = (
        "add --checkpoint.monitor val/loss (the validation loss, lowest best), or pass --checkpoint.save_top_k -1 "
        "to keep every checkpoint (1: the newest)"
    )
    assert train_line(["--checkpoint.save_top_k", "3"], capsys) == (
        "--checkpoint.save_top_k 3 keeps the best 3 checkpoints by a monitored value, and no --checkpoint.monitor "
        f"is given — {fix}"
    )
    (tmp_path / "run.yaml").write_text("checkpoint:\n  save_top_k: 2\n")
    assert train_line(["--config", str(tmp_path / "run.yaml")], capsys).startswith(
        f"{tmp_path / 'run.yaml'}: checkpoint.save_top_k 2 keeps the best 2 checkpoints"
    )
    monitored = DiffusionCLI(
        [*TINY_UNET, "--checkpoint.save_top_k", "3", "--checkpoint.monitor", "val/loss", *OFF]
    )
    assert monitored.config.checkpoint.save_top_k == 3


def test_a_default_value_in_a_note_is_said_as_the_default(tmp_path):
    """A --config replaces the default recipe: its warmup (200) is not read, and the code's 5000 is no flag."""
    (tmp_path / "run.yaml").write_text("trainer:\n  max_steps: 2\n  val_check_interval: 2\n")
    config = ["--config", str(tmp_path / "run.yaml"), *TINY_UNET, *OFF]
    warmup = [note for note in notes(config) if "warming up" in note]
    assert warmup and warmup[0].startswith(
        "the default --model.warmup_steps 5000 (no flag or config file sets it) is more than "
        f"{tmp_path / 'run.yaml'}: trainer.max_steps 2: "
    )
    given = [note for note in notes([*config, "--model.warmup_steps", "5000"]) if "warming up" in note]
    assert given and given[0].startswith("--model.warmup_steps 5000 is more than")
    (tmp_path / "short.yaml").write_text("trainer:\n  max_steps: 2\n")
    interval = [
        note for note in notes(["--config", str(tmp_path / "short.yaml"), *TINY_UNET, *OFF]) if "past" in note
    ]
    assert interval and interval[0].startswith(
        "the default --trainer.val_check_interval 5000 (no flag or config file sets it) is past "
    )
