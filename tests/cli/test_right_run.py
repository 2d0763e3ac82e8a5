"""`--ckpt_path last` resumes the right run: the newest checkpoint by step of the newest run of this name
(`last-vN.ckpt` included), past an unreadable one with one warning line; never a run with other training
settings (the refusal names them); resuming by path continues that run's version folder; a resumed run keeps
its run's `config.yaml`.

One tiny toy 2-D run (4 steps, checkpoints at steps 2 and 4) is made once and copied into each test.
"""

import hashlib
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers import QUICK, TINY_MLP
from helpers.damage import flip_byte_inside_largest_entry
from helpers.user_errors import error_line

from diffusion.cli.train import main
from diffusion.training.run_folders import newest_checkpoint

REPO = Path(__file__).resolve().parents[2]
BASE = [
    "--config", str(REPO / "configs" / "toy2d.yaml"), *TINY_MLP, *QUICK,
    "--data.init_args.num_samples", "256", "--trainer.logger.init_args.name", "run",
]  # fmt: skip


def train(save_dir: Path, *extra: str):
    return main([*BASE, "--trainer.logger.init_args.save_dir", str(save_dir), *extra])


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    save_dir = tmp_path_factory.mktemp("finished")
    train(save_dir)
    return save_dir


@pytest.fixture
def runs(finished, tmp_path) -> Path:
    """A copy of the finished run's save_dir: runs/run/version_0 (last.ckpt and step=4.ckpt, step 4)."""
    shutil.copytree(finished, tmp_path / "runs")
    return tmp_path / "runs"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fake_checkpoint(path: Path, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step, "state_dict": {}}, path)


def resumed_with_warnings(runs: Path, capsys) -> tuple:
    """The run resumed with `--ckpt_path last` to step 6, and its `warning: --ckpt_path` lines."""
    cli = train(runs, "--ckpt_path", "last", "--max_steps", "6")
    err = capsys.readouterr().err
    return cli, [line for line in err.splitlines() if line.startswith("warning: --ckpt_path")]


def test_the_newest_step_of_the_newest_run_wins_and_unreadable_files_are_passed_over(tmp_path):
    run = tmp_path / "run"
    fake_checkpoint(run / "version_0/checkpoints/last.ckpt", 100)  # an older run, further on
    fake_checkpoint(run / "version_1/checkpoints/step=2.ckpt", 2)
    fake_checkpoint(run / "version_1/checkpoints/last.ckpt", 4)
    fake_checkpoint(run / "version_1/checkpoints/last-v1.ckpt", 6)  # written after a checkpoint flag changed
    (run / "version_1/checkpoints/step=8.ckpt").write_bytes(b"")  # a newer save that broke
    (run / "version_1/checkpoints/.last.ckpt.0a1b2c3d.tmp").write_bytes(b"half")  # a killed save's leftover
    (run / "version_2").mkdir()  # a run killed before its first checkpoint
    (run / "version_2/config.yaml").write_text("model: {lr: 0.003}\n")
    point = newest_checkpoint(tmp_path, "run")
    assert (point.version, point.path.name, point.step) == ("version_1", "last-v1.ckpt", 6)
    assert [(path.name, why) for path, why in point.skipped] == [("step=8.ckpt", "is empty (0 bytes)")]


def test_an_unreadable_newest_checkpoint_is_passed_over_with_one_warning_line(runs, capsys):
    last = runs / "run/version_0/checkpoints/last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # truncated (a copy cut short)
    capsys.readouterr()
    cli, warnings = resumed_with_warnings(runs, capsys)
    assert len(warnings) == 1 and re.search(
        r"last\.ckpt \(is truncated.*resuming from step=4\.ckpt \(step 4\)", warnings[0]
    )
    assert Path(cli.config.ckpt_path).name == "step=4.ckpt" and cli.trainer.global_step == 6


def test_a_damaged_newest_checkpoint_is_passed_over_naming_the_newest_intact_one(runs, capsys):
    last = runs / "run/version_0/checkpoints/last.ckpt"
    flip_byte_inside_largest_entry(last)  # a byte changed inside a tensor: torch.load alone would not notice
    capsys.readouterr()
    cli, warnings = resumed_with_warnings(runs, capsys)
    assert len(warnings) == 1 and re.search(
        r"last\.ckpt \(is damaged: its bytes do not match their checksum.*resuming from step=4\.ckpt \(step 4\)",
        warnings[0],
    )
    assert Path(cli.config.ckpt_path).name == "step=4.ckpt" and cli.trainer.global_step == 6


def test_other_training_settings_are_refused_by_name_and_the_runs_own_config_resumes(runs, capsys):
    """The issue's case: a run of the same name with lr 3e-3 was killed before its first checkpoint
    (version_1 holds only its config.yaml); `last` must not train version_0 (lr 1e-3) on with it."""
    run = runs / "run/version_0"
    killed = runs / "run/version_1"
    killed.mkdir()
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"]["lr"] = 3e-3
    (killed / "config.yaml").write_text(yaml.safe_dump(config))
    before = {path.name: digest(path) for path in run.rglob("*") if path.is_file()}
    with pytest.raises(SystemExit) as exit_info:
        train(
            runs, "--ckpt_path", "last", "--model.lr", "3e-3", "--data.batch_size", "32", "--max_steps", "6"
        )
    assert exit_info.value.code == 2
    # the helper's own --max_steps, then this one: the note of a flag given twice says which is used
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("note: ")]
    assert len(err) == 1 and re.match(
        r"error: --ckpt_path .*version_0/checkpoints/last.ckpt belongs to a run trained with other settings: "
        r"--data.batch_size 256 there, 32 here; --model.lr 0.001 there, 0.003 here — resume it with its own "
        r"config: --config .*version_0/config.yaml",
        err[0],
    ), err
    assert {path.name: digest(path) for path in run.rglob("*") if path.is_file()} == before  # nothing touched
    # Flags that do not change what is trained may differ; the run's own config.yaml always resumes it.
    cli = main(["--config", str(run / "config.yaml"), "--trainer.logger.init_args.save_dir", str(runs),
                "--ckpt_path", "last", "--max_steps", "6", "--trainer.val_check_interval", "3"])  # fmt: skip
    assert cli.trainer.global_step == 6 and Path(cli.trainer.log_dir) == run
    assert digest(run / "config.yaml") == before["config.yaml"]  # the run's config stays what it ran with
    resumed_config = yaml.safe_load((run / "config-resumed-at-step-4.yaml").read_text())
    assert resumed_config["trainer"]["max_steps"] == 6


def test_resuming_by_path_continues_that_runs_version_folder(runs):
    shutil.copytree(runs / "run/version_0", runs / "run/version_1")  # a newer run of the same name
    cli = train(runs, "--ckpt_path", str(runs / "run/version_0/checkpoints/last.ckpt"), "--max_steps", "6")
    assert Path(cli.trainer.log_dir).name == "version_0" and not (runs / "run/version_2").exists()
    assert torch.load(runs / "run/version_0/checkpoints/last.ckpt", weights_only=True)["global_step"] == 6


def test_last_resumes_the_newest_step_after_a_checkpoint_flag_changed(runs):
    """A changed checkpoint setting made Lightning write last-v1.ckpt beside last.ckpt, and `last` took the older
    one: now last.ckpt is overwritten (no version counter), and last-vN, when a user turns the counter on, is
    found by its step."""
    train(runs, "--ckpt_path", "last", "--max_steps", "6", "--checkpoint.every_n_train_steps", "3")
    folder = runs / "run/version_0/checkpoints"
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 6
    assert not list(folder.glob("last-v*.ckpt"))
    counted = ["--checkpoint.enable_version_counter", "true", "--checkpoint.every_n_train_steps", "2"]
    train(runs, "--ckpt_path", "last", "--max_steps", "8", *counted)
    assert torch.load(folder / "last-v1.ckpt", weights_only=True)["global_step"] == 8
    cli = train(runs, "--ckpt_path", "last", "--max_steps", "10")
    assert Path(cli.config.ckpt_path).name == "last-v1.ckpt" and cli.trainer.global_step == 10


def broken_last(runs: Path, keep_others: bool) -> Path:
    """The run's last.ckpt made a link to a file that was moved away (and its other checkpoints removed, unless
    `keep_others`)."""
    folder = runs / "run/version_0/checkpoints"
    for path in folder.glob("*.ckpt"):
        if path.name == "last.ckpt" or not keep_others:
            path.unlink()
    (folder / "last.ckpt").symlink_to(runs / "moved" / "last.ckpt")
    return folder / "last.ckpt"


@pytest.mark.parametrize("given", ["last", "path"])
def test_a_broken_last_link_is_named_not_said_as_no_checkpoint(given, runs, capsys):
    """`--ckpt_path last` said "no checkpoint under runs/run/*/checkpoints/ — train first", and a path "no
    checkpoint at": the link and where it points are named."""
    link = broken_last(runs, keep_others=False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        train(runs, "--ckpt_path", "last" if given == "last" else str(link), "--max_steps", "6")
    line = error_line(capsys.readouterr().err)
    assert exited.value.code == 2
    said = "--ckpt_path last: " if given == "last" else "--ckpt_path "
    assert line == (
        f"error: {said}{link} is a broken link (to {runs / 'moved' / 'last.ckpt'}, which does not exist) — restore "
        "the checkpoint it points to, point the link at one that exists, or pass the path of a checkpoint"
    ), line


def test_a_broken_last_link_beside_an_intact_checkpoint_is_passed_over_with_one_warning_line(runs, capsys):
    broken_last(runs, keep_others=True)
    capsys.readouterr()
    cli, warnings = resumed_with_warnings(runs, capsys)
    assert len(warnings) == 1 and re.search(
        r"passed over broken links .*last\.ckpt \(to .*moved/last\.ckpt\); resuming from .*step=4\.ckpt",
        warnings[0],
    ), warnings
    assert Path(cli.config.ckpt_path).name == "step=4.ckpt" and cli.trainer.global_step == 6


def test_a_logger_name_or_version_a_resume_by_path_does_not_use_is_said(runs, capsys):
    """--trainer.logger.init_args.name (or version) with --ckpt_path PATH: the resume goes on in the checkpoint's
    run folder, and the name, given to keep that run as it was, went unused without a word."""
    checkpoint = str(runs / "run/version_0/checkpoints/last.ckpt")
    other = ["--trainer.logger.init_args.name", "other", "--trainer.logger.init_args.version", "5"]
    train(runs, "--ckpt_path", checkpoint, "--max_steps", "6", *other)
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warned == [
        "warning: --trainer.logger.init_args.name other and --trainer.logger.init_args.version 5 are not used: the "
        f"resumed run goes on writing into its checkpoint's run folder, {runs / 'run/version_0'} — to leave that "
        f"run as it is, start a new one from its weights with --model.init_from {checkpoint} in place of --ckpt_path"
    ]
    assert not (runs / "other").exists()
    # The run's own name and version (or none written) say nothing.
    for same in ([], ["--trainer.logger.init_args.version", "0"]):
        with pytest.raises(SystemExit):
            train(runs, "--ckpt_path", checkpoint, "--max_steps", "8", *same, "--print_config")
        assert "warning:" not in capsys.readouterr().err
