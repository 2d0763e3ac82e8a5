"""This project's export format, a folder readable without Lightning or pickle: ``model.safetensors`` (the network's
state_dict, one set of weights) and ``config.json`` (everything sampling needs).

``config.json`` holds ``hyper_parameters``, the DiffusionModule's settings as a checkpoint saves them (the network's
``class_path`` and ``init_args``, the schedule, ``prediction_type``, ``sample_shape``, ``normalization``,
``class_names``, the sampling defaults), ``weights`` ("ema" or "raw": which set this is), and ``betas``: the
schedule's betas, for code outside this package (this package rebuilds them from the settings), and
``weights_sha256``: the SHA-256 of ``model.safetensors``, checked when the export is loaded (safetensors files
carry no checksum of their own; exports written without it load unchecked). Reading it runs no code: JSON and
safetensors only, and the network must be one of this project's (`NETWORKS`).
"""

import inspect
import json
import math
import os
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from safetensors.torch import save

from diffusion.core.schedule import schedule_betas
from diffusion.errors import (
    InvalidValue,
    MissingFile,
    UserError,
    WeightsDoNotFit,
    WrongType,
    check_choice,
    check_weights_fit,
)
from diffusion.training.atomic_writes import writing_whole
from diffusion.training.checkpoint_files import check_finite
from diffusion.training.export_files import (
    CONFIG,
    FIX,
    FORMAT,
    FORMAT_VERSION,
    WEIGHTS,
    read_export_weights,
    sha256_of,
)
from diffusion.training.from_diffusers import INIT_FROM
from diffusion.training.model_settings import NETWORKS, check_model_settings, schedule_of
from diffusion.training.module import DiffusionModule

NETWORK_FIX = 'pass checkpoint["hyper_parameters"]["network"] of the checkpoint the module was loaded from'
Weights = Literal["ema", "raw"]
NOT_FINITE_FIX = "its training diverged: export a module loaded from an earlier checkpoint of the run"
# The Python export writers' fixes (write_export's, save_pipeline's) for a full disk, and for files set aside
# that could not be put back
EXPORT_ON_ANOTHER_DISK = (
    "free space on that disk, or write the export into another folder; an export already there is as it was"
)
WRITE_AGAIN = "or write the export again into a new folder"


def write_export(
    module: DiffusionModule, network: dict[str, Any], folder: str | os.PathLike, weights: str
) -> None:
    """Write `module` into `folder` (which exists): its network's weights and settings, `network` being the
    checkpoint's {"class_path", "init_args"} of the network and `weights` which set the module holds. Both files
    are written whole, or neither (an export already in `folder` stays as it was): a full disk or a folder that
    refuses writes raises DiskFull, FlaggedFolder or CannotWrite (OSErrors too), naming `folder`."""
    check_export_arguments(module, folder)
    if not Path(folder).is_dir():
        raise MissingFile(f"folder={folder} does not exist", "make the folder first, or pass one that exists")
    if not isinstance(network, dict):
        raise WrongType("network", network, "a dict", NETWORK_FIX)
    if not isinstance(network.get("init_args"), dict):
        raise InvalidValue(
            f"network={summary(network)} holds no init_args (the network's settings)", NETWORK_FIX
        )
    check_choice("weights", weights, Weights)
    folder = Path(folder)
    name = type(module.network).__name__
    if name not in NETWORKS:
        raise InvalidValue(f"a {name} network cannot be exported", f"export a network of {sorted(NETWORKS)}")
    check_network_of(module.network, network)  # another class or other settings: an export that cannot load
    hparams = {
        **module.hparams,
        "network": {"class_path": f"diffusion.models.{name}", "init_args": network["init_args"]},
    }
    state = {key: value.detach().cpu().contiguous() for key, value in module.network.state_dict().items()}
    # Written whole or not at all (`writing_whole`: a staging folder, then moved in): a full disk left a truncated
    # model.safetensors without config.json, said as a bare OSError.
    with writing_whole(folder, "the export", EXPORT_ON_ANOTHER_DISK, WRITE_AGAIN) as staged:
        # Serialized here and written by Python: safetensors' own writer says a full disk as a SafetensorError,
        # which names no errno; a Python write raises the OSError that is named as a full disk.
        with open(staged / WEIGHTS, "wb") as file:
            file.write(save(state, metadata={"format": "pt"}))
        config = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "weights": weights,
            "hyper_parameters": hparams, "betas": float64_betas(module).tolist(),
            "weights_sha256": sha256_of(staged / WEIGHTS),
        }  # fmt: skip
        (staged / CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def check_network_of(built: torch.nn.Module, network: dict[str, Any]) -> None:
    """Refuse (naming `network`) a config the module's network was not built with: another class (its class_path
    was replaced by the module's without a word), or init_args that build a network of other weights or other
    settings (the export was written, and loading it refused the folder). The network is built again from
    `network` on the meta device (no memory, no time) and compared with the module's, part by part."""
    name = type(built).__name__
    given = network.get("class_path")
    package, _, class_name = str(given).rpartition(".")
    # diffusion.UNet (as the recipes write it), diffusion.models.UNet, diffusion.models.unet.UNet
    ours = package in ("", "diffusion", "diffusion.models") or package.startswith("diffusion.models.")
    if not isinstance(given, str) or not ours or class_name != name:
        raise InvalidValue(
            f"network['class_path']={given!r} is not the class of the module's network ({name})",
            NETWORK_FIX,
        )
    try:
        with torch.device("meta"):
            rebuilt = type(built)(**network["init_args"])
    except (TypeError, ValueError) as error:  # an unknown setting; a value its own check refuses
        raise InvalidValue(f"network['init_args'] build no {name} ({error})", NETWORK_FIX) from error
    ours_now, theirs = parts_of(built), parts_of(rebuilt)
    differing = [key for key in {**ours_now, **theirs} if ours_now.get(key) != theirs.get(key)]
    if differing:
        key = differing[0]
        raise InvalidValue(
            f"network['init_args'] build a {name} other than the module's ({len(differing)} parts differ, e.g. "
            f"{key}: {theirs.get(key, 'none')} from init_args, {ours_now.get(key, 'none')} in the module)",
            NETWORK_FIX,
        )


def parts_of(network: torch.nn.Module) -> dict[str, object]:
    """What makes a network what it is, by name: each weight's shape, and each submodule's class and plain settings
    (a Dropout's p, an attention block's num_heads, a convolution's stride)."""
    parts: dict[str, object] = {key: tuple(value.shape) for key, value in network.state_dict().items()}
    for path, part in network.named_modules():
        prefix = f"{path}." if path else ""
        parts[f"{prefix}class"] = type(part).__name__
        for setting, value in vars(part).items():
            if not setting.startswith("_") and setting != "training" and isinstance(value, PLAIN):
                parts[prefix + setting] = value
    return parts


PLAIN = (bool, int, float, str, tuple, list, type(None))


def check_export_arguments(module: Any, folder: Any) -> None:
    """Refuse (naming the argument) a `module` that is no DiffusionModule or whose weights are not finite (the
    export command's check), and a `folder` that is no existing folder's path: an export writer's arguments
    (`write_export`'s and the diffusers writer's), checked before anything is written."""
    if not isinstance(module, DiffusionModule):
        raise WrongType(
            "module", module, "a DiffusionModule", "pass a loaded model: diffusion.load_checkpoint(path)"
        )
    # The export command's check (load_checkpoint's): an export of NaN weights loaded and failed only when sampled
    check_finite(module.network.state_dict(), "module", NOT_FINITE_FIX)
    if not isinstance(folder, str | os.PathLike):
        raise WrongType("folder", folder, "a folder's path", "pass the folder to write the export into")
    if Path(folder).exists() and not Path(folder).is_dir():
        raise InvalidValue(
            f"folder={folder} is a file, not a folder", "pass the folder to write the export into"
        )


def float64_betas(module: DiffusionModule) -> torch.Tensor:
    """The module's betas as its schedule computed them, in float64 (its buffers are float32), from its settings."""
    hparams: Any = module.hparams  # Lightning's AttributeDict: the module's arguments as attributes
    return schedule_betas(
        hparams.beta_schedule, hparams.num_timesteps, hparams.beta_start, hparams.beta_end,
        hparams.get("zero_terminal_snr", False), hparams.get("trained_betas"),
    )  # fmt: skip


# The settings every export of this format has written (the model's shape, units, network and schedule)
EXPORT_SETTINGS = (
    "network",
    "sample_shape",
    "normalization",
    "num_timesteps",
    "beta_schedule",
    "prediction_type",
)


def read_export_config(path: str | os.PathLike) -> tuple[dict[str, Any], Path]:
    """(config.json's contents, the export's folder) for an export folder or its config.json, checked."""
    path = Path(path).expanduser()
    config_path = path / CONFIG if path.is_dir() else path
    if not config_path.is_file():
        raise MissingFile(f"no export config at {config_path}", FIX)
    try:
        config = json.loads(config_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidValue(f"{config_path} is not valid JSON ({err})", FIX) from err
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise InvalidValue(f"{config_path} is not the config of an export of this project", FIX)
    if config.get("format_version") != FORMAT_VERSION:
        raise InvalidValue(
            f"{config_path} has format_version {config.get('format_version')!r}, this version reads "
            f"{FORMAT_VERSION}",
            "load it with the version of this package that wrote it, or export the checkpoint again",
        )
    if not isinstance(config.get("hyper_parameters"), dict):
        raise InvalidValue(f"{config_path} holds no hyper_parameters (the model's settings)", FIX)
    # A setting deleted would be filled in by DiffusionModule's default without a word (sample_shape (1, 8, 8)) or
    # said as the model's lack (no normalization) with a fix in Python: said as the key config.json lacks
    missing = [key for key in EXPORT_SETTINGS if key not in config["hyper_parameters"]]
    if missing:
        raise InvalidValue(
            f"{config_path}: hyper_parameters has no {' and no '.join(missing)} (every export writes "
            f"{', '.join(EXPORT_SETTINGS)})",
            "put it back in config.json's hyper_parameters as the export wrote it, or export the checkpoint again "
            "(python -m diffusion.export)",
        )
    # Which set of weights it holds: an edit said as another set, whose --weights the commands then refused
    if config.get("weights") not in get_args(Weights):
        held = "which of the run's weights model.safetensors holds"
        problem = (
            f"{config_path}: weights={config['weights']!r} is not 'ema' or 'raw' ({held})"
            if "weights" in config
            else f"{config_path} does not say {held} (its key weights: 'ema' or 'raw')"
        )
        raise InvalidValue(
            problem,
            'set it to "ema" in config.json ("raw" if the export holds the raw weights), '
            "or export the checkpoint again (python -m diffusion.export)",
        )
    check_model_settings(
        config["hyper_parameters"], str(config_path),
        "correct it in config.json's hyper_parameters, or export the checkpoint again (python -m diffusion.export)",
    )  # fmt: skip
    check_export_betas(config, config_path)  # its betas, a copy for code outside: an edit of one alone
    return config, config_path.parent


def network_class(class_path: object, config_path: Path) -> type[torch.nn.Module]:
    """The class a network's class_path names, among this project's networks only (no import of other code)."""
    module, _, name = str(class_path).rpartition(".")
    if name not in NETWORKS or not (module == "diffusion.models" or module.startswith("diffusion.models.")):
        raise InvalidValue(
            f"{config_path}: the export's network {class_path} is not one of this project's networks, and loading "
            "runs no other code",
            f"use a network of {[f'diffusion.models.{n}' for n in NETWORKS]}, or export the checkpoint again",
        )
    return NETWORKS[name]


def load_export(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> DiffusionModule:
    """A DiffusionModule, in eval mode, from an export folder (or its config.json), with the weights it holds."""
    config, folder = read_export_config(path)
    hparams = dict(config["hyper_parameters"])
    network_config = hparams.pop("network")
    network = network_class(network_config.get("class_path"), folder / CONFIG)(
        **network_config.get("init_args", {})
    )
    try:
        module = DiffusionModule(network=network, **hparams)
    except TypeError as err:  # settings of another version of DiffusionModule
        if isinstance(err, UserError):  # its own check (a WrongType): said as it is
            raise
        taken = inspect.signature(DiffusionModule.__init__).parameters
        if unknown := [key for key in hparams if key not in taken]:  # an edit (as every other edit is said)
            raise InvalidValue(
                f"{folder / CONFIG}: hyper_parameters holds {', '.join(unknown)}, "
                "which this version's DiffusionModule does not take",
                "remove it from config.json's hyper_parameters if it was added there, or load the export with the "
                "version of this package that wrote it",
            ) from err
        raise InvalidValue(
            f"{folder / CONFIG} has settings this version does not take ({err})",
            "load it with the version of this package that wrote it",
        ) from err
    state = read_export_weights(folder, config.get("weights_sha256"))
    try:
        check_weights_fit(module.network, state, str(folder / WEIGHTS), FIX)
    except WeightsDoNotFit as misfit:  # the weights the export wrote (their checksum): config.json was edited
        checked = config.get("weights_sha256") is not None
        raise network_edited(misfit, type(module.network).__name__, folder / CONFIG, checked) from misfit
    module.network.load_state_dict(state)
    return module.to(map_location).eval()


def network_edited(
    misfit: WeightsDoNotFit, network: str, config_path: Path, checked: bool
) -> WeightsDoNotFit:
    """The misfit of an export's weights with the network its config.json describes, said of config.json's
    network: the weights are the ones the export wrote (`checked`: their checksum matched), so its network's
    settings were edited. An export without a checksum may hold other weights instead."""
    weights = "" if checked else f" (or put back the {WEIGHTS} the export wrote)"
    said = WeightsDoNotFit(
        f"{config_path.parent / WEIGHTS}: these weights do not fit the {network} config.json describes "
        f"({misfit.summary})",
        f"correct hyper_parameters.network in {config_path} to the network the weights were trained with{weights}, "
        "or export the checkpoint again (python -m diffusion.export)",
    )
    said.summary = misfit.summary
    return said


def check_init_from_export(path: str | os.PathLike, network: type) -> str:
    """`{DiffusionModule:--init_from}` an export (its folder or config.json): a new run starts from the one set of
    weights it holds, as from a checkpoint's network weights. Its config.json is read and checked, and its network
    must be of the run's class (`network`); the settings that shape the weights are then checked by their fit
    (DiffusionModule's `init_from`). Returns which weights it holds ("ema" or "raw")."""
    config, folder = read_export_config(path)
    hparams = config["hyper_parameters"]
    saved = network_class(hparams["network"].get("class_path"), folder / CONFIG)
    if not issubclass(network, saved):
        raise InvalidValue(
            f"{INIT_FROM} {path} holds {saved.__name__} weights (of a model of samples of shape "
            f"{hparams.get('sample_shape')}), but this run's network is {network.__name__}",
            "start from an export of the same kind of model, or train with the config of the run it was "
            "exported from",
        )
    return str(config.get("weights", "ema"))


# An export's betas (a copy for code outside this package) checked against the schedule its hyper_parameters set:
# a hand-edited betas loaded and sampled with the edit ignored without a word. Exports before 3967c58 wrote the
# module's float32 betas, so values within float32's rounding agree; one without betas has nothing to check.
# float32's rounding (2**-24 of a value) with room: what the module's float32 buffers resolve anyway.
RELATIVE_TOLERANCE = 1e-6
BETAS_FIX = (
    "export the checkpoint again (python -m diffusion.export), or put back the betas it wrote; for a schedule of "
    'your own, set hyper_parameters\' "beta_schedule": "trained" with "trained_betas"'
)


def check_export_betas(config: dict[str, Any], config_path: Path) -> None:
    """Raise InvalidValue, naming `config_path` and its key, unless config.json's ``betas`` (when it holds them)
    are the betas of its ``hyper_parameters``' schedule (whose settings are checked already)."""
    if "betas" not in config:
        return
    given, expected = config["betas"], schedule_of(config["hyper_parameters"])
    if not isinstance(given, list) or not all(
        isinstance(beta, int | float) and not isinstance(beta, bool) for beta in given
    ):
        raise InvalidValue(f"{config_path}: betas is {summary(given)}, not a list of numbers", BETAS_FIX)
    if len(given) != len(expected):
        raise InvalidValue(
            f"{config_path}: betas holds {len(given)} values, but the schedule of its hyper_parameters has "
            f"{len(expected)} (num_timesteps)",
            BETAS_FIX,
        )
    for index, (beta, wanted) in enumerate(zip(given, expected.tolist(), strict=True)):
        if not math.isclose(beta, wanted, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12):
            raise InvalidValue(
                f"{config_path}: betas[{index}] is {beta!r}, but the schedule of its hyper_parameters has "
                f"{wanted!r} there (the schedule this package samples with; betas is a copy for code outside it)",
                BETAS_FIX,
            )


def summary(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else f"a {type(value).__name__}"
