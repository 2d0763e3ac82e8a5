"""Where a run's files live: ``<save_dir>/<name>/<version>/``, with its checkpoints in ``checkpoints/``, its config
in ``config.yaml``, its sample grids in ``samples/`` and its post-hoc EMA snapshots in ``post_hoc_ema/``. That is
the folder Lightning's ModelCheckpoint derives from the first logger (TensorBoard's and CSV's ``version_N``, a W&B
run id, ...), or the Trainer's ``default_root_dir`` without a logger. The only code that knows that layout:
`run_folder`, `run_folder_of`, `run_checkpoints`, `newest_checkpoint` (what `--ckpt_path last` resumes),
`newest_checkpoint_of_run` (what `--ckpt_path auto` resumes), `checkpoints_of_run`, `post_hoc_ema_folder`, and
what a folder is of a run (`part_of_a_run`, `runs_in`: a folder a command would write into, a name folder).

A run folder is trained by one job at a time: `training_in` holds an advisory lock (`fcntl.flock`) on
``<run>/.training.lock`` for the fit (`diffusion.data.folder_lock`, a prepare's too), which the kernel lets go when the
process ends, even by SIGKILL; a second job on the folder is refused (`RunFolderInUse`) before it does any work."""

import contextlib
import os
import re
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lightning as L

from diffusion.data.folder_lock import fcntl, holding_lock
from diffusion.errors import InvalidValue, MissingFile, UserError, WrongType, naming_a_full_disk
from diffusion.training.atomic_writes import RUN_ON_ANOTHER_DISK
from diffusion.training.checkpoint_files import UnreadableCheckpoint, check_zip_checksums, read_checkpoint

NUMBERED_VERSION = re.compile(r"version_(\d+)")
CHECKPOINTS = "checkpoints"
POST_HOC_EMA = "post_hoc_ema"
SAMPLE_GRIDS = "samples"  # the sample grids of a run (callbacks/grids.py's SampleGrid)
SNAPSHOT_FILES = "step=*-sigma_rel=*.pt"  # a post-hoc EMA snapshot's name (post_hoc_ema.py's SNAPSHOT_NAME)
TRAINING_LOCK = ".training.lock"  # holds "<pid> <host>" of the job training the folder while it runs


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint `--ckpt_path last` resumes: its file, run version and step, and the unreadable
    checkpoints of that run it passed over (path, why)."""

    path: Path
    version: str
    step: int
    skipped: tuple[tuple[Path, str], ...] = ()


@dataclass(frozen=True)
class RunFolder:
    """Where a checkpoint's run lives: ``<save_dir>/<name>/<version>/``."""

    save_dir: Path
    name: str
    version: str

    @property
    def path(self) -> Path:
        return self.save_dir / self.name / self.version

    @property
    def config_file(self) -> Path:
        return self.path / "config.yaml"

    @property
    def version_number(self) -> int | None:
        """N of a ``version_N`` folder (TensorBoard's and CSV's), None for another logger's run id."""
        numbered = NUMBERED_VERSION.fullmatch(self.version)
        return int(numbered.group(1)) if numbered else None


def run_folder(trainer: L.Trainer) -> Path:
    """This run's folder, as Lightning's ModelCheckpoint derives its ``checkpoints/`` folder from the first logger.
    A collective under DDP (rank 0's answer, which knows a logger's run id): call it on every rank."""
    if trainer.loggers:
        logger = trainer.loggers[0]
        version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
        folder = Path(logger.save_dir or trainer.default_root_dir, str(logger.name), version)
    else:
        folder = Path(trainer.default_root_dir)
    return Path(trainer.strategy.broadcast(str(folder)))


def new_run_folders(trainer: L.Trainer) -> list[Path]:
    """The run folder this fit will create and its missing parents, deepest first ([] if it exists)."""
    if not trainer.is_global_zero or not trainer.loggers:
        return []
    path = run_folder(trainer).absolute()
    return [folder for folder in [path, *path.parents] if not folder.exists()]


def remove_unused_run_folders(folders: list[Path]) -> None:
    """After a run failed before its first step: remove the folders it created, unless one holds a checkpoint."""
    if not folders or not folders[0].is_dir() or any(folders[0].rglob("*.ckpt")):
        return
    shutil.rmtree(folders[0])
    for parent in folders[1:]:
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


class RunFolderInUse(UserError):
    """Another job is training this run folder: its `folder`, and the `pid` and `host` of that job's rank 0."""

    def __init__(self, folder: Path, pid: str, host: str, resuming: str | None = None) -> None:
        # A resume's folder is its checkpoint's: another version is no way round (tester round 25a, R1)
        fix = (
            "wait for it to end, or pass {Trainer:--logger.init_args.version} NEW for a new run"
            if resuming is None
            else "wait for it to end, or start a new run from that checkpoint's weights: "
            f"{{DiffusionModule:--init_from}} {resuming} in place of {{command:--ckpt_path}}"
        )
        super().__init__(f"{folder} is being trained by another job (pid {pid} on host {host})", fix)
        self.folder, self.pid, self.host = folder, pid, host


@contextlib.contextmanager
def training_in(folder: Path, resuming: str | None = None) -> Iterator[None]:
    """Hold the run folder's lock while the block trains (rank 0 only: call it there), or raise `RunFolderInUse`
    (`holding_lock`: the kernel's, gone with its process); `resuming`: the checkpoint a resume goes on from."""
    if fcntl is None:  # Windows: no advisory locks, so its run folders go unguarded
        yield
        return
    path = folder / TRAINING_LOCK

    def refused(holder: list[str]) -> RunFolderInUse:
        pid, host = (holder + ["?", "?"])[:2]
        return RunFolderInUse(folder, pid, host, resuming)

    with contextlib.ExitStack() as held:
        # A folder that refuses the lock file: CannotWrite; a disk with no room for it (its holder's line is the
        # run's first write): DiskFull, the run's own fix. The block's errors pass as they are.
        with naming_a_full_disk(path, RUN_ON_ANOTHER_DISK):
            folder.mkdir(parents=True, exist_ok=True)
            held.enter_context(holding_lock(path, f"{os.getpid()} {socket.gethostname()}\n", refused))
        yield


def run_folder_of(checkpoint: str | os.PathLike) -> RunFolder | None:
    """The run a checkpoint belongs to, when it sits at ``<save_dir>/<name>/<version>/checkpoints/``."""
    path = Path(checkpoint).expanduser().absolute()
    if path.parent.name != CHECKPOINTS or len(path.parents) < 4:
        return None
    return RunFolder(path.parents[3], path.parents[2].name, path.parents[1].name)


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoints in a folder (``last.ckpt``, ``last-v1.ckpt``, ``step=N.ckpt``, ...), not the hidden
    temporary files of saves in progress or killed."""
    return sorted(p for p in folder.glob("*.ckpt") if not p.name.startswith(".") and p.is_file())


def run_checkpoints(save_dir: str | os.PathLike, name: str) -> list[tuple[RunFolder, list[Path]]]:
    """Every run of this name holding a checkpoint, oldest first: ``version_N`` folders by N (TensorBoard, CSV),
    runs named by another logger's id (W&B) by their newest checkpoint's time."""
    found = []
    for folder in Path(save_dir, name).glob("*/checkpoints"):
        files = checkpoint_files(folder)
        if files:
            found.append((RunFolder(Path(save_dir), name, folder.parent.name), files))

    def age(run: tuple[RunFolder, list[Path]]) -> tuple[int, float]:
        number = run[0].version_number
        return (-1, max(path.stat().st_mtime for path in run[1])) if number is None else (number, 0.0)

    return sorted(found, key=age)


RESUME_FIX = (
    "pass the path of an intact checkpoint (a backup), or start a new run without {command:--ckpt_path}"
)


def newest_checkpoint(
    save_dir: str | os.PathLike,
    name: str,
    asked_as: str = "{command:--ckpt_path} last",
    fix: str = RESUME_FIX,
) -> ResumePoint:
    """The newest intact checkpoint of the newest run of this name (the last of `run_checkpoints`).

    Newest = highest global step (``last.ckpt``, ``last-vN.ckpt`` and ``step=N.ckpt`` alike; a tie goes to a
    ``last`` file, then to the file written last). Files that cannot be read (empty, truncated, damaged, foreign)
    are passed over and listed in `skipped`; a run without an intact checkpoint is an error, never a silent fall
    back to an older run, said as `asked_as` with `fix` (a Python caller's own words: no flag).
    """
    runs = run_checkpoints(save_dir, name)
    if not runs:
        raise MissingFile(
            f"no checkpoint under {Path(save_dir, name)}/*/checkpoints/",
            "train first (python train.py), or pass the path of a checkpoint",
        )
    return _newest_intact(*runs[-1], asked_as, fix)


def newest_checkpoint_of_run(run: RunFolder) -> ResumePoint | None:
    """The newest intact checkpoint of this one run folder, as `newest_checkpoint` chooses it; None when the run
    holds no checkpoint file (not yet saved), an error when it holds only unreadable ones."""
    files = checkpoint_files(run.path / CHECKPOINTS)
    return _newest_intact(run, files, "{command:--ckpt_path} auto", RESUME_FIX) if files else None


def _newest_intact(run: RunFolder, files: list[Path], asked_as: str, fix: str) -> ResumePoint:
    readable, skipped = [], []

    def passed_over(path: Path, err: Exception) -> None:
        skipped.append((path, err.defect if isinstance(err, UnreadableCheckpoint) else str(err)))

    for path in files:
        try:  # the step only; the checksums (a read of the whole file) of the newest ones below
            step = int(read_checkpoint(path, "checkpoint", verify=False).get("global_step", -1))
        except (UserError, OSError) as err:
            passed_over(path, err)
            continue
        readable.append((step, path.name.startswith("last"), path.stat().st_mtime, path))
    for step, _, _, path in sorted(readable, reverse=True):
        try:
            check_zip_checksums(path, "checkpoint", "")
        except (UserError, OSError) as err:
            passed_over(path, err)
            continue
        return ResumePoint(path, run.version, step, tuple(skipped))
    reasons = "; ".join(f"{path.name} {why}" for path, why in skipped)
    raise InvalidValue(f"{asked_as}: no intact checkpoint in {files[0].parent} ({reasons})", fix)


def latest_checkpoint(save_dir: str | os.PathLike, name: str) -> Path:
    """The newest run's newest intact checkpoint (see `newest_checkpoint`)."""
    if not isinstance(save_dir, str | os.PathLike):
        raise WrongType("save_dir", save_dir, "a folder (str or Path)", "pass the runs' folder, e.g. 'runs'")
    if not isinstance(name, str):
        raise WrongType("name", name, "a run name (str)", "pass the run's name, e.g. 'digits'")
    if not name:
        raise InvalidValue(
            "name='' is empty: it names no run",
            "pass the run's name (its folder under save_dir), e.g. 'digits'",
        )
    if Path(save_dir).is_file():
        raise InvalidValue(
            f"save_dir={save_dir} is a file, not the folder of runs",
            "pass the folder train.py wrote to (e.g. runs), or pass the checkpoint itself where a path goes",
        )
    try:
        asked_as = f"latest_checkpoint({str(save_dir)!r}, {name!r})"  # no flag: a Python caller's line
        fix = "pass the path of an intact checkpoint (a backup) where a checkpoint goes, e.g. load_checkpoint(path)"
        return newest_checkpoint(save_dir, name, asked_as, fix).path
    except MissingFile as error:  # "train first", unless `name` names a run's version folder
        run, parent = Path(save_dir, name), Path(name).parent.as_posix()
        versioned = NUMBERED_VERSION.fullmatch(run.name) or (run / CHECKPOINTS).is_dir()
        if versioned and parent != ".":  # name='base/version_0'
            problem, instead = f"name={name!r} holds a version folder", f"name='{parent}'"
        elif versioned and run.is_dir():  # save_dir='runs/base', name='version_0'
            problem = f"name={name!r} is a version folder of the run {save_dir}"
            instead = f"save_dir='{run.parent.parent}', name='{run.parent.name}'"
        else:
            raise
        raise InvalidValue(
            problem, f"pass {instead} (the latest version is taken), or the checkpoint's path"
        ) from error


def holds_snapshots(folder: Path) -> bool:
    """Whether `folder` holds post-hoc EMA snapshot files (by their names: nothing is read)."""
    return any(p.is_file() and not p.name.startswith(".") for p in folder.glob(SNAPSHOT_FILES))


def is_run_folder(folder: Path) -> bool:
    """Whether `folder` is a run's (``<save_dir>/<name>/<version>``): it holds checkpoints in ``checkpoints/`` or
    post-hoc EMA snapshots in ``post_hoc_ema/``."""
    return bool(checkpoint_files(folder / CHECKPOINTS)) or holds_snapshots(folder / POST_HOC_EMA)


def part_of_a_run(folder: Path) -> str | None:
    """What of a run the folder `folder` holds, said for a command that would write its own files there ("a run's
    checkpoints", "a run's post-hoc EMA snapshots", "a run's sample grids", "a run (its checkpoints folder)"), or
    None for a folder of no run's."""
    if not folder.is_dir():
        return None
    if checkpoint_files(folder):
        return "a run's checkpoints"
    if holds_snapshots(folder):
        return "a run's post-hoc EMA snapshots"
    if is_run_folder(folder):
        return f"a run (its {CHECKPOINTS if checkpoint_files(folder / CHECKPOINTS) else POST_HOC_EMA} folder)"
    if folder.name == SAMPLE_GRIDS and is_run_folder(folder.parent):
        return "a run's sample grids"
    return None


def runs_in(folder: Path) -> list[Path]:
    """The run folders directly in `folder` (a run's name folder, ``<save_dir>/<name>``), oldest first:
    ``version_N`` by N, runs named by another logger's id (W&B) after them, by name."""
    if not folder.is_dir():
        return []
    runs = [child for child in folder.iterdir() if child.is_dir() and is_run_folder(child)]

    def order(run: Path) -> tuple[int, str]:
        numbered = NUMBERED_VERSION.fullmatch(run.name)
        return (int(numbered.group(1)), "") if numbered else (1 << 62, run.name)

    return sorted(runs, key=order)


def post_hoc_ema_folder(run: str | os.PathLike) -> Path:
    """Where a run (``<save_dir>/<name>/<version>``, `run_folder`) keeps its post-hoc EMA snapshots."""
    return Path(run) / POST_HOC_EMA


def checkpoints_of_run(run: str | os.PathLike) -> list[tuple[int, Path]]:
    """(global step, path) of every readable checkpoint in a run folder's ``checkpoints/``, by step (a tie:
    ``last`` files after the others)."""
    found = []
    for path in checkpoint_files(Path(run) / CHECKPOINTS):
        try:
            step = int(read_checkpoint(path, "checkpoint").get("global_step", -1))
        except (UserError, OSError):
            continue
        found.append((step, path.name.startswith("last"), path))
    return [(step, path) for step, _, path in sorted(found)]
