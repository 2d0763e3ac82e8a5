"""What `python -m diffusion.phema` checks of its --run, --out and mode before it reads the snapshots: one of
--sigma_rel and --sweep; an --out that is no file among a run's checkpoints or snapshots; a --run that holds none,
said of what it is (a folder of runs, one of a run's folders, a run trained without post-hoc EMA)."""

from pathlib import Path

from diffusion.cli.config_files import as_text
from diffusion.cli.flags import check_writable_folder
from diffusion.errors import UserError
from diffusion.training.run_folders import (
    CHECKPOINTS,
    POST_HOC_EMA,
    checkpoint_files,
    holds_snapshots,
    is_run_folder,
    post_hoc_ema_folder,
    runs_in,
)


def check_one_mode(sigma_rel: float | None, sweep: list[float] | None) -> None:
    """--sigma_rel or --sweep, one of them: both given is said with their values (a config file's keys, where a
    file gave them: `said_as_written`), as two modes, not as a missing flag."""
    if sigma_rel is None and sweep is None:
        raise UserError(
            "neither --sigma_rel nor --sweep is given",
            "pass one of --sigma_rel and --sweep: --sigma_rel S --out OUT.ckpt writes one checkpoint, "
            '--sweep "[S1, S2, ...]" scores several',
        )
    if sigma_rel is not None and sweep is not None:
        raise UserError(
            f"--sigma_rel {as_text(sigma_rel)} and --sweep {as_text(sweep)} are both given, "
            "and they are two modes: --sigma_rel writes one checkpoint, --sweep scores several",
            "drop one (a --sweep with --out also writes the best one's checkpoint)",
        )


def check_out(out: str | None) -> None:
    if out is None:
        return
    path = Path(out)
    if path.is_dir():
        raise UserError(
            f"--out {out} is a folder", "pass the path of the checkpoint to write, e.g. phema.ckpt"
        )
    check_writable_folder(path.parent, "--out", given=out)
    if path.suffix != ".ckpt":  # a .safetensors name held a torch checkpoint, which torch.load then misread
        raise UserError(
            f"--out {out} is not a .ckpt name, and phema writes a training checkpoint (torch.save)",
            f"name it .ckpt: --out {path.with_suffix('.ckpt')} (python -m diffusion.export writes safetensors "
            "from it)",
        )
    if path.parent.name == CHECKPOINTS and checkpoint_files(path.parent):  # a run's: its resume points
        resumes = "where train.py resumes from the checkpoint of the highest step"
        raise UserError(
            f"--out {out} is in a run's checkpoints folder, {resumes} (last.ckpt is the run's resume point): its "
            "EMA weights would be taken for the raw ones",
            f"write it beside the run's folders, e.g. --out {path.parent.parent / 'phema.ckpt'}",
        )
    # A run's snapshots (or a copy of them): export refuses a checkpoint there as a snapshot
    if path.parent.name == POST_HOC_EMA or holds_snapshots(path.parent):
        raise UserError(
            f"--out {out} is in a run's post-hoc EMA folder, among its snapshots, "
            "where a checkpoint is taken for one (python -m diffusion.export refuses it)",
            f"write it beside the run's folders, e.g. --out {path.parent.parent / 'phema.ckpt'}",
        )


def no_snapshots(run: Path, folder: Path) -> UserError:
    """--run holds no snapshots in `folder`, said of what it is: a folder of runs (runs/<name>, its runs below
    it), one of a run's folders, or a run trained without post-hoc EMA ("train with --ema.post_hoc true" was said
    of a run that had)."""
    if holds_snapshots(run) or (run.name == CHECKPOINTS and is_run_folder(run.parent)):
        what = "post-hoc EMA snapshots" if holds_snapshots(run) else "checkpoints"
        return UserError(
            f"--run {run} is the folder of a run's {what}, not the run's folder", f"pass --run {run.parent}"
        )
    runs = runs_in(run)
    with_snapshots = [found for found in runs if holds_snapshots(post_hoc_ema_folder(found))]
    if len(with_snapshots) == 1:
        return UserError(
            f"--run {run} is a folder of runs, and its run {with_snapshots[0].name} holds the post-hoc EMA snapshots",
            f"pass --run {with_snapshots[0]}",
        )
    if with_snapshots:
        return UserError(
            f"--run {run} is a folder of runs, and its runs {', '.join(found.name for found in with_snapshots)} "
            "hold post-hoc EMA snapshots",
            f"pass one of them, e.g. --run {with_snapshots[-1]} (the newest)",
        )
    if runs:
        return UserError(
            f"--run {run} is a folder of runs, and none of them ({', '.join(found.name for found in runs)}) "
            "holds post-hoc EMA snapshots",
            "train with --ema.post_hoc true, and pass that run's folder (runs/<name>/version_N)",
        )
    return UserError(
        f"--run {run} holds no post-hoc EMA snapshots (in {folder})",
        "train with --ema.post_hoc true, or pass the run folder that did",
    )
