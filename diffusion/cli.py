"""The command line: LightningCLI with shorthands, the default recipe and run folders.

`python train.py` trains the default recipe (digits, CPU-friendly). Every Trainer, model and data argument
is a flag (`--trainer.*`, `--model.*`, `--data.*`, `--ema.*`, `--checkpoint.*`, `--sample_grid.*`), configs
in `configs/` hold overrides, and the common Trainer flags have shorthands (`--devices 4`).
"""

import os
import re
import signal
import sys
from pathlib import Path

from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch import LightningDataModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_warn

from diffusion.callbacks import EMA, Checkpoint, SampleGrid
from diffusion.checkpoints import latest_run
from diffusion.module import DiffusionModule

SHORTHANDS = (
    "accelerator", "devices", "strategy", "precision", "num_nodes", "max_steps", "max_epochs",
    "accumulate_grad_batches",
)  # fmt: skip


def expand_shorthands(args: list[str]) -> list[str]:
    """Rewrite `--devices 4` / `--devices=4` as `--trainer.devices ...` (LightningCLI's own flags stay)."""
    pattern = re.compile(rf"--({'|'.join(SHORTHANDS)})(=.*)?$")
    return [pattern.sub(r"--trainer.\1\2", arg) for arg in args]


class DiffusionCLI(LightningCLI):
    def __init__(self, args: list[str] | None = None, **kwargs) -> None:
        if args is None:  # from the command line: LightningCLI reads sys.argv itself
            sys.argv[1:] = expand_shorthands(sys.argv[1:])
        else:
            args = expand_shorthands(list(args))
        super().__init__(
            DiffusionModule,
            LightningDataModule,
            subclass_mode_data=True,
            run=False,
            seed_everything_default=0,
            parser_kwargs={
                "description": "Train a DDPM. Without --config, trains configs/digits.yaml. Shorthands: "
                + ", ".join(f"--{name}" for name in SHORTHANDS)
                + " stand for --trainer.<name>; --ckpt_path last resumes the newest run of this name."
            },
            save_config_kwargs={"overwrite": True},  # a resumed run writes its config into the same folder
            trainer_defaults={
                "max_steps": 4000,
                "val_check_interval": 500,
                "check_val_every_n_epoch": None,
                "gradient_clip_val": 1.0,
                "log_every_n_steps": 10,
                "logger": {
                    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                    "init_args": {"save_dir": "runs", "name": "digits"},
                },
            },
            args=args,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--ckpt_path", type=str | None, default=None,
            help="resume training from this checkpoint; 'last' = the newest last.ckpt of this run's name",
        )  # fmt: skip
        parser.add_lightning_class_args(Checkpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.filename": "{step}"})
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
        # Class-conditional data (--data.conditional true) sizes the network's class embedding and names the
        # classes in the checkpoint; other data modules (num_classes None or absent) keep the network unconditional.
        parser.link_arguments(
            "data", "model.network.init_args.num_classes", compute_fn=lambda data: getattr(data, "num_classes", None),
            apply_on="instantiate",
        )  # fmt: skip
        parser.link_arguments(
            "data", "model.class_names", compute_fn=lambda data: getattr(data, "class_names", None),
            apply_on="instantiate",
        )  # fmt: skip

    def before_instantiate_classes(self) -> None:
        config = self.config
        if config.ckpt_path == "last":
            logger = config.trainer.logger
            if not (logger and "TensorBoardLogger" in str(logger.get("class_path", ""))):
                raise ValueError(
                    "--ckpt_path last needs the default TensorBoardLogger; pass a checkpoint path"
                )
            version, path = latest_run(logger.init_args.save_dir, logger.init_args.name)
            config.ckpt_path = str(path)
            logger.init_args.version = version  # keep logging into the run being resumed
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

    def after_instantiate_classes(self) -> None:
        check_torchrun_world_size(self.trainer.num_devices, self.trainer.num_nodes)


def check_torchrun_world_size(num_devices: int, num_nodes: int) -> None:
    """Under torchrun, the Trainer must use exactly the processes torchrun started.

    Lightning checks this only at fit time and only for a multi-device strategy: with the default
    `--devices auto` on CPU (or `--devices 1`) each of torchrun's processes silently trains its own copy of
    the model, all writing the same run folder. Fail at startup instead, saying which flags to pass.
    """
    if not TorchElasticEnvironment.detect():
        return
    world_size = int(os.environ["WORLD_SIZE"])
    if num_devices * num_nodes == world_size:
        return
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    raise ValueError(
        f"torchrun started WORLD_SIZE={world_size} processes ({per_node} per node), but the Trainer is set to "
        f"devices={num_devices} x num_nodes={num_nodes} = {num_devices * num_nodes}. Pass --devices {per_node} "
        f"--num_nodes {world_size // per_node}: --devices must equal torchrun's --nproc_per_node and "
        "--num_nodes its --nnodes."
    )


DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits.yaml"


def with_default_config(args: list[str]) -> list[str]:
    """No --config given: train the default recipe, configs/digits.yaml (when this is a source checkout)."""
    if any(arg == "--config" or arg.startswith("--config=") for arg in args) or not DEFAULT_CONFIG.is_file():
        return args
    return ["--config", str(DEFAULT_CONFIG), *args]


def main(args: list[str] | None = None) -> DiffusionCLI:
    if args is None:
        sys.argv[1:] = with_default_config(sys.argv[1:])
    else:
        args = with_default_config(list(args))
    cli = DiffusionCLI(args)
    try:
        cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=cli.config.ckpt_path)
    except BaseException:
        # Lightning ends the other local ranks only on Ctrl+C. After any other error on rank 0 they would wait
        # in a collective until the process-group timeout (30 min under NCCL; gloo notices the closed socket).
        kill = getattr(cli.trainer.strategy.launcher, "kill", None)
        if kill is not None:
            kill(signal.SIGKILL)
        raise
    return cli
