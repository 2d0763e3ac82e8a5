"""The right run to resume: `--ckpt_path last` is the newest checkpoint of the newest run of the logger's name, and
the resumed run goes on writing into its folder; a resume is refused when it would change what the run trains
(the checkpoint's optimizer state, EMA and data order belong to the run's own settings)."""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.utilities import rank_zero_only

from diffusion.cli.legacy import same_class
from diffusion.data.file_in_folder import file_in_folder
from diffusion.errors import UserError
from diffusion.training.checkpoint_files import CHECKPOINT, check_finite, read_checkpoint
from diffusion.training.run_folders import RunFolder, newest_checkpoint, run_folder_of


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


def _known_logger(config) -> tuple[Any, RunLayout] | None:
    """(init_args, layout) of the run's first logger, when this module knows its layout."""
    logger = config.trainer.logger
    if isinstance(logger, list):
        logger = logger[0] if logger else None
    if not logger or not hasattr(logger, "get"):
        return None
    layout = RUN_LAYOUTS.get(str(logger.get("class_path", "")).rsplit(".", 1)[-1])
    return None if layout is None else (logger.init_args, layout)


def resolve_resume(config) -> tuple[dict[str, Any], str | None]:
    """Turn `--ckpt_path` (a path, or `last`) into the checkpoint to resume, point the logger at that run's folder so
    the resumed run goes on writing there, and return the checkpoint's contents (read once, checked) with the file
    name the resumed command's config is saved under (None: config.yaml, for a run without one)."""
    logger = _known_logger(config)
    if config.ckpt_path == "last":
        if logger is None:
            raise UserError(
                f"--ckpt_path last finds the runs of {', '.join(list(RUN_LAYOUTS)[:-1])} and "
                f"{list(RUN_LAYOUTS)[-1]}, and this run has another logger or none",
                "pass the path of a checkpoint, e.g. <save_dir>/<name>/<version>/checkpoints/last.ckpt",
            )
        init_args, layout = logger
        point = newest_checkpoint(*layout.runs(init_args))
        if point.skipped and rank_zero_only.rank == 0:
            passed = ", ".join(f"{path.name} ({why})" for path, why in point.skipped)
            print(
                f"warning: --ckpt_path last: passed over unreadable {passed} in {point.path.parent}; "
                f"resuming from {point.path.name} (step {point.step})",
                file=sys.stderr, flush=True,
            )  # fmt: skip
        config.ckpt_path = str(point.path)
    config.ckpt_path = str(file_in_folder(config.ckpt_path, "--ckpt_path", CHECKPOINT))
    checkpoint = read_checkpoint(config.ckpt_path, "--ckpt_path")
    check_finite(
        checkpoint.get("state_dict") or {}, f"--ckpt_path {config.ckpt_path}",
        "training diverged before it was saved: resume from an earlier checkpoint of the run",
    )  # fmt: skip
    run = run_folder_of(config.ckpt_path)
    if run is None or logger is None:
        return checkpoint, None
    init_args, layout = logger
    if not layout.continue_run(init_args, run):
        return checkpoint, None
    step = int(checkpoint.get("global_step", 0))
    # The run's own config.yaml stays what it started with.
    return checkpoint, f"config-resumed-at-step-{step}.yaml" if run.config_file.is_file() else None


# ---- the right run: settings a resumed run must share with the run it continues ---------------------------
# Everything under these keys changes what is trained (network, schedule, loss, optimizer and lr, data, batch,
# EMA, noise seed), except the keys in NOT_TRAINING: how long to train, how often to validate, sample or save,
# how to sample, and how to read the data, may change on resume. The world size may change too (with the
# warning in `DiffusionModule`).
TRAINING_SETTINGS = (
    "model.", "data.", "ema.", "seed_everything", "trainer.accumulate_grad_batches",
    "trainer.gradient_clip_val", "trainer.gradient_clip_algorithm", "trainer.precision",
)  # fmt: skip

NOT_TRAINING = (
    "model.sampling", "model.init_from", "model.compile", "data.init_args.num_workers", "data.init_args.verify",
    "ema.snapshot_every", "ema.max_snapshot_gb",
)  # fmt: skip


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differing_training_settings(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) for every training setting that differs between two configs as
    LightningCLI dumps them (a run's config.yaml). Keys that one of them lacks (a config written by an older
    version of the code) are not compared."""
    saved, current = flatten(saved), flatten(current)
    return [
        (key, saved[key], current[key])
        for key in sorted(saved.keys() & current.keys())
        if key.startswith(TRAINING_SETTINGS)
        and not key.startswith(NOT_TRAINING)
        and saved[key] != current[key]
        and not (key.endswith("class_path") and same_class(saved[key], current[key]))
    ]


def check_same_training_settings(path: str, current_config: str) -> None:
    """Refuse to resume a run with settings that change what it trains (network, data, optimizer, ...), naming
    them: the optimizer state, EMA and data order in the checkpoint belong to the run's own settings."""
    run = run_folder_of(path)
    if run is None or not run.config_file.is_file():
        return  # not in a run folder, or a run made without the CLI: nothing to compare with
    saved = yaml.safe_load(run.config_file.read_text()) or {}
    differences = differing_training_settings(saved, yaml.safe_load(current_config) or {})
    if not differences:
        return
    shown = "; ".join(
        f"--{key.replace('.init_args.', '.')} {theirs!r} there, {ours!r} here"
        for key, theirs, ours in differences[:4]
    )
    more = f" (and {len(differences) - 4} more)" if len(differences) > 4 else ""
    raise UserError(
        f"--ckpt_path {path} belongs to a run trained with other settings: {shown}{more}",
        f"resume it with its own config: --config {run.config_file} (flags such as --max_steps may follow), "
        f"or start a new run from its weights: --model.init_from {path} (without --ckpt_path)",
    )
