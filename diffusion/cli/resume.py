"""The right run to resume: a resume is refused when it would change what the run trains (the checkpoint's optimizer
state, EMA and data order belong to the run's own settings)."""

from typing import Any

import yaml

from diffusion.cli.legacy import same_class
from diffusion.errors import UserError
from diffusion.training.run_folders import run_folder_of

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
