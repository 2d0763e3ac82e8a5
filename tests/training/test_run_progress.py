"""One progress bar over the whole run (not one per epoch), lines in a log file, and the loss plot."""

import re
from types import SimpleNamespace

import torch
from helpers import QUICK, TINY_UNET, tiny_run

from diffusion.cli.train import main
from diffusion.training.callbacks import run_progress
from diffusion.training.callbacks.run_progress import LossPlot, RunProgressBar

# 1,707 training digits in batches of 512: 3 optimizer steps an epoch, so 8 steps cross two epoch boundaries.
THREE_STEPS_AN_EPOCH = ["--data.init_args.batch_size", "512", "--max_steps", "8", "--trainer.log_every_n_steps", "2",
                        "--trainer.val_check_interval", "4", "--trainer.enable_progress_bar", "true"]  # fmt: skip
OWN_BAR = ["--trainer.callbacks+=diffusion.training.callbacks.run_progress.RunProgressBar"]


def test_the_run_gets_one_bar_and_a_loss_plot_in_place_of_lightnings_bar(tmp_path):
    cli = tiny_run(tmp_path, "--max_steps", "2", "--trainer.enable_progress_bar", "true")
    assert type(cli.trainer.progress_bar_callback) is RunProgressBar
    assert sum(isinstance(c, LossPlot) for c in cli.trainer.callbacks) == 1


def test_a_log_file_gets_a_line_per_interval_counting_steps_across_epochs(tmp_path, capsys):
    tiny_run(tmp_path, *THREE_STEPS_AN_EPOCH, *OWN_BAR, "--trainer.callbacks.line_every_s", "0")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    steps = [int(re.match(r"step (\d+)/8 ", line).group(1)) for line in lines]
    assert steps == [2, 4, 6, 8]  # every logging step (line_every_s 0), one count through epochs 0, 1 and 2
    assert lines[-1].startswith("step 8/8 (100%), ") and "left" in lines[-1] and "train/loss=" in lines[-1]
    assert "val/loss=" in lines[-1]


def test_a_log_file_gets_few_lines_by_default(tmp_path, capsys):
    tiny_run(tmp_path, *THREE_STEPS_AN_EPOCH)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert (
        lines[-1].startswith("step 8/8") and len(lines) <= 2
    )  # 60 s apart, and the last: a short run has 1-2
    assert "Validation" not in out and "Epoch" not in out  # no bar is redrawn into a file


def test_a_terminal_gets_one_bar_over_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(RunProgressBar, "is_terminal", staticmethod(lambda: True))
    tiny_run(tmp_path, *THREE_STEPS_AN_EPOCH)
    bars = [text for text in re.split(r"[\r\n]", capsys.readouterr().out) if text.startswith("Training")]
    assert bars and all("/8 [" in bar for bar in bars)  # the run's total, never an epoch's 3
    assert "8/8 [" in bars[-1] and "train/loss=" in bars[-1]
    assert not any(text.startswith("Epoch") for text in bars)


def counting_renders(monkeypatch) -> list[int]:
    """Count LossPlot's matplotlib renders: each render's number of train/loss points."""
    renders, render = [], LossPlot.render

    def counted(self, path):
        renders.append(len(self.points["train/loss"]))
        render(self, path)

    monkeypatch.setattr(LossPlot, "render", counted)
    return renders


def test_the_loss_plot_covers_a_resumed_run(tmp_path, monkeypatch):
    renders = counting_renders(monkeypatch)
    first = tiny_run(tmp_path, *THREE_STEPS_AN_EPOCH[:-2], "--max_steps", "4")
    folder = tmp_path / "digits" / "version_0"
    plot = next(c for c in first.trainer.callbacks if isinstance(c, LossPlot))
    assert [step for step, _ in plot.points["train/loss"]] == [2, 4]
    assert [step for step, _ in plot.points["val/loss"]] == [4]
    assert (folder / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    checkpoint = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)
    assert any(key.startswith("LossPlot") for key in checkpoint["callbacks"])
    resumed = main([*TINY_UNET, *QUICK, *THREE_STEPS_AN_EPOCH[:-2], "--trainer.logger.init_args.save_dir",
                    str(tmp_path), "--ckpt_path", "last"])  # fmt: skip
    plot = next(c for c in resumed.trainer.callbacks if isinstance(c, LossPlot))
    assert [step for step, _ in plot.points["train/loss"]] == [2, 4, 6, 8]  # the first run's points kept
    assert [step for step, _ in plot.points["val/loss"]] == [4, 8]
    # Each run's last validation is at its last step: one render each, none again when training ends.
    assert renders == [2, 4]


def fake_trainer(folder, step: int, **metrics: float) -> SimpleNamespace:
    """What LossPlot reads of a Trainer, on one process without a logger (the run folder is default_root_dir)."""
    return SimpleNamespace(
        global_step=step, callback_metrics={k: torch.tensor(v) for k, v in metrics.items()}, log_every_n_steps=2,
        should_stop=False, sanity_checking=False, is_global_zero=True, loggers=[], default_root_dir=str(folder),
        strategy=SimpleNamespace(broadcast=lambda value: value),
    )  # fmt: skip


def test_the_loss_plot_is_drawn_again_at_the_end_only_when_a_point_came_after_the_last_validation(
    tmp_path, monkeypatch
):
    renders = counting_renders(monkeypatch)
    plot = LossPlot(redraw_every_s=0)  # at every validation (the default waits a minute: the test below)
    plot.setup(fake_trainer(tmp_path, 0), None, "fit")
    for step in (2, 4):
        plot.on_train_batch_end(fake_trainer(tmp_path, step, **{"train/loss": 1.0 / step}), None)
    plot.on_validation_end(fake_trainer(tmp_path, 4, **{"val/loss": 0.3}), None)
    plot.on_train_end(fake_trainer(tmp_path, 4), None)
    assert renders == [2]  # the validation's plot already shows every point: not drawn twice
    # The plot left is the one a second draw would have made: the same points, the same picture.
    again = LossPlot()
    again.points = {name: list(points) for name, points in plot.points.items()}
    again.render(tmp_path / "again.png")
    assert (tmp_path / "again.png").read_bytes() == (tmp_path / "loss.png").read_bytes()
    # A training point after the last validation (a run ending between validations) is drawn at the end.
    plot.on_train_batch_end(fake_trainer(tmp_path, 6, **{"train/loss": 0.1}), None)
    plot.on_train_end(fake_trainer(tmp_path, 6), None)
    assert renders == [2, 2, 3]  # the validation's, the fresh plot's, and the end's with the new point
    # A plot removed since it was drawn is drawn again, though no point came.
    (tmp_path / "loss.png").unlink()
    plot.on_train_end(fake_trainer(tmp_path, 6), None)
    assert (tmp_path / "loss.png").exists() and renders == [2, 2, 3, 3]
    # So is a plot of another run folder (the same callback fitting again, into a new version folder).
    plot.setup(fake_trainer(tmp_path / "next", 6), None, "fit")
    plot.on_train_end(fake_trainer(tmp_path / "next", 6), None)
    assert (tmp_path / "next" / "loss.png").exists() and renders == [2, 2, 3, 3, 3]


def test_the_loss_plot_is_redrawn_at_a_validation_once_a_minute_has_passed_and_at_the_end(
    tmp_path, monkeypatch
):
    renders = counting_renders(monkeypatch)
    clock = [1000.0]
    monkeypatch.setattr(run_progress, "monotonic", lambda: clock[0])
    plot = LossPlot()
    plot.setup(fake_trainer(tmp_path, 0), None, "fit")
    plot.on_train_start(fake_trainer(tmp_path, 0), None)

    def validate_at(step: int, seconds: float) -> None:  # seconds after training started
        clock[0] = 1000.0 + seconds
        plot.on_train_batch_end(fake_trainer(tmp_path, step, **{"train/loss": 1.0 / step}), None)
        plot.on_validation_end(fake_trainer(tmp_path, step, **{"val/loss": 0.5 / step}), None)

    validate_at(2, 10)
    validate_at(4, 59)
    assert renders == [] and not (tmp_path / "loss.png").exists()  # within a minute of the start
    validate_at(6, 60)
    assert renders == [3]
    validate_at(8, 119)  # 59 s after that drawing
    assert renders == [3]
    plot.on_train_end(fake_trainer(tmp_path, 8), None)  # the end draws what came since
    assert renders == [3, 4] and [step for step, _ in plot.points["val/loss"]] == [2, 4, 6, 8]


def test_the_sample_grid_draws_a_bar_of_its_own_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    grid = ["--max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.enable_progress_bar", "true",
            "--sample_grid.num_samples", "2", "--sample_grid.sampling.sampler", "ddim",
            "--sample_grid.sampling.steps", "3"]  # fmt: skip
    tiny_run(tmp_path / "file", *grid)
    assert "ddim sampling" not in capsys.readouterr().err  # a log file: no bar redrawn into it
    monkeypatch.setattr(RunProgressBar, "is_terminal", staticmethod(lambda: True))
    tiny_run(tmp_path / "terminal", *grid)
    assert re.search(
        r"ddim sampling: +\d+%\|.*\| \d/3 ", capsys.readouterr().err
    )  # a bar over the grid's 3 steps
