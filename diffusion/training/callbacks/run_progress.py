"""How a run shows where it is: one progress bar over the whole run, and a plot of its losses in the run folder.

Lightning's own bar starts again at every epoch (26 steps on the digits), so a 2,400-step run shows no time
left, and it redraws after every batch. `RunProgressBar` counts optimizer steps up to `max_steps` across
epochs and resumes, with the rate, the time left and the loss, redrawn at most every `refresh_s` seconds; in a
log file (output that is not a terminal) it writes a line now and then instead of redrawing a bar. `LossPlot`
draws `train/loss` and `val/loss` against the step into `<run folder>/loss.png` at validations (at most once a
minute) and at the end, whatever the logger (TensorBoard is not the only way to look).
"""

import math
import sys
from collections.abc import Callable
from pathlib import Path
from time import monotonic
from typing import Any

import lightning as L
import matplotlib
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from matplotlib.ticker import LogFormatter

from diffusion.training.atomic_writes import write_atomically
from diffusion.training.logging_steps import is_logging_step
from diffusion.training.run_folders import run_folder

matplotlib.use("Agg")  # files only: no display is needed, and none is opened

TRAIN_LOSS, VAL_LOSS = "train/loss", "val/loss"  # as diffusion.training.module logs them


class RunProgressBar(TQDMProgressBar):
    """One bar for the run: optimizer step of `max_steps`, steps/s, time left and the metrics of the bar
    (`train/loss` at logging steps). Validation keeps a bar of its own.

    Args:
        refresh_s: redraw the bar at most this often (a redraw per step costs the host time a GPU step needs).
        line_every_s: when the output is not a terminal, write one line at most this often (and at the end).
    """

    def __init__(self, refresh_s: float = 0.5, line_every_s: float = 60.0, process_position: int = 0) -> None:
        super().__init__(refresh_rate=1, process_position=process_position)
        self.refresh_s, self.line_every_s = refresh_s, line_every_s
        self._total: int | None = None
        self._last_draw = 0.0
        self._started = (0.0, 0)  # (time, step) when this fit started training: rate and time left since then

    @staticmethod
    def is_terminal() -> bool:
        return sys.stdout.isatty()

    def run_total(self, trainer: L.Trainer) -> int | None:
        """The run's last optimizer step: max_steps, else what max_epochs amounts to (None when unknown)."""
        if trainer.max_steps and trainer.max_steps > 0:
            return trainer.max_steps
        total = trainer.estimated_stepping_batches
        return None if math.isinf(total) else int(total)

    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(
            desc="Training", total=self._total, initial=self.trainer.global_step, unit="step",
            position=2 * self.process_position, disable=self.is_disabled or not self.is_terminal(),
            leave=True, dynamic_ncols=True, file=sys.stdout, smoothing=0.1, bar_format=self.BAR_FORMAT,
        )  # fmt: skip

    def init_sanity_tqdm(self) -> Tqdm:
        return self._terminal_only(super().init_sanity_tqdm)

    def init_validation_tqdm(self) -> Tqdm:
        return self._terminal_only(super().init_validation_tqdm)

    def _terminal_only(self, make_bar: Callable[[], Tqdm]) -> Tqdm:
        """Lightning's bar, made disabled when the output is a log file (tqdm draws as it is made)."""
        if self.is_terminal():
            return make_bar()
        enabled, self._enabled = self._enabled, False
        try:
            return make_bar()
        finally:
            self._enabled = enabled

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._total = self.run_total(trainer)
        self._started = (monotonic(), trainer.global_step)
        self._last_draw = monotonic()
        super().on_train_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        pass  # one bar for the run: nothing starts again at an epoch

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        now, step = monotonic(), trainer.global_step
        last = step == self._total
        if self.is_terminal():
            if now - self._last_draw >= self.refresh_s or last:
                self.train_progress_bar.n = step
                self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
                self.train_progress_bar.refresh()
                self._last_draw = now
        elif not self.is_disabled and (last or (
            is_logging_step(trainer, step) and now - self._last_draw >= self.line_every_s
        )):  # fmt: skip
            print(self.progress_line(trainer, pl_module, now), flush=True)
            self._last_draw = now

    def progress_line(self, trainer: L.Trainer, pl_module: L.LightningModule, now: float) -> str:
        """'step 600/2400 (25%), 3.1 steps/s, 9:41 left, train/loss=0.0312': a log file's progress."""
        step, total = trainer.global_step, self._total
        start_time, start_step = self._started
        rate = (step - start_step) / max(now - start_time, 1e-9)
        parts = [f"step {step}/{total} ({100 * step / total:.0f}%)" if total else f"step {step}",
                 f"{rate:.2f} steps/s"]  # fmt: skip
        if total and rate > 0:
            parts.append(f"{Tqdm.format_interval((total - step) / rate)} left")
        metrics = {k: v for k, v in self.get_metrics(trainer, pl_module).items() if k != "v_num"}
        parts += [f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
                  for key, value in metrics.items()]  # fmt: skip
        return ", ".join(parts)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # the bar goes on into the next epoch

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.is_terminal():
            self.train_progress_bar.n = trainer.global_step
            self.train_progress_bar.refresh()
        self.train_progress_bar.close()


def shows_progress(trainer: L.Trainer) -> bool:
    """Whether long validation work (the sample grid, FID's samples) draws bars of its own: on rank zero, while
    the run's progress bar is on and draws to a terminal (a log file gets none)."""
    bar = trainer.progress_bar_callback
    if not trainer.is_global_zero or bar is None or not bar.is_enabled:  # type: ignore[attr-defined]  # every bar Lightning makes has it
        return False
    return RunProgressBar.is_terminal() if isinstance(bar, RunProgressBar) else sys.stderr.isatty()


class PlainLogLabels(LogFormatter):
    """The ticks matplotlib's log axis labels (its choice of minor ticks included), written as plain numbers."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


class LossPlot(L.Callback):
    """`<run folder>/loss.png`: train/loss (at logging steps) and val/loss (at validations) against the optimizer
    step, redrawn at a validation once `redraw_every_s` seconds have passed since it was last drawn (or since
    training started), and when training ends (then only if a point came after the last drawing). A render is
    0.1-0.2 s of matplotlib while the run waits: a run validating every few seconds would otherwise spend a
    share of its time drawing. The points are kept in checkpoints, so a resumed run's plot covers the whole run.
    """

    FILENAME = "loss.png"

    def __init__(self, redraw_every_s: float = 60.0) -> None:
        self.redraw_every_s = redraw_every_s
        self.points: dict[str, list[tuple[int, float]]] = {TRAIN_LOSS: [], VAL_LOSS: []}
        self._folder: Path | None = None
        self._drawn: tuple[Path, dict[str, list[tuple[int, float]]]] | None = None  # file and points drawn
        self._drawn_at = -math.inf  # when it was last drawn, or training started (monotonic seconds)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._folder = run_folder(trainer)  # a collective under DDP: on every rank

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._drawn_at = monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        step = trainer.global_step
        train = self.points[TRAIN_LOSS]
        if is_logging_step(trainer, step) and (not train or train[-1][0] != step):
            value = trainer.callback_metrics.get(
                TRAIN_LOSS
            )  # a host tensor: logged at this step, nothing to sync
            if value is not None and value.device.type == "cpu":
                train.append((step, float(value)))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(VAL_LOSS)
        if value is not None:
            self.points[VAL_LOSS].append((trainer.global_step, float(value)))
        if monotonic() - self._drawn_at >= self.redraw_every_s:
            self.draw(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.draw(trainer)

    def draw(self, trainer: L.Trainer) -> None:
        """Redraw loss.png, unless it already shows these points: a run whose last validation is at its last
        step would otherwise draw the same plot twice (0.1-0.2 s of matplotlib on a CPU)."""
        if not trainer.is_global_zero or self._folder is None or not any(self.points.values()):
            return
        path = self._folder / self.FILENAME
        if self._drawn == (path, self.points) and path.exists():
            return
        self.render(path)
        self._drawn = (path, {name: list(points) for name, points in self.points.items()})
        self._drawn_at = monotonic()

    def render(self, path: Path) -> None:
        """Plot the points into `path` (atomically: a reader never sees half a file)."""
        from matplotlib.figure import Figure

        # Fixed margins that hold the log axis' labels: a layout engine measuring every label's text took half of
        # the render (0.26 -> 0.13 s on a 2-core EPYC) while the run waits.
        figure = Figure(figsize=(6, 3.6), dpi=100)
        figure.subplots_adjust(left=0.15, right=0.97, bottom=0.14, top=0.96)
        axes = figure.subplots()
        for name, style in ((TRAIN_LOSS, "-"), (VAL_LOSS, "o-")):
            if self.points[name]:
                steps, values = zip(*self.points[name], strict=True)
                axes.plot(steps, values, style, label=name, markersize=3, linewidth=1)
        axes.set(xlabel="optimizer step", ylabel="loss", yscale="log")
        # Plain numbers on the log axis (0.05, 0.1): matplotlib's default labels (5x10^-2) are math text, whose
        # parser took 40% of a render.
        axes.yaxis.set_major_formatter(PlainLogLabels(labelOnlyBase=False))
        axes.yaxis.set_minor_formatter(PlainLogLabels(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
        axes.grid(alpha=0.3, which="both")
        axes.legend()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda into: figure.savefig(into, format="png"))

    def state_dict(self) -> dict[str, Any]:
        return {"points": {name: [list(point) for point in points] for name, points in self.points.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("points", {})
        self.points = {name: [(int(s), float(v)) for s, v in saved.get(name, [])] for name in self.points}
