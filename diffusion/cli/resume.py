"""The right run to resume: `--ckpt_path last` is the newest checkpoint of the newest run of the logger's name;
`--ckpt_path auto` is this job's own run (named by the logger's version, or by the launcher's job: torchrun's run
id, SLURM's job id), resumed when it holds a checkpoint and started there when not, so that one command line serves
a job's first start and every restart. The resumed run goes on writing into its folder; a resume is refused when it
would change what the run trains (the checkpoint's optimizer state, EMA and data order belong to the run's own
settings)."""

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace
from lightning.pytorch.utilities import rank_zero_only

from diffusion.cli.resumed_state import check_not_a_phema_output, check_post_hoc_kept
from diffusion.cli.training_run import note_run_options_unused
from diffusion.data.file_in_folder import file_in_folder
from diffusion.errors import MissingFile, UserError
from diffusion.training.checkpoint_files import CHECKPOINT, check_finite, read_checkpoint
from diffusion.training.run_folders import (
    CHECKPOINTS,
    ResumePoint,
    RunFolder,
    newest_checkpoint,
    newest_checkpoint_of_run,
    run_folder_of,
)


@dataclass(frozen=True)
class RunLayout:
    """Where a logger keeps its runs, as Lightning's ModelCheckpoint derives <save_dir>/<name>/<version>/ from it:
    the init_args that hold the save_dir and the name, with their defaults, and the one that takes the run's folder
    name (TensorBoard's and CSV's version_N, a W&B run id) and continues that run."""

    save_key: str
    save_default: str | None
    name_key: str
    name_default: str
    version_key: str = "version"

    def runs(self, init_args: Any) -> tuple[str, str]:
        """(save_dir, name): this logger's runs are the folders <save_dir>/<name>/*/ (the defaults filled in, so
        the saved config says where the run went)."""
        init_args[self.save_key] = init_args.get(self.save_key) or self.save_default
        init_args[self.name_key] = init_args.get(self.name_key) or self.name_default
        return init_args[self.save_key], init_args[self.name_key]

    def continue_run(self, init_args: Any, run: RunFolder) -> bool:
        """Point the logger at the run a checkpoint belongs to; False when it cannot go on in that run."""
        save_dir, name = self.runs(init_args)
        if Path(save_dir, name).absolute() != run.save_dir / run.name:
            # Spelled as configured unless the checkpoint is elsewhere: checkpoints record their folder.
            init_args[self.save_key], init_args[self.name_key] = str(run.save_dir), run.name
        init_args[self.version_key] = run.version
        return True


class MLflowLayout(RunLayout):
    """MLflow's local file store: <tracking_uri's folder>/<experiment id>/<run id>/ (Lightning's save_dir is the
    tracking_uri without `file:`, else `file:<save_dir>`), a run continued by its `run_id`. The experiment id is
    the store's, looked up by `experiment_name`."""

    def store(self, init_args: Any) -> str | None:
        """The file store's folder, None for a tracking server."""
        uri = init_args.get("tracking_uri") or f"file:{init_args.get(self.save_key) or self.save_default}"
        return uri.removeprefix("file:") if uri.startswith("file:") else None

    def runs(self, init_args: Any) -> tuple[str, str]:
        store = self.store(init_args)
        if store is None:
            raise UserError(
                f"--ckpt_path last finds the runs of an MLflow file store, and this run logs to the tracking "
                f"server {init_args.get('tracking_uri')}",
                "pass the path of a checkpoint, e.g. <default_root_dir>/<experiment id>/<run id>/checkpoints/"
                "last.ckpt",
            )
        name = init_args.get(self.name_key) or self.name_default
        experiment = None
        if Path(store).is_dir():  # the store's client creates a missing store
            from mlflow.tracking import MlflowClient

            experiment = MlflowClient(f"file:{store}").get_experiment_by_name(name)
        if experiment is None or experiment.lifecycle_stage == "deleted":
            raise UserError(
                f"--ckpt_path last: no MLflow experiment {name!r} in {store}",
                "train first (python train.py), or pass the path of a checkpoint",
            )
        return store, experiment.experiment_id

    def continue_run(self, init_args: Any, run: RunFolder) -> bool:
        if not (run.path / "meta.yaml").is_file():  # not a run of an MLflow file store: a new run begins
            return False
        store = self.store(init_args)
        if store is None or Path(store).absolute() != run.save_dir:
            init_args["tracking_uri"] = f"file:{run.save_dir}"
        init_args[self.version_key] = run.version
        return True


RUN_LAYOUTS = {
    "TensorBoardLogger": RunLayout("save_dir", None, "name", "lightning_logs"),
    "CSVLogger": RunLayout("save_dir", None, "name", "lightning_logs"),
    "WandbLogger": RunLayout("save_dir", ".", "project", "lightning_logs"),
    "MLFlowLogger": MLflowLayout("save_dir", "./mlruns", "experiment_name", "lightning_logs", "run_id"),
}


def _known_logger(config: Namespace) -> tuple[Any, RunLayout] | None:
    """(init_args, layout) of the run's first logger, when this module knows its layout."""
    logger = config.trainer.logger
    if isinstance(logger, list):
        logger = logger[0] if logger else None
    if not logger or not hasattr(logger, "get"):
        return None
    layout = RUN_LAYOUTS.get(str(logger.get("class_path", "")).rsplit(".", 1)[-1])
    return None if layout is None else (logger.init_args, layout)


LAST, AUTO = "last", "auto"
# A launcher's name for the job, the same on every rank and kept by a restart, as the run folder's name: torchrun's
# run id (its --rdzv-id; on one machine without --master_port a fresh uuid per torchrun started; "none", its default
# elsewhere, names no job), then SLURM's job id (kept by a requeue). The prefixes keep them apart from each other and
# from numbered version_N folders, whose next number a plain run takes (SLURM's ids are numbers too).
JOB_IDS = (("TORCHELASTIC_RUN_ID", "torchrun"), ("SLURM_JOB_ID", "slurm"))
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # one folder, and a W&B run id


def launcher_job() -> str | None:
    """This job's run folder name from its launcher (JOB_IDS), None outside torchrun and SLURM."""
    for variable, prefix in JOB_IDS:
        job = os.environ.get(variable, "none")
        if job == "none":
            continue
        if not FOLDER_NAME.fullmatch(job):  # a slash would make a folder of another run's name
            raise UserError(
                f"--ckpt_path auto names the run after the job, and {variable}={job!r} is no folder name",
                "pass the run's name as --trainer.logger.init_args.version NAME (letters, digits, '-', '_', '.')",
            )
        return f"{prefix}-{job}"
    return None


def job_run(init_args: Any, layout: RunLayout) -> RunFolder:
    """The run `--ckpt_path auto` resumes or starts: the logger's version when one is given, else the launcher's
    job (set as the version, so the logger writes there and the saved config names it)."""
    if isinstance(layout, MLflowLayout):
        raise UserError(
            "--ckpt_path auto names the run's folder, and MLflow names its runs itself",
            "pass --ckpt_path last, or the path of a checkpoint",
        )
    version = init_args.get(layout.version_key)
    if version is None:
        version = init_args[layout.version_key] = launcher_job()
    if version is None:
        torchrun = os.environ.get("TORCHELASTIC_RUN_ID")
        found = "torchrun's run id is its default 'none'" if torchrun else "no torchrun or SLURM job"
        raise UserError(
            f"--ckpt_path auto resumes or starts this job's own run, and nothing names it ({found}, no "
            "--trainer.logger.init_args.version)",
            "pass the run's name as --trainer.logger.init_args.version NAME (the same on every restart), or run "
            "the job under SLURM or torchrun (with --rdzv-id NAME where it has no --standalone)",
        )
    save_dir, name = layout.runs(init_args)
    folder = version if isinstance(version, str) else f"version_{version}"  # as Lightning's loggers name it
    return RunFolder(Path(save_dir).absolute(), str(name), folder)


def job_checkpoint(config: Namespace, init_args: Any, layout: RunLayout) -> ResumePoint | None:
    """`--ckpt_path auto`: the newest intact checkpoint of this job's run, None when it has none yet (the run
    starts in that folder). A run already trained to --max_steps ends the command with status 0: a restart of a
    job whose last rank stopped after the final save has finished."""
    run = job_run(init_args, layout)
    point = newest_checkpoint_of_run(run)
    links = broken_links([run.path / CHECKPOINTS])
    if point is None and links:  # not a run that has no checkpoint yet: its checkpoint is gone
        raise broken_link(links[-1], f"--ckpt_path {AUTO}: ")
    if point is not None:
        _note_broken_links(AUTO, links, point)
    if point is None:
        _note(f"--ckpt_path auto: no checkpoint in {run.path} yet: this job's run starts there")
        return None
    max_steps = config.trainer.max_steps
    if max_steps not in (None, -1) and point.step >= max_steps:
        _note(f"--ckpt_path auto: this job's run {run.path} is trained to step {point.step} already (--max_steps "
              f"{max_steps}): nothing to do")  # fmt: skip
        raise SystemExit(0)
    _note(f"--ckpt_path auto: resuming this job's run {run.path} from {point.path.name} (step {point.step})")
    return point


def _note(text: str) -> None:
    """One line on stderr, from rank 0 (every rank resolves the run alike)."""
    if rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # Lightning sets the rank on the function
        print(f"note: {text}", file=sys.stderr, flush=True)


def broken_links(folders: Any) -> list[Path]:
    """The checkpoint names in `folders` that are symbolic links to nothing (a `last.ckpt` whose target was moved
    or deleted): no checkpoint file to the finders, which pass them over without a word."""
    return sorted(
        p for folder in folders for p in Path(folder).glob("*.ckpt") if p.is_symlink() and not p.exists()
    )


def broken_link(link: Path, said: str) -> UserError:
    """`<said><link> is a broken link (to <target> ...)`: `said` names what found it (`--ckpt_path last: `)."""
    return UserError(
        f"{said}{link} is a broken link (to {os.readlink(link)}, which does not exist)",
        "restore the checkpoint it points to, point the link at one that exists, or pass the path of a checkpoint",
    )


def _note_broken_links(given: str, links: list[Path], point: ResumePoint) -> None:
    if links and rank_zero_only.rank == 0:  # type: ignore[attr-defined]
        shown = ", ".join(f"{link} (to {os.readlink(link)})" for link in links)
        print(
            f"warning: --ckpt_path {given}: passed over broken links {shown}; resuming from {point.path}",
            file=sys.stderr, flush=True,
        )  # fmt: skip


def resolve_resume(config: Namespace) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """Turn `--ckpt_path` (a path, `last` or `auto`) into the checkpoint to resume, point the logger at that run's
    folder so the resumed run goes on writing there, and return the checkpoint's contents (read once, checked; None
    when `auto` starts the job's run) with how the command's config is saved (SaveConfigToRunFolder's arguments)."""
    logger = _known_logger(config)
    # `auto` stays in the saved config: run again with --config, the run's config.yaml resumes that run.
    saving = {"ckpt_path": AUTO} if config.ckpt_path == AUTO else {}
    if config.ckpt_path in (LAST, AUTO):
        if logger is None:
            known = [name for name in RUN_LAYOUTS if config.ckpt_path == LAST or name != "MLFlowLogger"]
            raise UserError(
                f"--ckpt_path {config.ckpt_path} finds the runs of {', '.join(known[:-1])} and {known[-1]}, and "
                "this run has another logger or none",
                "pass the path of a checkpoint, e.g. <save_dir>/<name>/<version>/checkpoints/last.ckpt",
            )
        init_args, layout = logger
        if config.ckpt_path == AUTO:
            point = job_checkpoint(config, init_args, layout)
            if point is None:
                config.ckpt_path = None
                return None, saving
        else:
            save_dir, name = layout.runs(init_args)
            links = broken_links(Path(save_dir, name).glob("*/checkpoints"))
            try:
                point = newest_checkpoint(save_dir, name)
            except MissingFile as error:  # said as "train first" where a broken link is what is there
                if links:
                    raise broken_link(links[-1], f"--ckpt_path {LAST}: ") from error
                raise
            _note_broken_links(LAST, links, point)
        if point.skipped and rank_zero_only.rank == 0:  # type: ignore[attr-defined]
            passed = ", ".join(f"{path.name} ({why})" for path, why in point.skipped)
            print(
                f"warning: --ckpt_path {config.ckpt_path}: passed over unreadable {passed} in {point.path.parent}; "
                f"resuming from {point.path.name} (step {point.step})",
                file=sys.stderr, flush=True,
            )  # fmt: skip
        config.ckpt_path = str(point.path)
    given = Path(config.ckpt_path).expanduser()
    if given.is_symlink() and not given.exists():  # said as "no checkpoint at" by file_in_folder
        raise broken_link(Path(config.ckpt_path), "--ckpt_path ")
    config.ckpt_path = str(file_in_folder(config.ckpt_path, "--ckpt_path", CHECKPOINT))
    checkpoint = read_checkpoint(config.ckpt_path, "--ckpt_path")
    check_finite(
        checkpoint.get("state_dict") or {}, f"--ckpt_path {config.ckpt_path}",
        "training diverged before it was saved: resume from an earlier checkpoint of the run",
    )  # fmt: skip
    check_not_a_phema_output(checkpoint, config.ckpt_path)  # what the checkpoint itself says it holds
    check_post_hoc_kept(checkpoint, config.ckpt_path, config)
    run = run_folder_of(config.ckpt_path)
    if run is None or logger is None:
        return checkpoint, saving
    init_args, layout = logger
    keys = (layout.save_key, layout.name_key, layout.version_key)
    configured = {key: init_args.get(key) for key in keys}
    if not layout.continue_run(init_args, run):
        return checkpoint, saving
    if not isinstance(layout, MLflowLayout):  # its name is an experiment's, its folder the experiment's id
        theirs = dict(zip(keys, (run.save_dir, run.name, run.version), strict=True))
        note_run_options_unused(configured, theirs, run.path, config.ckpt_path)
    step = int(checkpoint.get("global_step", 0))
    # The run's own config.yaml stays what it started with.
    if run.config_file.is_file():
        saving["config_filename"] = f"config-resumed-at-step-{step}.yaml"
    return checkpoint, saving


def check_init_from_on_resume(ckpt_path: str | None, init_from: str | None) -> None:
    """--model.init_from beside a resume (--ckpt_path, resolved: None when `auto` starts the job's run): the run
    goes on from the checkpoint's weights, and init_from's were loaded and replaced without a word. Passed where
    they are the run's own (its config.yaml names them: resumed with that config, or a job restarted with the
    command line that started it, --ckpt_path auto)."""
    if ckpt_path is None or init_from is None or runs_own_init_from(ckpt_path, init_from):
        return
    raise UserError(
        f"--model.init_from {init_from} with --ckpt_path {ckpt_path}: a resume goes on from the checkpoint's "
        "weights and optimizer state, so those of --model.init_from would be loaded and replaced unused",
        "leave out --model.init_from to resume the run, or leave out --ckpt_path to start a new run from "
        "--model.init_from's weights",
    )


def runs_own_init_from(ckpt_path: str | None, init_from: str | None) -> bool:
    """Whether a resume's --model.init_from is its run's own (the run's config.yaml names it): the checkpoint's
    weights replace it, so train.py does not read it, and a fine-tuned run resumes after its first weights were
    moved away (tester round 24b: S5)."""
    run = None if ckpt_path is None or init_from is None else run_folder_of(ckpt_path)
    if run is None or not run.config_file.is_file():
        return False
    saved = (yaml.safe_load(run.config_file.read_text()) or {}).get("model") or {}
    started_from = saved.get("init_from") if isinstance(saved, dict) else None
    return started_from is not None and _same_path(str(started_from), str(init_from))


def _same_path(one: str, other: str) -> bool:
    return one == other or Path(one).expanduser().resolve() == Path(other).expanduser().resolve()
