"""What train.py checks before any training time is spent, each failure one line naming the flag (a
UserError, `diffusion.errors`): option ranges, the weights to start from or resume, the output folders, and the
world size under torchrun."""

import os
from typing import Any

from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch import Trainer

from diffusion.cli.flags import check_writable_folder
from diffusion.errors import UserError
from diffusion.training.callbacks.sample_quality import FID, KID, SampleQualityCallback
from diffusion.training.checkpoint_files import check_written_by_train, read_checkpoint
from diffusion.training.module import TRAIN_LOSS, VAL_LOSS, DiffusionModule
from diffusion.training.run_folders import run_folder_of


def check_init_from(path: str, network_class: str) -> None:
    """The weights to start from can be read, and a checkpoint of this project holds the same network class."""
    checkpoint = read_checkpoint(path, "--model.init_from")
    saved = checkpoint.get("hyper_parameters", {}).get("network")
    saved_class = saved.get("class_path") if isinstance(saved, dict) else None
    if saved_class and saved_class != network_class:
        raise UserError(
            f"--model.init_from {path} holds {saved_class.rsplit('.', 1)[-1]} weights (of a run on samples of "
            f"shape {checkpoint['hyper_parameters'].get('sample_shape')}), but this config's network is "
            f"{network_class.rsplit('.', 1)[-1]}",
            "start from a checkpoint of the same kind of run, or pass that run's config (--config)",
        )


def _conditioning(num_classes: int | None) -> str:
    return f"class-conditional, {num_classes} classes" if num_classes else "unconditional"


def check_resume_fits(checkpoint: dict[str, Any], path: str, module: DiffusionModule) -> None:
    """The checkpoint to resume holds this module's weights, by name and shape; else say whose they are."""
    check_written_by_train(checkpoint, path, "--ckpt_path")
    saved = checkpoint["state_dict"]
    expected = module.state_dict()
    missing = [key for key in expected if key not in saved]
    unexpected = [key for key in saved if key not in expected]
    reshaped = [key for key in expected if key in saved and saved[key].shape != expected[key].shape]
    if not (missing or unexpected or reshaped):
        return
    hparams = checkpoint.get("hyper_parameters", {})
    network = hparams.get("network")
    saved_class = network.get("class_path", "?").rsplit(".", 1)[-1] if isinstance(network, dict) else "?"
    saved_classes = (network.get("init_args") or {}).get("num_classes") if isinstance(network, dict) else None
    classes = getattr(module.network, "num_classes", None)
    saved_kind, kind = (
        f" ({_conditioning(n)})" if saved_classes != classes else "" for n in (saved_classes, classes)
    )
    counts = [(len(missing), "weights missing"), (len(unexpected), "unexpected"), (len(reshaped), "reshaped")]
    differences = ", ".join(f"{n} {what}" for n, what in counts if n)
    run = run_folder_of(path)
    fix = "resume it with the config of the run that saved it"
    if run is not None and run.config_file.is_file():
        fix = f"resume it with its own config: --config {run.config_file}"
    raise UserError(
        f"--ckpt_path {path} is from another kind of run: {saved_class}{saved_kind} on samples of shape "
        f"{hparams.get('sample_shape')}, while this config has {type(module.network).__name__}{kind} on "
        f"{module.sample_shape} ({differences}; e.g. {(missing + unexpected + reshaped)[0]})",
        fix,
    )


def check_steps_left(checkpoint: dict[str, Any], max_steps: int) -> None:
    """A resumed run has steps left to train: Lightning would stop at once, exit 0 and add files to the run."""
    step = int(checkpoint.get("global_step", 0))
    if max_steps != -1 and max_steps <= step:
        raise UserError(
            f"--max_steps {max_steps} is not past step {step} of the checkpoint to resume: it would train nothing",
            f"pass --max_steps > {step} to train on",
        )


def check_monitored_metric(trainer: Trainer, monitor: str | None) -> None:
    """--checkpoint.monitor names a metric the run logs: Lightning finds out only at the first validation, when
    the training before it is lost. A callback from outside this project may log more, so with one the check
    is left to Lightning."""
    modules = [type(callback).__module__ for callback in trainer.callbacks]
    if monitor is None or any(not name.startswith(("diffusion.", "lightning.")) for name in modules):
        return
    logged = {TRAIN_LOSS, VAL_LOSS, "step", "epoch"}  # Lightning adds step and epoch
    for callback in trainer.callbacks:
        if isinstance(callback, SampleQualityCallback):
            logged |= {FID, KID} if callback.kid else {FID}
    if monitor not in logged:
        raise UserError(
            f"--checkpoint.monitor {monitor} is not a metric this run logs",
            f"pass one of {', '.join(sorted(logged))} ({FID} needs the SampleQualityCallback, {KID} one that "
            "computes KID, i.e. without reference_stats)",
        )


def check_output_folders(trainer: Trainer, checkpoint_dirpath: str | None) -> None:
    """The run folder and the checkpoint folder can be written, before any training time is spent."""
    save_dir = getattr(trainer.logger, "save_dir", None)
    if save_dir:
        check_writable_folder(save_dir, "--trainer.logger.init_args.save_dir")
    else:
        check_writable_folder(trainer.default_root_dir, "--trainer.default_root_dir")
    if checkpoint_dirpath:
        check_writable_folder(checkpoint_dirpath, "--checkpoint.dirpath")


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
