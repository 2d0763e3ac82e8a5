"""The command line: LightningCLI with shorthands, the default recipe and run folders.

`python train.py` trains the default recipe, `configs/digits.yaml`, whose values are written there only. The
code defaults are Ho et al.'s (800k steps, Adam 2e-4 with 5000 warmup steps, ...) and this project's
conventions (TensorBoard runs under `runs/`, gradient clipping 1, validation every N steps); a recipe holds
what differs. Every Trainer, model and data argument is a flag (`--trainer.*`, `--model.*`, `--data.*`,
`--ema.*`, `--checkpoint.*`, `--sample_grid.*`) and the common Trainer flags have shorthands (`--devices 4`).

What can be checked before training is (option ranges, image size against the network, output folders, the
checkpoint to resume or start from: `diffusion.run_checks`), and a user error ends in one line
(`diffusion.errors`).
"""

import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from diffusion.cli.legacy import accept_moved_class_paths
from diffusion.cli.parsing import DEBUG_VARIABLE, add_debug_flag
from diffusion.cli.process_group import closing_process_group
from diffusion.cli.reporting import reporting_user_errors
from diffusion.cli.resume import check_same_training_settings
from diffusion.cli.train_checks import (
    check_hardware_flags,
    check_init_from,
    check_monitored_metric,
    check_option_ranges,
    check_output_folders,
    check_resume_fits,
    check_steps_left,
    check_torchrun_world_size,
)
from diffusion.errors import UserError
from diffusion.training.callbacks import EMA, Checkpoint, SampleGrid
from diffusion.training.callbacks.heartbeat import DEFAULT_DDP_TIMEOUT_S, Heartbeat
from diffusion.training.callbacks.preemption import Preempted
from diffusion.training.checkpoint_files import read_checkpoint
from diffusion.training.module import DiffusionModule
from diffusion.training.run_folders import newest_checkpoint, run_folder_of

SHORTHANDS = (
    "accelerator", "devices", "strategy", "precision", "num_nodes", "max_steps", "max_epochs",
    "accumulate_grad_batches",
)  # fmt: skip


def expand_shorthands(args: list[str]) -> list[str]:
    """Rewrite `--devices 4` / `--devices=4` as `--trainer.devices ...` (LightningCLI's own flags stay)."""
    pattern = re.compile(rf"--({'|'.join(SHORTHANDS)})(=.*)?$")
    return [pattern.sub(r"--trainer.\1\2", arg) for arg in args]


# Ho et al. 2020 (800k steps, gradient clipping 1) and this project's conventions; never a recipe's values.
TRAINER_DEFAULTS = {
    "max_steps": 800_000,
    "val_check_interval": 5000,
    "check_val_every_n_epoch": None,  # validation every val_check_interval steps, across epochs
    "gradient_clip_val": 1.0,
    "log_every_n_steps": 10,
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "runs", "name": "ddpm"},
    },
}


class DiffusionCLI(LightningCLI):
    """LightningCLI for DiffusionModule and any LightningDataModule (no --config: the code defaults).

    `parser_kwargs` are merged into this CLI's own (`main` passes `exit_on_error=False`, so that a bad flag
    raises and is reported in one line rather than printing the usage block).
    """

    def __init__(
        self, args: list[str] | None = None, parser_kwargs: dict[str, Any] | None = None, **kwargs
    ) -> None:
        if args is None:  # from the command line: LightningCLI reads sys.argv itself
            sys.argv[1:] = expand_shorthands(sys.argv[1:])
        else:
            args = expand_shorthands(list(args))
        description = (
            "Train a DDPM. Without --config, trains configs/digits.yaml. Shorthands: "
            + ", ".join(f"--{name}" for name in SHORTHANDS)
            + " stand for --trainer.<name>; --ckpt_path last resumes the newest run of this name. "
            f"A user error ends in one line; --debug (or {DEBUG_VARIABLE}=1) shows its traceback."
        )
        self._resume_checkpoint: dict[str, Any] | None = None
        accept_moved_class_paths()  # configs written before the layered package name the old modules
        super().__init__(
            DiffusionModule,
            LightningDataModule,
            subclass_mode_data=True,
            run=False,
            seed_everything_default=0,
            parser_kwargs={"description": description, **(parser_kwargs or {})},
            save_config_kwargs={"overwrite": True},  # a resumed run writes its config into the same folder
            trainer_defaults=TRAINER_DEFAULTS,
            args=args,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--ckpt_path", type=str | None, default=None,
            help="resume training from this checkpoint (its run's folder goes on); 'last' = the newest checkpoint (by "
            "step) of the newest run of this name",
        )  # fmt: skip
        parser.add_argument(
            "--ddp_timeout", type=float, default=DEFAULT_DDP_TIMEOUT_S,
            help="seconds a rank waits in a collective (DDP) before the job ends, naming the rank that stopped "
            "answering; raise it when rank 0 alone does long work, e.g. a first download in prepare_data",
        )  # fmt: skip
        add_debug_flag(parser)
        parser.add_lightning_class_args(Checkpoint, "checkpoint")
        # No version counter: Lightning would write last-v1.ckpt beside last.ckpt whenever a resumed run's
        # checkpoint settings or folder differ from the saved ones; last.ckpt stays the newest instead.
        parser.set_defaults(
            {
                "checkpoint.save_last": True,
                "checkpoint.filename": "{step}",
                "checkpoint.enable_version_counter": False,
            }
        )
        parser.add_lightning_class_args(EMA, "ema")
        parser.add_lightning_class_args(SampleGrid, "sample_grid")
        parser.set_defaults(
            {
                "data": {"class_path": "diffusion.data.ImageDataModule"},
                "model.network": {"class_path": "diffusion.models.UNet"},
            }
        )
        # The data decides the shape of a sample: the network's input width and the sampler's output shape.
        parser.link_arguments("data.sample_shape", "model.sample_shape", apply_on="instantiate")
        parser.link_arguments("data.normalization", "model.normalization", apply_on="instantiate")
        parser.link_arguments(
            "data.sample_shape", "model.network.init_args.in_channels", compute_fn=lambda shape: shape[0],
            apply_on="instantiate",
        )  # fmt: skip
        # Class-conditional data (--data.conditional true, --data.labels) sizes the network's class embedding
        # and names the classes in the checkpoint; other data (num_classes None or absent) stays unconditional.
        parser.link_arguments(
            "data", "model.network.init_args.num_classes", apply_on="instantiate",
            compute_fn=lambda data: getattr(data, "num_classes", None),
        )  # fmt: skip
        parser.link_arguments(
            "data", "model.class_names", compute_fn=lambda data: getattr(data, "class_names", None),
            apply_on="instantiate",
        )  # fmt: skip
        # A model that learns its variance (--model.variance learned_range) outputs 2C channels: the prediction,
        # then the variance's v.
        parser.link_arguments(
            "data", "model.network.init_args.out_channels", compute_fn=self._network_output_channels,
            apply_on="instantiate",
        )  # fmt: skip

    def _network_output_channels(self, data: LightningDataModule) -> int | None:
        """2C with learned variances, else None (the network's default: its input channels)."""
        if self.config.get("model.variance") != "learned_range":
            return None
        return 2 * data.sample_shape[0]

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        # Here, before LightningCLI seeds (numpy's words for a bad --seed_everything) and prints "Seed set to".
        check_option_ranges(self.config)
        check_hardware_flags(self.config.trainer)

    def before_instantiate_classes(self) -> None:
        config = self.config
        if config.ckpt_path:
            self._resume_checkpoint = self._resolve_resume(config)
        if config.model.init_from:
            check_init_from(config.model.init_from, config.model.network.class_path)
        precision = str(config.trainer.precision)
        if "mixed" in precision and config.trainer.accelerator == "cpu":
            # Lightning has no fp16 AMP on CPU: it swaps in bf16-mixed, so no GradScaler runs either.
            substitute = (
                " (Lightning runs bf16-mixed instead: fp16 AMP needs CUDA)" if precision == "16-mixed" else ""
            )
            rank_zero_warn(
                f"precision={precision} on CPU runs about 10x slower than 32-bit here{substitute}; mixed "
                "precision pays off on CUDA GPUs. For CPU runs use --precision 32."
            )

    def _resolve_resume(self, config) -> dict[str, Any]:
        """Turn --ckpt_path into the checkpoint to resume and point the logger at that run's version folder,
        so the resumed run goes on writing there; return the checkpoint's contents (read once, checked)."""
        logger = config.trainer.logger
        tensorboard = bool(logger) and "TensorBoardLogger" in str(logger.get("class_path", ""))
        if config.ckpt_path == "last":
            if not tensorboard:
                raise ValueError(
                    "--ckpt_path last needs the default TensorBoardLogger; pass a checkpoint path"
                )
            point = newest_checkpoint(logger.init_args.save_dir, logger.init_args.name)
            if point.skipped and rank_zero_only.rank == 0:
                passed = ", ".join(f"{path.name} ({why})" for path, why in point.skipped)
                print(
                    f"warning: --ckpt_path last: passed over unreadable {passed} in {point.path.parent}; "
                    f"resuming from {point.path.name} (step {point.step})",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
            config.ckpt_path = str(point.path)
        checkpoint = read_checkpoint(config.ckpt_path, "--ckpt_path")
        run = run_folder_of(config.ckpt_path)
        if run is not None and tensorboard:
            configured = Path(logger.init_args.save_dir, logger.init_args.name).absolute()
            if (
                configured != run.save_dir / run.name
            ):  # as spelled unless elsewhere: checkpoints record their folder
                logger.init_args.save_dir, logger.init_args.name = str(run.save_dir), run.name
            logger.init_args.version = run.version  # keep logging into the run being resumed
            if run.config_file.is_file():  # the run's own config.yaml stays what it started with
                step = int(checkpoint.get("global_step", 0))
                self.save_config_kwargs["config_filename"] = f"config-resumed-at-step-{step}.yaml"
        return checkpoint

    def after_instantiate_classes(self) -> None:
        check_torchrun_world_size(self.trainer.num_devices, self.trainer.num_nodes)
        timeout = self.config.ddp_timeout
        if timeout <= 0:
            raise UserError(f"--ddp_timeout {timeout:g} is out of range", "pass seconds > 0, e.g. 600")
        self.heartbeat = Heartbeat(timeout)
        self.trainer.callbacks.append(self.heartbeat)
        check_input_shape = getattr(self.model.network, "check_input_shape", None)
        if check_input_shape is not None:
            check_input_shape(self.model.sample_shape)
        if self._resume_checkpoint is not None:
            check_resume_fits(self._resume_checkpoint, self.config.ckpt_path, self.model)
            check_steps_left(self._resume_checkpoint, self.trainer.max_steps)
            self._resume_checkpoint = None  # unmap the file: the resumed run will write its checkpoints
            check_same_training_settings(
                self.config.ckpt_path, self.parser.dump(self.config, skip_none=False)
            )
        check_output_folders(self.trainer, self.config.checkpoint.dirpath)
        check_monitored_metric(self.trainer, self.config.checkpoint.monitor)


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


def new_run_folders(trainer: Trainer) -> list[Path]:
    """The run folder this fit will create and its missing parents, deepest first ([] if it exists)."""
    log_dir = getattr(trainer.logger, "log_dir", None) if trainer.is_global_zero else None
    if log_dir is None:
        return []
    path = Path(log_dir).absolute()
    return [folder for folder in [path, *path.parents] if not folder.exists()]


def remove_unused_run_folders(folders: list[Path]) -> None:
    """After a run failed before its first step: remove the folders it created, unless one holds a checkpoint."""
    if not folders or not folders[0].is_dir() or any(folders[0].rglob("*.ckpt")):
        return
    shutil.rmtree(folders[0])
    for parent in folders[1:]:
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


def fit(cli: DiffusionCLI) -> None:
    created = new_run_folders(cli.trainer)
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
        if isinstance(error, SIGTERMException) and not error.code:
            # Lightning's own SIGTERM path (a signal before training started) exits with status 0.
            raise Preempted(128 + signal.SIGTERM) from error
        raise


def main(args: list[str] | None = None) -> DiffusionCLI:
    """`python train.py [flags]`: build the CLI and fit. A user error ends in one line and exit status 2."""
    with reporting_user_errors(args), closing_process_group():
        if args is None:
            sys.argv[1:] = with_default_config(sys.argv[1:])
        else:
            args = with_default_config(list(args))
        cli = DiffusionCLI(args, parser_kwargs={"exit_on_error": False})
        fit(cli)
        return cli
