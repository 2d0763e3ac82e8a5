"""The fit of a training run, once train.py's CLI has built its classes: the run folder it trains in (held by one
job at a time), the config saved there, the callbacks train.py adds (one progress bar over the run, the loss
plot, the learning rate logged), and what an error during the fit means (a rank lost, a full disk, a setting the
Trainer refused, a preemption): said as the user's, or passed on as a bug.
"""

import contextlib
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from jsonargparse import Namespace
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from diffusion.cli.command_line import remembered_written
from diffusion.cli.flags import check_fsspec_protocol, check_path_given, url_given
from diffusion.errors import DiskFull, UserError, is_disk_full
from diffusion.training.atomic_writes import RUN_ON_ANOTHER_DISK, write_atomically
from diffusion.training.callbacks import EMA, Checkpoint, SampleGrid
from diffusion.training.callbacks.heartbeat import Heartbeat
from diffusion.training.callbacks.preemption import Preempted
from diffusion.training.callbacks.run_progress import LossPlot, RunProgressBar
from diffusion.training.run_folders import (
    CHECKPOINTS,
    checkpoint_files,
    new_run_folders,
    remove_unused_run_folders,
    run_folder,
    training_in,
)

# The default recipe: what train.py reads when no --config is given.
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "digits.yaml"


def with_default_config(args: list[str]) -> list[str]:
    """No --config given: train the default recipe, configs/digits.yaml, or stop if it is not there.

    Without it (the package installed without the project's configs/ folder) the code defaults would train a
    different, far longer model than the README promises.
    """
    if any(arg in ("-h", "--help", "--config") or arg.startswith("--config=") for arg in args):
        return args
    if not DEFAULT_CONFIG.is_file():
        raise UserError(
            f"no --config given and the default recipe {DEFAULT_CONFIG} is missing (this copy of the package "
            "came without the project's configs/ folder)",
            "pass --config PATH/TO/configs/digits.yaml (from the project's source) or another recipe",
        )
    return ["--config", str(DEFAULT_CONFIG), *args]


class BuiltRun(Protocol):
    """What `fit` reads of train.py's CLI once it has built its classes (that CLI imports this module)."""

    @property
    def trainer(self) -> Trainer: ...
    @property
    def model(self) -> LightningModule: ...
    @property
    def datamodule(self) -> LightningDataModule: ...
    @property
    def config(self) -> Namespace: ...
    @property
    def heartbeat(self) -> Heartbeat: ...


class SaveConfigToRunFolder(SaveConfigCallback):
    """Saves the config into the run's folder whatever the logger. Lightning saves it into `trainer.log_dir`, which for
    W&B and other loggers is their save_dir, shared by every run. `ckpt_path`: the value saved for --ckpt_path
    (`auto` as written, where the config holds the checkpoint it resolved to)."""

    def __init__(self, *args: Any, ckpt_path: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ckpt_path = ckpt_path

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._folder = run_folder(trainer)  # a collective under DDP: here, on every rank
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:  # on rank 0
        self._folder.mkdir(parents=True, exist_ok=True)
        path = str(self._folder / self.config_filename)
        config = self.config.clone()
        config.ckpt_path = self.ckpt_path or config.ckpt_path
        write_atomically(
            path,
            lambda into: self.parser.save(
                config, str(into), skip_none=False, overwrite=self.overwrite, multifile=self.multifile
            ),
        )


def refused_by_the_trainer(error: MisconfigurationException) -> UserError:
    """Lightning refused settings of the user's, in its own words, quoted: a ModelCheckpoint's (raised in one of
    its methods) are train.py's --checkpoint flags; any other's, the Trainer's or a callback's, are named as it
    names them."""
    frames = traceback.walk_tb(error.__traceback__)
    of_checkpoint = any(isinstance(frame.f_locals.get("self"), ModelCheckpoint) for frame, _ in frames)
    whose = "the --checkpoint flags" if of_checkpoint else "the settings"
    return UserError(f"the Trainer refused these settings: {error}", f"change {whose} it names (see --help)")


def callbacks_of(trainer: Trainer) -> list[Callback]:
    """The Trainer's callbacks, a list Lightning sets at run time (the class declares no attribute to type)."""
    return cast(Any, trainer).callbacks


def log_learning_rate(trainer: Trainer) -> None:
    """The learning rate (warmup, then the schedule) logged as train/lr beside train/loss, at the logging steps:
    Lightning's LearningRateMonitor reads the optimizer's rate, a host number, only when the loggers write
    (unless the user chose a monitor of their own; a run without a logger has nowhere to log it)."""
    if trainer.loggers and not any(isinstance(c, LearningRateMonitor) for c in callbacks_of(trainer)):
        callbacks_of(trainer).append(LearningRateMonitor(logging_interval="step"))


def use_run_progress(trainer: Trainer, keep_bar: bool) -> None:
    """One progress bar over the run in place of Lightning's default bar per epoch (unless the user chose a
    bar: `keep_bar`), and the loss plot in the run folder."""
    callbacks = callbacks_of(trainer)
    for index, callback in enumerate(callbacks):
        if type(callback) is TQDMProgressBar and not keep_bar:
            callbacks[index] = RunProgressBar()
    # Before the checkpoint callbacks (Lightning puts them last): a checkpoint saved at a validation then
    # holds that validation's loss.
    first_checkpoint = next(
        (i for i, c in enumerate(callbacks) if isinstance(c, ModelCheckpoint)), len(callbacks)
    )
    callbacks.insert(first_checkpoint, LossPlot())


def note_run_options_unused(
    given: dict[str, Any], theirs: dict[str, Any], run: Path, checkpoint: str
) -> None:
    """A resume's logger options (save_dir, name, version: `given`, their run's values `theirs`) the user wrote
    naming another run than the checkpoint's: the resumed run goes on in that run's folder, `run`, and they would
    go unused without a word."""
    unused = []
    for key, value in given.items():
        shown = _written_last(f"trainer.logger.init_args.{key}")
        if shown is None or value is None:
            continue
        folder = f"version_{value}" if isinstance(value, int) else str(value)  # a version as loggers name it
        if (Path(folder).absolute() if isinstance(theirs[key], Path) else folder) != theirs[key]:
            unused.append(shown)
    if unused and rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # Lightning sets the rank on it
        stated = f"{' and '.join(unused)} {'is' if len(unused) == 1 else 'are'}"
        print(
            f"warning: {stated} not used: "
            f"the resumed run goes on writing into its checkpoint's run folder, {run} — "
            "to leave that run as it is, start a new one from its weights with "
            f"--model.init_from {checkpoint} in place of --ckpt_path",
            file=sys.stderr, flush=True,
        )  # fmt: skip


def _written_last(key: str) -> str | None:
    """The option `key` as the running command line gave it last (`--k v`, `run.yaml: k v`), None if unwritten
    (or given by the default recipe, which train.py reads when no --config is given)."""
    found = [item for item in remembered_written() if item.key == key]
    if not found or (found[-1].file and Path(found[-1].file).resolve() == DEFAULT_CONFIG):
        return None
    return found[-1].shown()


@dataclass(frozen=True)
class ResumeChosen:
    """The checkpoint `--ckpt_path last` / `auto` chose (`asked`), as it was when read, and when (`at_ns`)."""

    asked: str
    path: Path
    mtime_ns: int
    size: int
    at_ns: int


def chosen_resume(asked: str | None, path: str | None) -> ResumeChosen | None:
    """What `--ckpt_path last` / `auto` chose (None for a path given, or a new run), to hold the run to it once its
    folder is locked (`check_resume_still_newest`)."""
    if asked not in ("last", "auto") or not path:
        return None
    at_ns, stat = time.time_ns(), Path(path).stat()
    return ResumeChosen(asked, Path(path), stat.st_mtime_ns, stat.st_size, at_ns)


def check_resume_still_newest(chosen: ResumeChosen | None) -> None:
    """Refuse a resume whose checkpoint another job replaced, or wrote a newer one beside, between this job's choice
    and its lock of the run folder (rank 0, `fit`): a job stopped by Ctrl+C saves as it ends, and a second job
    started meanwhile had read the checkpoint before, then took the freed lock and trained from it, its saves
    replacing the newer ones (tester round 23a)."""
    if chosen is None:
        return
    newer = [
        path
        for path in chosen.path.parent.glob("*.ckpt")
        if path.is_file() and path.stat().st_mtime_ns > chosen.at_ns
    ]  # fmt: skip  (written since the choice: a checkpoint copied in before it is no save of another job)
    stat = chosen.path.stat() if chosen.path.is_file() else None
    if newer or stat is None or (stat.st_mtime_ns, stat.st_size) != (chosen.mtime_ns, chosen.size):
        written = sorted(newer, key=lambda path: path.stat().st_mtime_ns)[-1] if newer else chosen.path
        raise UserError(
            f"--ckpt_path {chosen.asked}: another job saved {written} after this one chose {chosen.path.name} to "
            "resume from (it ended as this one started)",
            "run the command again: it resumes from the newest checkpoint",
        )


def fit(cli: BuiltRun) -> None:
    if cast(
        Any, cli.trainer
    ).fast_dev_run:  # set at run time; it writes nothing: no run folder to check or hold
        rank_zero_info(write_nothing(cli.trainer))
        fit_in_run_folder(cli, [])
        return
    if cli.config.ckpt_path is None:  # a new run: its checkpoints go where no run's are
        folder, logged = run_folder(cli.trainer), bool(cli.trainer.loggers)
        check_nothing_overwritten(folder, cli.config.checkpoint.dirpath, logged, run_version(cli.config))
    created = new_run_folders(cli.trainer)
    # Rank 0 holds the run folder for the fit: a second job on it (a resume started twice) is refused here.
    with contextlib.ExitStack() as held:
        if cli.trainer.is_global_zero:
            try:
                held.enter_context(training_in(run_folder(cli.trainer), cli.config.ckpt_path))
                check_resume_still_newest(getattr(cli, "resume_chosen", None))  # chosen before the lock
            except BaseException:
                remove_unused_run_folders(
                    created
                )  # refused at the lock (a full disk): no empty version_N left
                raise
        fit_in_run_folder(cli, created)


def write_nothing(trainer: Trainer) -> str:
    """--trainer.fast_dev_run: Lightning says "Logging and checkpointing is suppressed" and its logger and
    checkpoints write nothing; the project's callbacks that write files (last.ckpt at the end, the sample grids,
    the loss plot, the post-hoc EMA snapshots) wrote them into the current folder, since the run has no folder
    then. They are dropped (the EMA itself stays), and the note returned says so."""
    callbacks = callbacks_of(trainer)
    callbacks[:] = [c for c in callbacks if not isinstance(c, Checkpoint | SampleGrid | LossPlot)]
    for callback in callbacks:
        if isinstance(callback, EMA):
            callback.post_hoc = None
    return (
        "--trainer.fast_dev_run: a smoke test that writes no files — no checkpoint, sample grid, loss plot or "
        "post-hoc EMA snapshot (a real run writes them into its run folder)"
    )


def check_checkpoint_dirpath(config: Namespace, fast_dev_run: Any = False) -> None:
    """The part of `check_nothing_overwritten` that the config alone decides, for --print_config to refuse what the
    run would: a new run's --checkpoint.dirpath into a folder that holds checkpoints."""
    dirpath = config.checkpoint.dirpath
    check_path_given(dirpath, "--checkpoint.dirpath")  # "" would put the checkpoints in the current folder
    # Lightning's fsspec writes a URL: not a local folder to look into
    if (url := url_given(dirpath)) is not None:
        check_fsspec_protocol(url, "--checkpoint.dirpath")
        return
    if config.ckpt_path is None and dirpath and not fast_dev_run:
        check_nothing_overwritten(Path(dirpath), dirpath)


def check_nothing_overwritten(
    folder: Path, checkpoint_dirpath: str | None, logged: bool = True, version: tuple[str, Any] | None = None
) -> None:
    """A new run writes its checkpoints into a folder that holds none: Lightning would replace another run's
    last.ckpt without a word. The refusal names what led there and its own fixes: --checkpoint.dirpath into
    another run's folder, a run without a logger (`logged` False: it writes into the default_root_dir, `folder`,
    itself) started again there, or a run version named again (`version`: the logger's key and value)."""
    checkpoints = Path(checkpoint_dirpath) if checkpoint_dirpath else folder / CHECKPOINTS
    found = checkpoint_files(checkpoints) if checkpoints.is_dir() else []
    if not found:
        return
    names = ", ".join(path.name for path in found[:3]) + (", ..." if len(found) > 3 else "")
    problem = f"{checkpoints} holds another run's checkpoints ({names}), which this new run would write over"
    last = checkpoints / "last.ckpt"
    resume = f"resume that run with --ckpt_path {last if last in found else found[-1]}"
    if checkpoint_dirpath:
        fix = "pass a new, empty folder as --checkpoint.dirpath (or leave it out: the run folder's checkpoints/)"
    elif not logged:
        problem += (
            f": without a logger (--trainer.logger false) a run writes its checkpoints/, config.yaml, samples/ and "
            f"loss.png straight into --trainer.default_root_dir, here {folder}"
        )
        resume += " from the same folder (--ckpt_path last needs a logger: it finds runs by its name)"
        fix = "start the new one in a new, empty folder: cd into one, or pass --trainer.default_root_dir NEW"
    elif version is not None:
        key, value = version
        shown = (
            _written_last(f"trainer.logger.init_args.{key}") or f"--trainer.logger.init_args.{key} {value}"
        )
        problem += f" ({shown} names that run's folder)"
        fix = f"leave out --trainer.logger.init_args.{key} for a new run folder"
    else:
        fix = "start the new one in a new run folder"
    raise UserError(problem, f"{resume}, or {fix}")


def run_version(config: Namespace) -> tuple[str, Any] | None:
    """The run folder the first logger's options name (TensorBoard's and CSV's version, W&B's id, MLflow's run
    id), as (key, value); None when the logger picks a new one."""
    loggers = config.trainer.logger
    first: Any = (loggers[0] if loggers else None) if isinstance(loggers, list) else loggers
    init_args = (first.get("init_args") if hasattr(first, "get") else None) or {}
    keys = ("version", "id", "run_id")
    return next(((key, init_args[key]) for key in keys if init_args.get(key) is not None), None)


def fit_in_run_folder(cli: BuiltRun, created: list[Path]) -> None:
    try:
        cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=cli.config.ckpt_path)
    except BaseException as error:
        # A collective that timed out: name the rank that stopped answering (before the others are ended).
        explained = cli.heartbeat.explain(error)
        # Lightning ends the other local ranks only on Ctrl+C. After any other error on rank 0 they would wait
        # in a collective until the process-group timeout, or not notice at all outside a collective.
        # (Not after a preemption: every rank stops at the same step on its own, once the checkpoint is saved.)
        kill = getattr(cli.trainer.strategy.launcher, "kill", None)
        if kill is not None and not isinstance(error, SIGTERMException):
            kill(signal.SIGKILL)
        if cli.trainer.global_step == 0:
            remove_unused_run_folders(created)
        if explained is not None:
            raise explained from error
        if isinstance(error, MisconfigurationException):
            raise refused_by_the_trainer(error) from error
        if is_disk_full(error):  # a write of Lightning's or a logger's (the project's own raise DiskFull)
            folder, name = Path(cli.trainer.default_root_dir), "the run's files"
            if error.filename:
                folder, name = Path(error.filename).parent, Path(error.filename).name
            raise DiskFull(folder, name, RUN_ON_ANOTHER_DISK) from error
        if isinstance(error, SIGTERMException) and not error.code:
            # Lightning's own SIGTERM path (a signal before training started) exits with status 0.
            raise Preempted(128 + signal.SIGTERM) from error
        raise
