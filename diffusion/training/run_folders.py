"""Where a run's files live: ``<save_dir>/<name>/version_<N>/`` (TensorBoardLogger's layout) with its checkpoints
in ``checkpoints/``, its config in ``config.yaml`` and its post-hoc EMA snapshots in ``post_hoc_ema/``. The only
code that knows that layout: `run_folder_of`, `run_checkpoints`, `newest_checkpoint`, which is what
`--ckpt_path last` resumes, `checkpoints_of_run` and `post_hoc_ema_folder`."""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from diffusion.errors import UserError
from diffusion.training.checkpoint_files import read_checkpoint

RUN_FOLDER = re.compile(r"version_(\d+)")
CHECKPOINTS = "checkpoints"
POST_HOC_EMA = "post_hoc_ema"


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint `--ckpt_path last` resumes: its file, run version and step, and the unreadable
    checkpoints of that run it passed over (path, why)."""

    path: Path
    version: int
    step: int
    skipped: tuple[tuple[Path, str], ...] = ()


@dataclass(frozen=True)
class RunFolder:
    """Where a checkpoint's run lives: ``<save_dir>/<name>/version_<version>/``."""

    save_dir: Path
    name: str
    version: int

    @property
    def path(self) -> Path:
        return self.save_dir / self.name / f"version_{self.version}"

    @property
    def config_file(self) -> Path:
        return self.path / "config.yaml"


def run_folder_of(checkpoint: str | os.PathLike) -> RunFolder | None:
    """The run a checkpoint belongs to, when it sits at ``<save_dir>/<name>/version_<N>/checkpoints/``."""
    path = Path(checkpoint).expanduser().absolute()
    version = RUN_FOLDER.fullmatch(path.parent.parent.name)
    if path.parent.name != CHECKPOINTS or version is None:
        return None
    return RunFolder(path.parents[3], path.parents[2].name, int(version.group(1)))


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoints in a folder (``last.ckpt``, ``last-v1.ckpt``, ``step=N.ckpt``, ...), not the hidden
    temporary files of saves in progress or killed."""
    return sorted(p for p in folder.glob("*.ckpt") if not p.name.startswith(".") and p.is_file())


def run_checkpoints(save_dir: str | os.PathLike, name: str) -> list[tuple[int, list[Path]]]:
    """(version, checkpoint files) of every ``<save_dir>/<name>/version_<N>/`` holding any, by version."""
    found = []
    for folder in Path(save_dir, name).glob("version_*/checkpoints"):
        version = RUN_FOLDER.fullmatch(folder.parent.name)
        files = checkpoint_files(folder)
        if version and files:
            found.append((int(version.group(1)), files))
    return sorted(found)


def newest_checkpoint(save_dir: str | os.PathLike, name: str) -> ResumePoint:
    """The newest intact checkpoint of the newest run of this name (highest N holding a checkpoint).

    Newest = highest global step (``last.ckpt``, ``last-vN.ckpt`` and ``step=N.ckpt`` alike; a tie goes to a
    ``last`` file, then to the file written last). Files that cannot be read (empty, truncated, foreign) are passed over and listed in
    `skipped`; a run without a readable checkpoint is an error, never a silent fall back to an older run.
    """
    runs = run_checkpoints(save_dir, name)
    if not runs:
        raise FileNotFoundError(
            f"no checkpoint under {Path(save_dir, name)}/version_*/checkpoints/: train first "
            f"(python train.py), or pass the path of a checkpoint"
        )
    version, files = runs[-1]
    intact, skipped = [], []
    for path in files:
        try:
            step = int(read_checkpoint(path, "checkpoint").get("global_step", -1))
        except (UserError, OSError) as err:
            skipped.append((path, str(err).split(" — ")[0].removeprefix(f"checkpoint {path} ")))
            continue
        intact.append((step, path.name.startswith("last"), path.stat().st_mtime, path))
    if not intact:
        reasons = "; ".join(f"{path.name} {why}" for path, why in skipped)
        raise UserError(
            f"--ckpt_path last: no readable checkpoint in {files[0].parent} ({reasons})",
            "pass the path of an intact checkpoint, or start a new run without --ckpt_path",
        )
    step, _, _, path = max(intact)
    return ResumePoint(path, version, step, tuple(skipped))


def latest_run(save_dir: str | os.PathLike, name: str) -> tuple[int, Path]:
    """(version, newest intact checkpoint) of the newest run of this name (see `newest_checkpoint`)."""
    point = newest_checkpoint(save_dir, name)
    return point.version, point.path


def latest_checkpoint(save_dir: str | os.PathLike, name: str) -> Path:
    """The newest run's newest intact checkpoint (see `newest_checkpoint`)."""
    return newest_checkpoint(save_dir, name).path


def post_hoc_ema_folder(run: str | os.PathLike) -> Path:
    """Where a run (``<save_dir>/<name>/version_<N>``, a trainer's `log_dir`) keeps its post-hoc EMA snapshots."""
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
