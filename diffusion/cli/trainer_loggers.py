"""The run's loggers, checked before LightningCLI builds them: the optional package a logger needs, the folders it
writes (some loggers create theirs as they are built, and their OSError reached the user in the parser's words),
and MLflow's local file store opted into where the run chooses it."""

import importlib.util
import os
from typing import Any
from urllib.parse import urlparse

from diffusion.cli.flags import check_path_given, check_writable_folder
from diffusion.errors import UserError

# Lightning's loggers whose packages are optional: class name -> (module, pip requirement).
LOGGER_PACKAGES = {
    "WandbLogger": ("wandb", 'wandb (or this project\'s extra: pip install -e ".[loggers]")'),
    "MLFlowLogger": ("mlflow", 'mlflow-skinny (or this project\'s extra: pip install -e ".[loggers]")'),
    "CometLogger": ("comet_ml", "comet-ml"),
    "NeptuneLogger": ("neptune", "neptune"),
}


def _loggers(trainer: dict[str, Any]) -> list[tuple[str, Any]]:
    """(class name, init_args) of each logger the run is configured with."""
    loggers = trainer.get("logger")
    return [
        (str(logger.get("class_path", "")).rsplit(".", 1)[-1], logger.get("init_args") or {})  # type: ignore[union-attr]
        for logger in (loggers if isinstance(loggers, list) else [loggers])
        if hasattr(logger, "get")
    ]


def check_logger_installed(trainer: dict[str, Any]) -> None:
    """The logger's package is installed: Lightning would end in a traceback when it builds the logger."""
    for name, _ in _loggers(trainer):
        module, requirement = LOGGER_PACKAGES.get(name, (None, None))
        if module and importlib.util.find_spec(module) is None:
            raise UserError(f"--trainer.logger {name} needs the {module} package, which is not installed",
                            f"pip install {requirement}, or pick another logger")  # fmt: skip


def allow_mlflow_file_store(trainer: dict[str, Any]) -> None:
    """An MLFlowLogger with a local file store (its default, ./mlruns): MLflow refuses to open one unless
    MLFLOW_ALLOW_FILE_STORE is set, and mlflow-skinny has no other store that works offline. Choosing the file
    store is the opt-in; a user's own MLFLOW_ALLOW_FILE_STORE is left as it is."""
    for name, init_args in _loggers(trainer):
        if name == "MLFlowLogger" and str(init_args.get("tracking_uri") or "file:").startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def check_logger_folders(trainer: dict[str, Any]) -> None:
    """Every logger's folder can be written, before the logger is built: some create it as they are built (MLflow's
    file store), and their OSError would reach the user wrapped in the parser's words."""
    for name, init_args in _loggers(trainer):
        version = init_args.get("version")
        # a negative one made version_-1 without a word
        if isinstance(version, int) and not isinstance(version, bool) and version < 0:
            raise UserError(
                f"--trainer.logger.init_args.version {version} is negative",
                "pass a version number >= 0 (or a name), or leave it out for the next free version_N",
            )
        uri = init_args.get("tracking_uri") if name == "MLFlowLogger" else None
        if uri is not None:
            if str(uri).startswith("file:"):
                check_writable_folder(urlparse(str(uri)).path, "--trainer.logger.init_args.tracking_uri")
            continue  # a tracking server: save_dir is not used
        for key in ("save_dir", "dir"):  # W&B's dir stands for its save_dir
            # "" (an unset $RUNS) put the run in the current folder without a word; no logger defaults to it
            check_path_given(init_args.get(key), f"--trainer.logger.init_args.{key}")
            if init_args.get(key):
                check_writable_folder(init_args[key], f"--trainer.logger.init_args.{key}")
                break
