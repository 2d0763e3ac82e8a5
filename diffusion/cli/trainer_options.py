"""The options of the run that Lightning owns, in one place: the Trainer's defaults (Ho et al.'s and this
project's conventions), the shorthands (`--devices 4` for `--trainer.devices 4`), and their checks (ranges, a
minimum past its maximum, and devices/accelerator/strategy against this machine), made before LightningCLI seeds or
builds anything; and the warnings for settings the run takes but would drop without a word (validation off, a
warmup longer than the run)."""

import importlib.util
import re
from typing import Any

import torch
from jsonargparse import Namespace
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities import GradClipAlgorithmType

from diffusion.cli.command_line import SayOption, as_flag, flags_written, remember_shorthands
from diffusion.cli.written_twice import check_short_and_long_form_agree, said_with_defaults
from diffusion.errors import UserError

SHORTHANDS = (
    "accelerator", "devices", "strategy", "precision", "num_nodes", "max_steps", "max_epochs",
    "accumulate_grad_batches",
)  # fmt: skip


def expand_shorthands(args: list[str]) -> list[str]:
    """Rewrite `--devices 4` / `--devices=4` as `--trainer.devices ...` (LightningCLI's own flags stay); the lines of
    the run say each as typed (`remember_shorthands`)."""
    check_short_and_long_form_agree(args, SHORTHANDS, "trainer")
    remember_shorthands(f"trainer.{key}" for key, _ in flags_written(args) if key in SHORTHANDS)
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


def _positive_or_unlimited(value: Any) -> bool:
    return value == -1 or value >= 1


def _steps_or_epoch_fraction(value: Any) -> bool:
    if isinstance(value, int):
        return value >= 1
    return not isinstance(value, float) or 0 < value <= 1  # other forms (a time interval) Lightning checks


TIME = r"\d+:\d+:\d+:\d+"  # DD:HH:MM:SS, as Lightning reads val_check_interval and max_time
PROFILER_NAMES = ("simple", "advanced", "pytorch", "xla")  # the names Lightning's Trainer takes as a profiler

# Lightning's own options, whose values it would take and then crash on deep inside the run (ZeroDivisionError),
# silently replace (0 steps -> the default) or silently ignore (a negative clip value): key, test, what to pass.
# The options of this project's classes are checked where they are declared (their __init__ or dataclass).
TRAINER_OPTION_RANGES = [
    ("trainer.max_steps", _positive_or_unlimited, "an integer >= 1, or -1 for no limit"),
    ("trainer.max_epochs", _positive_or_unlimited, "an integer >= 1, or -1 for no limit"),
    ("trainer.accumulate_grad_batches", lambda v: v >= 1, "an integer >= 1"),
    ("trainer.val_check_interval", _steps_or_epoch_fraction, "steps >= 1, or a fraction of an epoch in (0, 1]"),
    ("trainer.log_every_n_steps", lambda v: v >= 1, "an integer >= 1"),
    ("trainer.num_nodes", lambda v: v >= 1, "an integer >= 1"),
    ("trainer.gradient_clip_val", lambda v: v >= 0, "a number >= 0 (0 turns clipping off)"),
    ("trainer.check_val_every_n_epoch", lambda v: v >= 1, "an integer >= 1, or null to validate by steps alone"),
    # Lightning takes 0 as "train nothing": the run ended at once, exit status 0, no checkpoint, no word.
    ("trainer.limit_train_batches", _steps_or_epoch_fraction, "batches >= 1, or a fraction of an epoch in (0, 1]"),
    ("seed_everything", lambda v: 0 <= v < 2**32, "an integer in [0, 2**32), or true for a random seed"),
]  # fmt: skip


def check_trainer_option_ranges(config: Namespace, say: SayOption = as_flag) -> None:
    """Raise UserError naming the option (`say`: its flag, or its config file's key) for the first value outside
    its range (keys a config lacks pass)."""
    for key, valid, allowed in TRAINER_OPTION_RANGES:
        value = config.get(key)
        if value is not None and isinstance(value, int | float) and not valid(value):
            raise UserError(f"{say(key, value)} is out of range", f"pass {allowed}")
    clip_algorithms = tuple(GradClipAlgorithmType.supported_types())  # Lightning reads them in any case
    _check_name(
        "trainer.gradient_clip_algorithm",
        config.get("trainer.gradient_clip_algorithm"),
        clip_algorithms,
        True,
        say,
    )
    interval, duration = config.get("trainer.val_check_interval"), config.get("trainer.max_time")
    if isinstance(interval, str) and not re.fullmatch(TIME, interval.strip()):
        raise UserError(
            f"{say('trainer.val_check_interval', interval)} is not a number of steps, a fraction of an epoch or a "
            "time",
            "pass steps >= 1 (e.g. 600), a fraction of an epoch in (0, 1], or a time as DD:HH:MM:SS",
        )
    if isinstance(duration, str) and not re.fullmatch(TIME, duration.strip()):
        raise UserError(
            f"{say('trainer.max_time', duration)} is not a time", "pass DD:HH:MM:SS, e.g. 00:12:00:00"
        )
    profiler = config.get("trainer.profiler")
    if isinstance(profiler, str) and profiler.lower() not in PROFILER_NAMES:  # Lightning's words name no flag
        raise UserError(
            f"{say('trainer.profiler', profiler)} is not a profiler",
            f"choose one of {', '.join(PROFILER_NAMES)}, or pass a profiler's class path",
        )
    _check_least_against_most(config, say)
    _check_precision(config.get("trainer.precision"), say)
    # enable_checkpointing: Lightning's refusal blamed a callbacks list; save_last: the run lost last.ckpt silently
    for key in ("trainer.enable_checkpointing", "checkpoint.save_last"):
        if config.get(key) is False:
            raise UserError(
                f"{say(key, 'false')}: train.py always keeps last.ckpt, the run's resume point (saved at the end, "
                "every --checkpoint.every_n_minutes and when the job is stopped)",
                f"leave --{key} out; to keep fewer checkpoints, pass --checkpoint.save_top_k 0 (last.ckpt alone)",
            )


# Lightning's double precision: the run trained into a dtype error in the EMA update (its float32 copy lerped
# toward float64 weights) and left a run folder without a checkpoint; sampling runs the schedule in float32.
DOUBLE_PRECISION = ("64", "64-true")
TRAINING_PRECISIONS = (
    "32 (32-true), bf16-mixed or 16-mixed (16-true and bf16-true would round the noise schedule)"
)


def _check_precision(precision: Any, say: SayOption) -> None:
    if precision is not None and str(precision) in DOUBLE_PRECISION:
        raise UserError(
            f"{say('trainer.precision', precision)}: train.py does not train in double precision (its EMA, "
            "sample grids and samplers run in float32)",
            f"choose {TRAINING_PRECISIONS}",
        )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_least_against_most(config: Namespace, say: SayOption) -> None:
    """min_steps (min_epochs) no more than max_steps (max_epochs): Lightning stops at the maximum, and the minimum
    it could never reach would be dropped without a word (-1, or no maximum, has no limit to pass)."""
    for unit in ("steps", "epochs"):
        least, most = config.get(f"trainer.min_{unit}"), config.get(f"trainer.max_{unit}")
        if _count(least) and _count(most) and most != -1 and least > most:
            stated = f"{say(f'trainer.min_{unit}', least)} is more than {say(f'trainer.max_{unit}', most)}"
            raise UserError(
                f"{stated}: the run stops at the maximum, so the minimum would never be reached",
                f"lower the minimum to {most} or less (or leave it out), or raise the maximum to {least} or more",
            )


def validation_off_note(config: Namespace, say: SayOption = as_flag) -> str | None:
    """Validation turned off, which a run may want (a speed test, a smoke test): by limit_val_batches 0 (or 0.0),
    Lightning's way, or by --data.val_fraction 0 without --data.val_from_train (no images held out, so no
    validation set); or a --trainer.val_check_interval past the run's last batch (`_interval_past_the_run`). What
    the run will then not do, said once, since validation is what draws the sample grids, plots val/loss and saves
    the step checkpoints. An option no flag or file set is said as the default it is (`said_with_defaults`)."""
    say = said_with_defaults(say)
    value = config.get("trainer.limit_val_batches")
    held_out = config.get("data.init_args.val_fraction")
    key, fix = "trainer.limit_val_batches", "leave --trainer.limit_val_batches out"
    if not _is_zero(value):
        if not _is_zero(held_out) or config.get("data.init_args.val_from_train") is not None:
            return _interval_past_the_run(config, say)
        key, value = "data.init_args.val_fraction", held_out
        fix = "pass --data.val_fraction 0.05 (or, where the data module takes it, --data.val_from_train N)"
    return (
        f"{say(key, f'{value:g}')} turns validation off: this run draws no sample grids "
        "(samples/step_*.png), plots no val/loss and saves no checkpoint at validations, "
        f"only last.ckpt (at the end and every --checkpoint.every_n_minutes){_no_loss_plot(config, say)} — "
        f"{fix} to validate every --trainer.val_check_interval steps, "
        "or pass --checkpoint.every_n_train_steps N for a checkpoint every N steps"
    )


def _interval_past_the_run(config: Namespace, say: SayOption) -> str | None:
    """A validation interval (in batches, as Lightning counts it) the run never reaches: validation is as good as
    off, without the word limit_val_batches 0 gets. Resumed runs count on from their step, so an interval within
    --max_steps may still be passed over by a resume; one past it never validates."""
    interval, steps = config.get("trainer.val_check_interval"), config.get("trainer.max_steps")
    accumulate = config.get("trainer.accumulate_grad_batches") or 1
    if not (_count(interval) and _count(steps) and _count(accumulate)) or steps < 1:
        return None
    batches = steps * accumulate
    if interval <= batches:
        return None
    counted = f"{say('trainer.max_steps', steps)}"
    if accumulate > 1:  # Lightning counts the interval in batches: accumulate_grad_batches of them a step
        counted += f" × {say('trainer.accumulate_grad_batches', accumulate)} batches"
    return (
        f"{say('trainer.val_check_interval', interval)} is past {counted}: this run never validates, so it draws "
        "no sample grids (samples/step_*.png), plots no val/loss and saves no checkpoint at validations, "
        f"only last.ckpt{_no_loss_plot(config, say)} — pass --trainer.val_check_interval {batches} or less "
        "to validate at least once (at the last step)"
    )


def _no_loss_plot(config: Namespace, say: SayOption) -> str:
    """The clause of a note on a run without validation that says it writes no loss.png: a new run shorter than
    log_every_n_steps logs no train/loss either, and the plot is drawn only when it has a point (a resumed run
    has its earlier points)."""
    steps, every = config.get("trainer.max_steps"), config.get("trainer.log_every_n_steps")
    if config.get("ckpt_path") or not (_count(steps) and _count(every)) or steps < 1 or steps >= every:
        return ""
    return (
        f", and as {say('trainer.max_steps', steps)} is less than {say('trainer.log_every_n_steps', every)} "
        "it logs no train/loss either, so it writes no loss.png"
    )


def _is_zero(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def warmup_note(config: Namespace, say: SayOption = as_flag) -> str | None:
    """The model's learning-rate warmup longer than the run (max_steps, when it has one): the rate rises all run
    long and never reaches the one set. A warning, not a refusal: a short test run, or a run to be resumed with
    a larger max_steps, may mean it."""
    warmup, steps = config.get("model.warmup_steps"), config.get("trainer.max_steps")
    if not (_count(warmup) and _count(steps)) or steps < 1 or warmup <= steps:
        return None
    say = said_with_defaults(say)
    stated = f"{say('model.warmup_steps', warmup)} is more than {say('trainer.max_steps', steps)}"
    return (
        f"{stated}: the learning rate is still warming up when the run ends, "
        f"and never reaches --model.lr (at most {steps}/{warmup} of it) — "
        f"pass --model.warmup_steps {steps} or less, unless this run is a short test or is to be resumed longer"
    )


def step_checkpoints_note(config: Namespace, say: SayOption = as_flag) -> str | None:
    """A step-checkpoint interval past the run's last step: Lightning then saves at those steps instead of at
    validations, so the run keeps last.ckpt alone, without a word (a plain run keeps its validations' too)."""
    every, steps = config.get("checkpoint.every_n_train_steps"), config.get("trainer.max_steps")
    if not (_count(every) and _count(steps)) or steps < 1 or every <= steps:
        return None
    say = said_with_defaults(say)
    return (
        f"{say('checkpoint.every_n_train_steps', every)} is more than {say('trainer.max_steps', steps)}: "
        "this run reaches no step checkpoint, and with the interval set it saves none at validations either, "
        "so it keeps last.ckpt alone — pass "
        f"--checkpoint.every_n_train_steps {steps} or less, or leave it out to save at validations"
    )


def unused_root_dir_note(config: Namespace, say: SayOption = as_flag) -> str | None:
    """--trainer.default_root_dir with a logger: Lightning puts the run under the logger's save_dir (the recipes'
    `runs`), and the folder given went unused without a word."""
    root, logger = config.get("trainer.default_root_dir"), config.get("trainer.logger")
    loggers = logger if isinstance(logger, list) else [logger]
    save_dirs = [
        item.get("init_args", {}).get("save_dir")
        for item in loggers
        if hasattr(item, "get") and item.get("class_path")
    ]
    if root is None or not save_dirs or save_dirs[0] is None:
        return None
    return (
        f"{say('trainer.default_root_dir', root)} does not move the run: with a logger, "
        f"the run folder is under the logger's save_dir ({save_dirs[0]}) — pass --trainer.logger.init_args.save_dir "
        f"{root} to put it there"
    )


def _check_name(
    key: str, written: Any, names: tuple[str, ...], any_case: bool = False, say: SayOption = as_flag
) -> None:
    """A name Lightning takes from a few (as written, or `any_case`); its own refusal names no flag. A class
    instead of a name passes."""
    if isinstance(written, str) and (written.lower() if any_case else written) not in names:
        raise UserError(f"{say(key, written)} is not one of the choices", f"choose one of {', '.join(names)}")


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


def runs_on_cpu(trainer: dict[str, Any]) -> bool:
    """Whether --accelerator (cpu, or auto: what Lightning picks) puts the run on the CPU."""
    accelerator = str(trainer.get("accelerator", "auto")).lower()
    has_gpu = torch.cuda.is_available() or torch.backends.mps.is_available()
    return accelerator == "cpu" or (accelerator == "auto" and not has_gpu)


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
    names = ("auto", "gpu", *AcceleratorRegistry.available_accelerators())
    _check_name("accelerator", trainer.get("accelerator", "auto"), names)  # as written: CPU is none of them
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
    if runs_on_cpu(trainer) and _device_indices(devices):
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


def _single_device(trainer: dict[str, Any]) -> bool:
    """Whether the run is certainly one process on one device (forms of `devices` that could mean more: no)."""
    if int(trainer.get("num_nodes") or 1) != 1:
        return False
    devices = trainer.get("devices", "auto")
    if isinstance(devices, list):
        return len(devices) == 1
    text = str(devices).strip()
    if text.endswith(","):  # "0,": one GPU index
        return text[:-1].strip().isdigit()
    if text == "auto":
        accelerator = str(trainer.get("accelerator", "auto")).lower()
        on_cuda = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
        return not on_cuda or torch.cuda.device_count() == 1  # Lightning's "auto" on a CPU is one process
    return text == "1"


def drop_ddp_on_one_device(trainer: dict[str, Any]) -> str | None:
    """`--strategy ddp` (or another ddp_* name) on one device becomes Lightning's single-device strategy, and the
    note saying so is returned. With one process DDP only costs: every step copies the gradients into its
    buckets and back, and it cuts a compiled network into a graph per bucket. A DDP strategy given as a class
    (`--trainer.strategy.class_path DDPStrategy`) is kept: that is how to test DDP itself
    (NCCL, gloo) on one device."""
    strategy = trainer.get("strategy", "auto")
    if not (isinstance(strategy, str) and strategy.startswith("ddp") and _single_device(trainer)):
        return None
    trainer["strategy"] = "auto"
    return (
        f"--strategy {strategy} on one device: training without the DDP wrapper, which would only add a "
        "gradient copy per step and cut a compiled network into pieces (pass --trainer.strategy.class_path "
        "DDPStrategy to run DDP on one device anyway)"
    )
