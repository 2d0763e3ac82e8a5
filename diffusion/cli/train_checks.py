"""What train.py checks before any training time is spent, each failure one line naming the flag (a
UserError, `diffusion.errors`): option ranges, the weights to start from or resume, the output folders, and the
world size under torchrun."""

import importlib.util
import os
from typing import Any

import torch
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import StrategyRegistry

from diffusion.cli.checks import check_writable_folder
from diffusion.errors import UserError
from diffusion.training.callbacks.fid import FID, KID, FIDCallback
from diffusion.training.checkpoint_files import read_checkpoint
from diffusion.training.module import TRAIN_LOSS, VAL_LOSS, DiffusionModule
from diffusion.training.run_folders import run_folder_of


def _positive_or_unlimited(value: Any) -> bool:
    return value == -1 or value >= 1


def _steps_or_epoch_fraction(value: Any) -> bool:
    if isinstance(value, int):
        return value >= 1
    return not isinstance(value, float) or 0 < value <= 1  # other forms (a time interval) Lightning checks


# Values that would crash deep inside the run (ZeroDivisionError) or be silently replaced (0 steps -> the
# default): config key, test, what to pass instead.
OPTION_RANGES = [
    ("trainer.max_steps", _positive_or_unlimited, "an integer >= 1, or -1 for no limit"),
    ("trainer.max_epochs", lambda v: _positive_or_unlimited(v), "an integer >= 1, or -1 for no limit"),
    ("trainer.accumulate_grad_batches", lambda v: v >= 1, "an integer >= 1"),
    ("trainer.val_check_interval", _steps_or_epoch_fraction, "steps >= 1, or a fraction of an epoch in (0, 1]"),
    ("trainer.log_every_n_steps", lambda v: v >= 1, "an integer >= 1"),
    ("trainer.num_nodes", lambda v: v >= 1, "an integer >= 1"),
    # Lightning skips clipping for a value <= 0: a negative one would silently train unclipped.
    ("trainer.gradient_clip_val", lambda v: v >= 0, "a number >= 0 (0 turns clipping off)"),
    ("data.init_args.batch_size", lambda v: v >= 1, "an integer >= 1 (per device)"),
    ("model.sampling_steps", lambda v: v >= 1, "an integer >= 1, or null for the sampler's default"),
    ("model.eta", lambda v: 0 <= v <= 1, "a number in [0, 1] (0: deterministic DDIM, 1: DDPM-like)"),
    ("sample_grid.num_samples", lambda v: v >= 1, "an integer >= 1"),
    ("checkpoint.save_top_k", lambda v: v >= -1, "an integer >= -1 (-1 keeps every checkpoint, 0 none)"),
    ("checkpoint.every_n_train_steps", lambda v: v >= 0, "an integer >= 0 (0: no saves by step count)"),
    ("seed_everything", lambda v: 0 <= v < 2**32, "an integer in [0, 2**32), or true for a random seed"),
    ("sample_grid.steps", lambda v: v >= 1, "an integer >= 1, or null for the sampler's default"),
]  # fmt: skip


def check_option_ranges(config) -> None:
    """Raise UserError naming the flag for the first value outside its range (keys a config lacks pass)."""
    for key, valid, allowed in OPTION_RANGES:
        value = config.get(key)
        if value is not None and isinstance(value, int | float) and not valid(value):
            flag = key.replace(".init_args.", ".")
            raise UserError(f"--{flag} {value} is out of range", f"pass {allowed}")
    mode = config.get("checkpoint.mode")
    if mode is not None and mode not in ("min", "max"):
        raise UserError(f"--checkpoint.mode {mode} is not min or max", "pass min (e.g. for val/loss) or max")


def _device_indices(value: Any) -> bool:
    """GPU indices: [0, 1] or "0,1" (Lightning's forms; a CPU takes only a count)."""
    return isinstance(value, list) or "," in str(value)


def _device_count_or_indices(value: Any) -> bool:
    """Lightning's forms of `devices`: a count >= 1, -1 (all), "auto", or GPU indices ([0, 1] or "0,1")."""
    if isinstance(value, list):
        return bool(value) and all(isinstance(index, int) and index >= 0 for index in value)
    text = str(value).strip()
    if text in ("auto", "-1"):
        return True
    if "," in text:
        indices = [part.strip() for part in text.split(",") if part.strip()]
        return bool(indices) and all(index.isdigit() for index in indices)
    return text.isdigit() and int(text) >= 1


def check_hardware_flags(trainer: dict[str, Any]) -> None:
    """--devices, --accelerator and --strategy in forms Lightning takes, on hardware this machine has: Lightning
    itself raises a TypeError, an ImportError or a message without a fix for these."""
    accelerator = str(trainer.get("accelerator", "auto")).lower()
    has_mps = torch.backends.mps.is_available()
    wants_cuda = accelerator == "cuda" or (accelerator == "gpu" and not has_mps)
    if wants_cuda and not torch.cuda.is_available():
        raise UserError(
            f"--accelerator {accelerator}: torch sees no CUDA GPU on this machine",
            "train on the CPU with --accelerator cpu (or auto), or check the driver and CUDA_VISIBLE_DEVICES",
        )
    if accelerator == "mps" and not has_mps:
        raise UserError(
            "--accelerator mps: this machine has no Apple GPU", "pass --accelerator cpu (or auto)"
        )
    if accelerator == "tpu" and importlib.util.find_spec("torch_xla") is None:
        raise UserError(
            "--accelerator tpu needs torch_xla, which is not installed",
            "install it on a TPU host, or pass auto",
        )
    devices = trainer.get("devices", "auto")
    if devices is not None and not _device_count_or_indices(devices):
        raise UserError(
            f"--devices {devices} is not a number of devices",
            "pass a count >= 1 (processes on a CPU, GPUs on a GPU machine), -1 for all, auto, or GPU indices "
            "such as 0,1",
        )
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not (torch.cuda.is_available() or has_mps))
    if on_cpu and _device_indices(devices):
        raise UserError(
            f"--devices {devices} lists GPU indices, but this run is on the CPU",
            "pass a number of processes, e.g. --devices 2",
        )
    strategy = trainer.get("strategy", "auto")
    if isinstance(strategy, str) and strategy != "auto" and strategy not in StrategyRegistry:
        raise UserError(
            f"--strategy {strategy} is not a Lightning strategy",
            "pass auto, ddp, ddp_spawn, ddp_find_unused_parameters_true, fsdp, or another of "
            "lightning.pytorch.strategies.StrategyRegistry",
        )


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
    saved = checkpoint.get("state_dict")
    if not isinstance(saved, dict):
        raise UserError(
            f"--ckpt_path {path} has no state_dict: it is not a checkpoint written by train.py",
            "pass a runs/<name>/version_N/checkpoints/*.ckpt, or --model.init_from for bare weights",
        )
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
    if any(isinstance(callback, FIDCallback) for callback in trainer.callbacks):
        logged |= {FID, KID}
    if monitor not in logged:
        raise UserError(
            f"--checkpoint.monitor {monitor} is not a metric this run logs",
            f"pass one of {', '.join(sorted(logged))} ({FID} and {KID} need the FIDCallback)",
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
