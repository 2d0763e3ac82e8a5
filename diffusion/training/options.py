"""The training options of `DiffusionModule`, checked when it is built: each bad value is a ValueError of the
form `<what is wrong> — <how to fix it>`, which the commands print as one line (diffusion.errors), before any
training time is spent. Values that would not crash but train nonsense (a min-SNR weight of 0 zeroes the loss,
a negative one turns descent into ascent) are refused here too."""

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Literal

import lightning as L
import torch

from diffusion.core.sampling import DEFAULT_SAMPLER, OPTION_OWNERS, SAMPLERS, SamplingOptions
from diffusion.errors import (
    InvalidValue,
    OutOfRange,
    WeightsDoNotFit,
    WrongType,
    check_choice,
    check_real,
    check_weights_fit,
    check_whole_number,
)
from diffusion.generation.arguments import SEED_LIMIT
from diffusion.generation.render import check_normalization
from diffusion.training.option_notes import SayValue

MIN_SNR_GAMMA = 5.0  # DiffusionModule's default (Hang et al. 2023)


def check_training_options(
    *, choices: list[tuple[str, Any, Any]], lr: float, warmup_steps: int, adam_betas: tuple[float, float],
    weight_decay: float, min_snr_gamma: float, label_dropout: float, network_num_classes: int | None,
    variance: str = "fixed", sample_shape: tuple[int, ...] = (1, 8, 8), sampling_variance: str | None = None,
    prediction_type: str = "eps", zero_terminal_snr: bool = False, offset_noise: float = 0.0,
) -> None:  # fmt: skip
    for name, value, allowed in choices:
        check_choice(name, value, allowed)
    for name, value in (
        ("lr", lr),
        ("weight_decay", weight_decay),
        ("min_snr_gamma", min_snr_gamma),
        ("label_dropout", label_dropout),
        ("offset_noise", offset_noise),
    ):
        check_real(name, value)  # not True for 1.0, nor text
    check_whole_number("warmup_steps", warmup_steps)
    if not isinstance(adam_betas, list | tuple):  # a bare number ended in "'float' object is not iterable"
        raise WrongType("adam_betas", adam_betas, "two numbers", "pass e.g. {--adam_betas} '[0.9, 0.999]'")
    for beta in adam_betas:
        check_real("adam_betas", beta, "pass e.g. {--adam_betas} '[0.9, 0.999]'")
    if not (math.isfinite(lr) and lr > 0):
        raise OutOfRange("lr", lr, "a finite number > 0", "pass e.g. {--lr} 2e-4 (Ho et al.)")
    if warmup_steps < 0:
        raise OutOfRange("warmup_steps", warmup_steps, ">= 0", "pass 0 for no warmup, or steps > 0")
    if len(adam_betas) != 2 or not all(0 <= beta < 1 for beta in adam_betas):
        raise OutOfRange(
            "adam_betas",
            list(adam_betas),
            "two numbers in [0, 1)",
            "pass e.g. {--adam_betas} '[0.9, 0.999]'",
        )
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        raise OutOfRange("weight_decay", weight_decay, ">= 0", "pass 0 (the default) for none")
    if not (math.isfinite(min_snr_gamma) and min_snr_gamma > 0):
        raise OutOfRange(
            "min_snr_gamma",
            min_snr_gamma,
            "> 0 (0 zeroes the min-SNR loss, a negative value ascends it)",
            "pass e.g. 5 (Hang et al. 2023)",
        )
    if not 0.0 <= label_dropout < 1.0:
        raise OutOfRange("label_dropout", label_dropout, "in [0, 1)", "pass e.g. 0.1 (Ho & Salimans)")
    if label_dropout > 0 and network_num_classes is None:
        raise InvalidValue(
            f"{{--label_dropout}} {label_dropout} needs a class-conditional network",
            "train with {LightningDataModule:--conditional} true (the CLI then sets the network's num_classes)",
        )
    if variance == "learned_range" and len(sample_shape) != 3:
        raise InvalidValue(
            "variance='learned_range' is for images: its L_vlb gives probabilities to 8-bit pixels",
            "train vectors with {--variance} fixed",
        )
    if sampling_variance == "learned_range" and variance != "learned_range":
        raise InvalidValue(
            "{--sampling.variance} learned_range needs a model that learns its variance",
            "train with {--variance} learned_range, or sample with fixedlarge or fixedsmall",
        )
    if zero_terminal_snr and prediction_type == "eps":
        raise InvalidValue(
            "zero_terminal_snr needs v- or x0-prediction: eps-prediction is undefined at alpha_bar_T = 0 (x_T is "
            "pure noise)",
            "pass {--prediction_type} v (Lin et al. 2024)",
        )
    if not (math.isfinite(offset_noise) and offset_noise >= 0):
        raise OutOfRange("offset_noise", offset_noise, "a finite number >= 0", "pass e.g. 0.1 (Guttenberg)")
    if offset_noise and len(sample_shape) != 3:
        raise InvalidValue(
            "offset_noise shifts an image's channels: it is for images",
            "train vectors with {--offset_noise} 0",
        )


def checked_noise_seed(noise_seed: Any) -> int | None:
    """`noise_seed` as an int (or None), refused unless a whole number in [0, 2**64), as `generate`'s seed
    (`checked_seed`): the per-sample noise takes a seed modulo 2**64, so -1 or 2**64 + 5 would train with the noise
    of 2**64 - 1 or 5 without a word."""
    if noise_seed is None:
        return None
    fix = f"pass a seed from 0 to {SEED_LIMIT - 1}, or leave it unset for the seed given to seed_everything"
    number = check_whole_number("noise_seed", noise_seed, fix=fix)
    if not 0 <= number < SEED_LIMIT:
        raise OutOfRange("noise_seed", noise_seed, "a whole number in [0, 2**64 - 1]", fix)
    return number


NORMALIZATION_FIX = (
    "pass the data module's normalization (data.normalization: data = model * scale + shift, one shift and one "
    "scale per channel or feature), or None"
)


def checked_module_normalization(
    normalization: Any, sample_shape: tuple[int, ...]
) -> dict[str, list[float]] | None:
    """`normalization` None, or a dict of `shift` and `scale` as `denormalize` takes them (each finite, every scale
    > 0: `check_normalization`), one of each per channel (images) or feature (vectors) of `sample_shape`: a module
    built for sampling or export is never fitted, so a wrong one was found only when its samples were rendered,
    by a line whose fix was to pass the module's normalization, the very one given. Returned as a checkpoint and
    an export's config.json store it, lists of floats: what a user computes (tensors, numpy arrays, tuples) is
    converted, as a tensor kept in the hyperparameters failed the fit's comparison with the data's and the
    export's JSON."""
    if normalization is None:
        return None
    if not isinstance(normalization, Mapping):
        raise WrongType("normalization", normalization, "a dict of 'shift' and 'scale'", NORMALIZATION_FIX)
    missing = [key for key in ("shift", "scale") if key not in normalization]
    if missing:
        raise InvalidValue(
            f"normalization={dict(normalization)} has no {' and no '.join(missing)}", NORMALIZATION_FIX
        )
    plain = check_normalization(normalization, "normalization", NORMALIZATION_FIX)
    counts = {key: len(plain[key]) for key in ("shift", "scale")}
    shape = tuple(sample_shape)
    if counts["shift"] != shape[0] or counts["scale"] != shape[0]:
        kind = ("channel" if len(shape) == 3 else "feature") + "s" * (shape[0] != 1)
        raise InvalidValue(
            f"normalization has {counts['shift']} shift and {counts['scale']} scale values, "
            f"but the samples of sample_shape={shape} have {shape[0]} {kind}",
            NORMALIZATION_FIX,
        )
    return plain


def checked_compile_training(compile_training: Any, compile: Any = None) -> bool | Literal["cuda"]:
    """`compile_training`, or `compile`, its old name, where given (it wins, as configs written before it read):
    True, False or "cuda". Another value was refused as "choose one of ['cuda']", which hid True and False."""
    name, value = ("compile_training", compile_training) if compile is None else ("compile", compile)
    if value is True or value is False:
        return value
    if isinstance(value, str) and value == "cuda":
        return "cuda"
    old = "" if compile is None else " (compile is the old name of compile_training)"
    raise InvalidValue(
        f"{name}={value!r} is not supported{old}",
        "pass True, False or 'cuda' (compile on a CUDA device only)",
    )


def unused_training_options(
    *, loss_weighting: str, min_snr_gamma: float, compile_training: bool | str, compile_mode: str | None,
    sampling: SamplingOptions, compile_channels_last: bool = False,
) -> list[Callable[[SayValue], str]]:  # fmt: skip
    """Notes on options given that nothing uses, because the option that would use them is not set (a warning,
    not an error: the run is still the one asked for, less the option): min_snr_gamma without min-SNR weighting,
    compile_mode or compile_channels_last without compiling, a sampling option the model's sampler does not have.
    An option whose default is a value rather than None counts as given when it differs from that default. Each
    note says its options by `option` (`OptionNote`): `compile_mode=default` in Python, `--model.compile_mode
    default` on train.py's command line."""
    notes: list[Callable[[SayValue], str]] = []
    if loss_weighting != "min_snr" and min_snr_gamma != MIN_SNR_GAMMA:
        notes.append(partial(_not_weighted, min_snr_gamma, loss_weighting))
    uncompiled = {"compile_mode": compile_mode, "compile_channels_last": compile_channels_last or None}
    for name, value in uncompiled.items():
        if value is not None and compile_training is False:
            notes.append(partial(_not_compiled, name, value))
    sampler = SAMPLERS[sampling.sampler or DEFAULT_SAMPLER]
    for name, value in sampling.as_kwargs().items():
        if name in OPTION_OWNERS and sampler not in OPTION_OWNERS[name]:
            takers = ", ".join(owner.name for owner in OPTION_OWNERS[name])
            notes.append(partial(_not_of_the_sampler, name, value, sampler.name, takers))
    return notes


def _not_weighted(min_snr_gamma: float, loss_weighting: str, option: SayValue) -> str:
    return (
        f"{option('min_snr_gamma', min_snr_gamma)} is not used: {option('loss_weighting', loss_weighting)} — pass "
        f"{option('loss_weighting', 'min_snr')} to weight the loss by it"
    )


def _not_compiled(name: str, value: Any, option: SayValue) -> str:
    return (
        f"{option(name, value)} is not used: the training step is not compiled — pass "
        f"{option('compile_training', True)} (or cuda) to compile it"
    )


def _not_of_the_sampler(name: str, value: Any, sampler: str, takers: str, option: SayValue) -> str:
    return (
        f"{option(f'sampling.{name}', value)} is no option of the {sampler} sampler: not used by this model's "
        f"sampling ({takers} take it, as the default of a command that samples with one)"
    )


def check_trainer_precision(precision: str) -> None:
    """Refuse true half precision (`16-true`, `bf16-true`): it casts every buffer (Lightning's HalfPrecision calls
    module.to(dtype)), and the noise schedule loses the precision its small betas need; mixed precision keeps it
    float32."""
    if precision in ("16-true", "bf16-true"):
        raise InvalidValue(
            f"precision={precision} is not supported: it would cast the noise schedule to half precision",
            f"use {{--precision}} {precision.replace('-true', '-mixed')} (the network runs in half, the "
            "schedule and loss stay float32)",
            L.Trainer,
        )


# ---- resuming: the settings a module must share with the checkpoint it resumes ----------------------------------
# As train.py's check_same_training_settings (diffusion/cli/resumed_state.py): every hyperparameter changes what is trained
# except how to sample, where the first weights came from and how the training step is compiled. The network is
# held to the checkpoint by its weights (a network built in Python is not among the hyperparameters). The samples'
# shape is compared (a UNet's weights fit any size: 16x16 digits went on at 8x8); the data's normalization and class
# names are held to the data (`check_fits_data`, the first batch), as train.py compares the data's own settings.
NOT_TRAINING = frozenset({
    "network", "sampling", "init_from", "compile", "compile_training", "compile_mode", "compile_channels_last",
    "_instantiator", "normalization", "class_names",
})  # fmt: skip


def _plain(value: Any) -> Any:
    """Tuples as lists and a jsonargparse Namespace as a dict, at any depth: as a checkpoint compares."""
    as_dict = getattr(value, "as_dict", None)
    value = as_dict() if callable(as_dict) else value
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return [_plain(item) for item in value] if isinstance(value, list | tuple) else value


def differing_settings(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved, current) for each training setting of two modules' hyperparameters that differs; a key one of them
    lacks (a checkpoint written by an older version) is not compared."""
    return [
        (key, _plain(saved[key]), _plain(current[key]))
        for key in sorted(saved.keys() & current.keys())
        if key not in NOT_TRAINING and _plain(saved[key]) != _plain(current[key])
    ]


def check_resumed_checkpoint(
    module: torch.nn.Module, checkpoint: Mapping[str, Any], path: Any, stage: str | None = "fit"
) -> None:
    """Refuse to resume `checkpoint` (read from `path`) into `module` when its training settings differ (the
    optimizer state, EMA and schedule belong to them: another prediction_type trained on without a word) or its
    weights do not fit (torch's size-mismatch report): what train.py checks of --ckpt_path, for a fit of the
    user's own, `trainer.fit(module, ..., ckpt_path=path)`, before the weights are loaded. Of another `stage`
    (`trainer.validate(module, ..., ckpt_path=path)`, test, predict) only the weights are its to check."""
    if stage != "fit":
        weights = checkpoint.get("state_dict")
        if isinstance(weights, Mapping):
            fix = (
                f"{getattr(stage, 'value', stage)} it with a DiffusionModule of the network it was trained with "
                f"(DiffusionModule.load_from_checkpoint({str(path)!r}) builds it), without ckpt_path"
            )
            check_weights_fit(module, weights, f"ckpt_path {path}", fix, type(module))
        return
    hparams = checkpoint.get("hyper_parameters")
    settings = (
        differing_settings(hparams, getattr(module, "hparams", {})) if isinstance(hparams, Mapping) else []
    )
    misfit = None
    weights = checkpoint.get("state_dict")
    refit = (
        f"resume it with a DiffusionModule of the network it was trained with "
        f"(DiffusionModule.load_from_checkpoint({str(path)!r}) builds it), or train this network as a new run, "
        "without ckpt_path (its weights do not fit it, so neither does {--init_from})"
    )
    if isinstance(weights, Mapping):
        try:
            check_weights_fit(module, weights, f"ckpt_path {path}", refit, type(module))
        except WeightsDoNotFit as error:
            misfit = error
    if not settings:
        if misfit is not None:
            raise misfit
        return
    shown = "; ".join(f"{{--{key}}} {theirs!r} there, {ours!r} here" for key, theirs, ours in settings[:4])
    more = f" (and {len(settings) - 4} more)" if len(settings) > 4 else ""
    weights_too = "" if misfit is None else f"; and its weights do not fit this module ({misfit.summary})"
    own = (
        f"resume it with a DiffusionModule of its own settings (DiffusionModule.load_from_checkpoint({str(path)!r}) "
        "builds one; pass network= for a network built in Python)"
    )
    raise InvalidValue(
        f"ckpt_path {path} belongs to a run trained with other settings: {shown}{more}{weights_too}",
        own
        + (
            ", or train this module as a new run, without ckpt_path"
            if misfit is not None
            else f", or start a new run from its weights: DiffusionModule(..., init_from={str(path)!r}), fitted "
            "without ckpt_path"
        ),
        type(module),
    ) from misfit
