"""An option given by its old name (train.py's `--model.compile`, now `--model.compile_training`) keeps working, with
a note naming the new one, and is taken as the new one everywhere the run writes or prints its config: the run's
config.yaml held `compile_training: false` beside `compile: true`, and `--config` of that file was refused by the
check of an option under two names (tester round 24a: R1). Given under both names with different values, it is
refused; a config.yaml saved so before is read, its old name taken."""

from pathlib import Path

import pytest
import yaml
from helpers import tiny_run
from helpers.parse_errors import train_line

from diffusion.cli.train import DiffusionCLI, main
from diffusion.cli.train_warnings import CommandNote

NOTE = "model.compile is the old name of model.compile_training, taken as model.compile_training cuda — write that instead"


def test_train_refuses_an_option_under_its_old_and_new_name_with_different_values(
    tmp_path, monkeypatch, capsys
):

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


def test_the_old_name_is_printed_and_saved_as_the_new_one_and_the_runs_config_resumes(tmp_path, capsys):
    with pytest.warns(CommandNote, match=f"^--model.compile cuda: {NOTE}$"), pytest.raises(SystemExit):
        main(["--model.compile", "cuda", "--print_config"])  # "cuda": no compiling on this CPU
    printed = capsys.readouterr().out
    assert {key: yaml.safe_load(printed)["model"][key] for key in ("compile", "compile_training")} == {
        "compile": None,
        "compile_training": "cuda",
    }
    run = tiny_run(tmp_path, "--model.compile", "cuda")
    config = Path(run.trainer.log_dir) / "config.yaml"
    saved = yaml.safe_load(config.read_text())["model"]
    assert (saved["compile"], saved["compile_training"]) == (None, "cuda")
    resumed = main(["--config", str(config), "--ckpt_path", "last", "--max_steps", "6"])
    assert resumed.trainer.global_step == 6 and resumed.model.hparams["compile_training"] == "cuda"


def test_a_config_saved_with_both_names_before_is_read_with_its_old_name_taken(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("config.yaml").write_text(
        "model:\n  compile_training: false\n  compile: cuda\n"
    )  # the default beside it
    with (
        pytest.warns(CommandNote, match=f"^config.yaml: model.compile cuda: {NOTE}$"),
        pytest.raises(SystemExit),
    ):
        main(["--config", "config.yaml", "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out)["model"]["compile_training"] == "cuda"
    Path("config.yaml").write_text(
        "model:\n  compile_training: true\n  compile: cuda\n"
    )  # not the default: refused
    assert train_line(["--config", "config.yaml"], capsys).startswith(
        "config.yaml: model.compile cuda and config.yaml: model.compile_training true set one option"
    )
