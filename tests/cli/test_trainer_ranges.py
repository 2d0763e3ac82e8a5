"""The Trainer's options against each other and against the model's: a minimum the run's maximum would never let
it reach (min_steps > max_steps, min_epochs > max_epochs) is refused in one line naming both, as given (flag or
config file key); validation turned off (limit_val_batches 0) and a warmup longer than the run are legitimate
(a speed test, a short test run) but said once in a warning, since Lightning would drop them without a word."""

import re
import warnings

import pytest
from helpers import TINY_UNET
from helpers.user_errors import in_a_config_file, run_in_process, train_args
from jsonargparse import Namespace

from diffusion.cli.train import DiffusionCLI
from diffusion.cli.train import main as train
from diffusion.cli.trainer_options import check_trainer_option_ranges, validation_off_note, warmup_note

NO_LOGGER = ["--trainer.logger", "false"]
VALIDATING_AT_2 = ["--trainer.val_check_interval", "2"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--trainer.min_steps", "10", "--max_steps", "2"],
         r"^error: --trainer.min_steps 10 is more than --max_steps 2: the run stops at the maximum, so the "
         r"minimum would never be reached — lower the minimum to 2 or less \(or leave it out\), or raise the "
         r"maximum to 10 or more$"),
        (["--trainer.min_epochs", "3", "--max_epochs", "2"],
         r"^error: --trainer.min_epochs 3 is more than --max_epochs 2: the run stops at the maximum"),
    ],
)  # fmt: skip
def test_a_minimum_past_the_maximum_is_refused_naming_both(flags, expected, tmp_path, capsys):
    # Lightning stopped at max_steps 2, exit 0, and min_steps 10 did nothing.
    line = run_in_process(train, train_args(flags, tmp_path, tmp_path / "runs"), tmp_path, capsys)
    assert re.search(expected, line), line


def test_a_minimum_from_a_config_file_is_said_as_its_key(tmp_path, capsys):
    config = in_a_config_file(["--trainer.min_steps", "10"], tmp_path)
    args = train_args([*config, "--max_steps", "2"], tmp_path, tmp_path / "runs")
    line = run_in_process(train, args, tmp_path, capsys)
    assert re.search(r"run\.yaml: trainer\.min_steps 10 is more than --max_steps 2: ", line), line


@pytest.mark.parametrize(
    "trainer",
    [{"min_steps": 4, "max_steps": 4}, {"min_steps": 10, "max_steps": -1}, {"min_steps": None, "max_steps": 2},
     {"min_epochs": 2, "max_epochs": 2}, {"min_epochs": 5, "max_epochs": -1}, {"min_epochs": 5, "max_epochs": None}],
)  # fmt: skip
def test_a_minimum_the_run_can_reach_passes(trainer):
    check_trainer_option_ranges(Namespace(trainer=Namespace(**trainer)))


@pytest.mark.parametrize("value", ["0", "0.0"])
def test_validation_turned_off_is_said_once_in_a_warning(value):
    # No sample grid, no val/loss, no checkpoint at the validation steps, and not a word said.
    with pytest.warns(UserWarning) as caught:
        DiffusionCLI([*TINY_UNET, "--trainer.limit_val_batches", value, *NO_LOGGER])
    notes = [str(w.message) for w in caught if "limit_val_batches" in str(w.message)]
    assert len(notes) == 1, notes
    assert re.match(
        r"--trainer.limit_val_batches 0 turns validation off: this run draws no sample grids "
        r"\(samples/step_\*\.png\), plots no val/loss and saves no checkpoint at validations",
        notes[0],
    )


def test_validation_turned_off_in_a_config_file_is_said_as_its_key(tmp_path):
    config = in_a_config_file(["--trainer.limit_val_batches", "0"], tmp_path)
    with pytest.warns(UserWarning, match=r"run\.yaml: trainer\.limit_val_batches 0 turns validation off"):
        DiffusionCLI([*config, *TINY_UNET, *NO_LOGGER])


@pytest.mark.parametrize("value", [0, 0.0])
def test_only_zero_turns_validation_off(value):
    assert validation_off_note(Namespace(trainer=Namespace(limit_val_batches=value))) is not None
    for other in (None, 1, 0.5, 1.0):
        assert validation_off_note(Namespace(trainer=Namespace(limit_val_batches=other))) is None


def test_a_warmup_longer_than_the_run_is_said_in_a_warning():
    # The learning rate never reached --model.lr: at most 2/5 of it, without a word.
    with pytest.warns(UserWarning) as caught:
        DiffusionCLI([*TINY_UNET, "--model.warmup_steps", "5", "--max_steps", "2", *NO_LOGGER])
    notes = [str(w.message) for w in caught if "warmup_steps" in str(w.message)]
    assert notes == [
        "--model.warmup_steps 5 is more than --max_steps 2: the learning rate is still warming up when the "
        "run ends, and never reaches --model.lr (at most 2/5 of it) — pass --model.warmup_steps 2 or less, unless "
        "this run is a short test or is to be resumed longer"
    ]


def test_a_warmup_the_run_finishes_or_a_run_without_max_steps_says_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        DiffusionCLI(
            [*TINY_UNET, "--model.warmup_steps", "2", "--max_steps", "2", *VALIDATING_AT_2, *NO_LOGGER]
        )
    for model, trainer in [
        ({"warmup_steps": 5000}, {"max_steps": -1}),
        ({"warmup_steps": 0}, {"max_steps": 1}),
    ]:
        assert warmup_note(Namespace(model=Namespace(**model), trainer=Namespace(**trainer))) is None


def test_a_step_checkpoint_interval_past_the_run_is_said(tmp_path):
    # It never fired, and with it set Lightning saved none at validations: last.ckpt alone, silently (round 14a: P7).
    given = [*TINY_UNET, "--max_steps", "2", "--model.warmup_steps", "0", *VALIDATING_AT_2, *NO_LOGGER]
    with pytest.warns(UserWarning) as caught:
        DiffusionCLI([*given, "--checkpoint.every_n_train_steps", "3"])
    assert [str(w.message) for w in caught if "every_n_train_steps" in str(w.message)] == [
        "--checkpoint.every_n_train_steps 3 is more than --max_steps 2: this run reaches no step "
        "checkpoint, and with the interval set it saves none at validations either, so it keeps last.ckpt alone — "
        "pass --checkpoint.every_n_train_steps 2 or less, or leave it out to save at validations"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        DiffusionCLI([*given, "--checkpoint.every_n_train_steps", "2"])


def test_a_default_root_dir_beside_a_logger_is_said_not_to_move_the_run(tmp_path):
    """Round 20a's R1: the run went under the logger's save_dir (runs/) and the folder given stayed unused, silent."""
    root = str(tmp_path / "elsewhere")
    with pytest.warns(UserWarning) as caught:
        DiffusionCLI(
            [
                *TINY_UNET,
                "--max_steps",
                "2",
                "--trainer.default_root_dir",
                root,
                "--trainer.logger.init_args.save_dir",
                str(tmp_path / "runs"),
            ]
        )
    notes = [str(w.message) for w in caught if "default_root_dir" in str(w.message)]
    assert notes == [
        f"--trainer.default_root_dir {root} does not move the run: with a logger, the run folder is under the "
        f"logger's save_dir ({tmp_path / 'runs'}) — pass --trainer.logger.init_args.save_dir {root} to put it there"
    ]
    with warnings.catch_warnings():  # without a logger it is the run folder itself
        warnings.filterwarnings("error", message=".*default_root_dir.*")
        DiffusionCLI(
            [*TINY_UNET, "--max_steps", "2", "--trainer.default_root_dir", root, "--trainer.logger", "false"]
        )


def test_no_images_held_out_is_said_as_validation_turned_off(tmp_path):
    # --data.val_fraction 0 turned validation off (no grids, no loss.png val/loss, no step checkpoints) silently.
    with pytest.warns(UserWarning) as caught:
        DiffusionCLI([*TINY_UNET, "--data.val_fraction", "0", *NO_LOGGER])
    notes = [str(w.message) for w in caught if "turns validation off" in str(w.message)]
    assert len(notes) == 1, notes
    assert notes[0].startswith(
        "--data.val_fraction 0 turns validation off: this run draws no sample grids"
    ), notes
    assert "pass --data.val_fraction 0.05" in notes[0]
    config = in_a_config_file(["--data.val_fraction", "0"], tmp_path)
    with pytest.warns(UserWarning, match=r"run\.yaml: data\.val_fraction 0 turns validation off"):
        DiffusionCLI([*config, *TINY_UNET, *NO_LOGGER])


def test_validation_on_a_share_of_the_training_images_is_no_note():
    data = Namespace(init_args=Namespace(val_fraction=0.0, val_from_train=100))
    assert validation_off_note(Namespace(trainer=Namespace(limit_val_batches=None), data=data)) is None
    data.init_args.val_from_train = None
    assert validation_off_note(Namespace(trainer=Namespace(limit_val_batches=None), data=data)) is not None


@pytest.mark.parametrize("precision", ["64", "64-true"])
def test_double_precision_is_refused_before_a_run_folder_is_made(precision, tmp_path, capsys):
    # It trained into a dtype error in the EMA update ("this is a bug in diffusion") and left a run folder.
    args = train_args(["--precision", precision], tmp_path, tmp_path / "runs")
    line = run_in_process(train, args, tmp_path, capsys)
    assert re.search(
        rf"^error: --precision {precision}: train.py does not train in double precision \(its EMA, sample "
        r"grids and samplers run in float32\) — choose 32 \(32-true\), bf16-mixed or 16-mixed",
        line,
    ), line
    assert not (tmp_path / "runs").exists()


def test_checkpointing_off_is_refused_naming_how_to_keep_fewer(tmp_path, capsys):
    # Lightning refused it blaming "ModelCheckpoint in callbacks list", a callback train.py adds itself.
    args = train_args(["--trainer.enable_checkpointing", "false"], tmp_path, tmp_path / "runs")
    line = run_in_process(train, args, tmp_path, capsys)
    assert re.search(
        r"^error: --trainer.enable_checkpointing false: train.py always keeps last.ckpt, the run's resume point .* — "
        r"leave --trainer.enable_checkpointing out; to keep fewer checkpoints, pass --checkpoint.save_top_k 0 "
        r"\(last.ckpt alone\)$",
        line,
    ), line


def test_save_last_false_is_refused_naming_how_to_keep_fewer(tmp_path, capsys):
    # The run left no last.ckpt without a word, though train.py promises one (J9).
    args = ["--print_config", *train_args(["--checkpoint.save_last", "false"], tmp_path, tmp_path / "runs")]
    line = run_in_process(train, args, tmp_path, capsys)
    assert re.search(
        r"^error: --checkpoint.save_last false: train.py always keeps last.ckpt, the run's resume point .* — "
        r"leave --checkpoint.save_last out; to keep fewer checkpoints, pass --checkpoint.save_top_k 0",
        line,
    ), line


def test_save_top_k_0_keeps_last_ckpt_alone(tmp_path):
    # What the refusal of enable_checkpointing false offers instead.
    train(train_args(["--checkpoint.save_top_k", "0"], tmp_path, tmp_path / "runs"))
    assert [path.name for path in (tmp_path / "runs").rglob("*.ckpt")] == ["last.ckpt"]


def test_a_validation_interval_past_the_run_is_said_in_a_warning(tmp_path):
    # --trainer.val_check_interval 500 with --max_steps 2: no validation, no sample grid, no loss.png, no word.
    flags = [*TINY_UNET, "--max_steps", "2", "--trainer.val_check_interval", "500"]
    with pytest.warns(UserWarning) as caught:
        DiffusionCLI([*flags, *NO_LOGGER])
    notes = [str(w.message) for w in caught if "never validates" in str(w.message)]
    assert notes == [
        "--trainer.val_check_interval 500 is past --max_steps 2: this run never validates, so it draws no "
        "sample grids (samples/step_*.png), plots no val/loss and saves no checkpoint at validations, only "
        "last.ckpt, and as --max_steps 2 is less than the default --trainer.log_every_n_steps 10 (no flag or "
        "config file sets it) it logs no train/loss either, so it writes no loss.png — pass "
        "--trainer.val_check_interval 2 or less to validate at least once "
        "(at the last step)"
    ]
    # What it says is what the run does: no grid and no loss.png; the fix it gives draws both.
    for interval, validated in (("500", False), ("2", True)):
        runs = tmp_path / interval
        train(train_args(["--max_steps", "2", "--trainer.val_check_interval", interval], tmp_path, runs))
        (run,) = runs.glob("*/version_0")
        assert (run / "loss.png").exists() is validated and (run / "samples").exists() is validated


def test_the_interval_counts_batches_and_a_resume_has_its_loss_plot():
    def note(**trainer):
        config = {"max_steps": 2, "val_check_interval": 6, "log_every_n_steps": 10, **trainer}
        return validation_off_note(Namespace(trainer=Namespace(**config)))

    assert note() is not None and note(max_steps=6) is None and note(val_check_interval=0.5) is None
    # Lightning counts the interval in batches: 2 steps of 3 batches validate at the 6th.
    assert note(accumulate_grad_batches=3) is None
    assert "× --trainer.accumulate_grad_batches 2 batches" in note(accumulate_grad_batches=2)
    assert "loss.png" not in note(log_every_n_steps=2)  # train/loss at step 2: loss.png is drawn at the end
    resumed = Namespace(
        trainer=Namespace(max_steps=2, val_check_interval=6, log_every_n_steps=10), ckpt_path="c"
    )
    assert "loss.png" not in validation_off_note(resumed)  # its earlier points are drawn
    # limit_val_batches 0 on a run shorter than the logging interval: no loss.png either, said so
    off = Namespace(trainer=Namespace(limit_val_batches=0, max_steps=2, log_every_n_steps=10))
    assert "so it writes no loss.png" in validation_off_note(off)
