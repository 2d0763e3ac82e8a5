"""Pretrained diffusers models in: a local ``DDPMPipeline`` folder (``model_index.json``, ``unet/``,
``scheduler/``) or a ``UNet2DModel`` folder (its ``config.json`` and weights) whose layout maps onto this
project's UNet (`diffusion.models.diffusers_unet`): its network, weights and sampling settings, which
`diffusion.training.loading.load_checkpoint` builds a `DiffusionModule` from, and the weights and settings to
fine-tune from (``--model.init_from FOLDER``).

The schedule, prediction type and DDPM variance come from the pipeline's ``scheduler/scheduler_config.json``
(diffusers' ``DDPMScheduler`` defaults where a key is missing; a bare UNet folder has none: Ho et al.'s linear
betas 1e-4..0.02 over T = 1000). Reading runs no code and needs no diffusers: JSON, and safetensors (or a
``.bin`` state_dict read with ``weights_only=True``).
"""

import json
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from diffusion.core.schedule import checked_betas
from diffusion.errors import CannotRead, InvalidValue, MissingFile, UserError
from diffusion.models import UNet
from diffusion.models.diffusers_unet import unet_arguments_from_diffusers, unet_weights_from_diffusers

WEIGHT_FILES = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")
SCHEDULER_DEFAULTS = {
    "num_train_timesteps": 1000, "beta_start": 1e-4, "beta_end": 0.02, "beta_schedule": "linear",
    "trained_betas": None, "variance_type": "fixed_small", "clip_sample": True, "clip_sample_range": 1.0,
    "prediction_type": "epsilon", "thresholding": False, "rescale_betas_zero_snr": False,
}  # fmt: skip
PREDICTION_TYPES = {"epsilon": "eps", "sample": "x0", "v_prediction": "v"}
VARIANCES = {"fixed_small": "fixedsmall", "fixed_large": "fixedlarge"}
FIX = "pass a DDPMPipeline folder (model_index.json, unet/, scheduler/) or a UNet2DModel folder (config.json)"
WHOLE = "copy the model's folder again, whole (save_pretrained writes config.json beside the weights)"
DAMAGED = (
    "copy the model's folder again, or export it again from its checkpoint "
    "(python -m diffusion.export, the diffusers format)"
)


INIT_FROM = "{DiffusionModule:--init_from}"  # the option these weights are read for


@contextmanager
def about(path: str | os.PathLike, flag: str = "") -> Iterator[None]:
    """A check inside reading the diffusers folder `path` fails with its error said of `flag path`: the problems
    below name the folder's parts (its config.json, unet/, the weights), not the folder the user gave."""
    try:
        yield
    except UserError as error:
        raise error.about(f"{flag} {path}".strip()) from error


def _json(path: Path, what: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise MissingFile(f"it has no {what}", WHOLE) from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        kind = CannotRead if isinstance(err, OSError) else InvalidValue  # no permission: the system's refusal
        raise kind(f"its {what} cannot be read as JSON ({err})", WHOLE) from err
    if not isinstance(value, dict):
        raise InvalidValue(f"its {what} is not a diffusers config (a JSON object)", FIX)
    return value


def diffusers_folders(path: str | os.PathLike, flag: str = "") -> tuple[Path, Path | None] | None:
    """(the UNet2DModel's folder, the scheduler config or None) when `path` is a diffusers folder, else None.

    A diffusers folder is a pipeline's (model_index.json) or a model's: a config.json naming a diffusers class
    (`_class_name`), or diffusers' weights files. One whose parts are missing or of another kind (a pipeline
    without unet/ or unet/config.json, weights without config.json, another class than UNet2DModel) is refused
    here, in one line said of `flag path`, rather than taken for a folder that holds no checkpoint."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return None
    with about(path, flag):
        if (folder / "model_index.json").is_file():
            if not (folder / "unet").is_dir():
                raise InvalidValue(
                    "it is a diffusers pipeline folder (model_index.json) without its unet/ folder", WHOLE
                )
            unet_config(folder / "unet", "unet/config.json")
            scheduler = folder / "scheduler" / "scheduler_config.json"
            return folder / "unet", scheduler if scheduler.is_file() else None
        if (folder / "config.json").is_file():
            try:
                config = json.loads((folder / "config.json").read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                config = None  # an export's config.json, or a diffusers one: the weights beside it tell
            named = isinstance(config, dict) and "_class_name" in config
            if not named and not any((folder / name).is_file() for name in WEIGHT_FILES):
                return None  # not diffusers' (an export's config.json: `diffusion.training.exported`)
            unet_config(folder, "config.json")
            return folder, None
        weights = [name for name in WEIGHT_FILES if (folder / name).is_file()]
        if weights:
            raise InvalidValue(f"it holds diffusers weights ({weights[0]}) but no config.json", WHOLE)
    return None


def module_settings(
    path: str | os.PathLike, flag: str = ""
) -> tuple[dict[str, Any], dict[str, Any], dict[str, torch.Tensor]]:
    """(the UNet's arguments, DiffusionModule's other settings, the weights under diffusers' names) of the
    diffusers model in `path`."""
    folders = _folders(path, flag)
    with about(path, flag):
        arguments, settings = model_settings(*folders)
        return arguments, settings, read_unet_weights(folders[0], _part(path, folders[0]))


def diffusers_hyperparameters(path: str | os.PathLike, flag: str = "") -> dict[str, Any]:
    """The diffusers model in `path` as a checkpoint's hyperparameters (network and settings; its weights must be
    there, but are not read)."""
    folders = _folders(path, flag)
    with about(path, flag):
        arguments, settings = model_settings(*folders)
        if not any((folders[0] / name).is_file() for name in WEIGHT_FILES):
            read_unet_weights(folders[0], _part(path, folders[0]))  # says which are missing
    return {"network": {"class_path": "diffusion.models.UNet", "init_args": arguments}, **settings}


def _folders(path: str | os.PathLike, flag: str) -> tuple[Path, Path | None]:
    folders = diffusers_folders(path, flag)
    if folders is None:
        raise InvalidValue(f"{flag} {path} is not a diffusers model folder".strip(), FIX)
    return folders


def _part(path: str | os.PathLike, unet_folder: Path) -> str:
    """How the folder the user gave calls the UNet's: "unet/" in a pipeline, "" in a UNet2DModel folder."""
    return "" if unet_folder == Path(path).expanduser() else f"{unet_folder.name}/"


def model_settings(unet_folder: Path, scheduler_config: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the UNet's arguments, DiffusionModule's other settings) of a diffusers UNet and scheduler config."""
    config = unet_config(unet_folder)
    arguments = unet_arguments_from_diffusers(config)
    settings, sampling = schedule_settings(scheduler_config)
    size = config.get("sample_size") or 32
    height, width = (size, size) if isinstance(size, int) else size
    channels = arguments["in_channels"]
    settings |= {
        "sample_shape": (channels, height, width), "sampling": sampling,
        "normalization": {"shift": [0.5] * channels, "scale": [0.5] * channels},  # DDPMPipeline's x / 2 + 0.5
    }  # fmt: skip
    return arguments, settings


def unet_config(folder: Path, what: str = "config.json") -> dict[str, Any]:
    """The UNet2DModel config in `folder` (`what`: how the user's folder calls it)."""
    config = _json(folder / "config.json", what)
    if config.get("_class_name") not in (None, "UNet2DModel"):
        raise InvalidValue(f"its {what} is a diffusers {config['_class_name']}'s, not a UNet2DModel's",
                        "pass a DDPMPipeline or UNet2DModel folder")  # fmt: skip
    return config


def read_unet_weights(folder: Path, part: str = "") -> dict[str, torch.Tensor]:
    """The UNet2DModel's state_dict, under diffusers' names (`part`: the folder as the user's folder calls it,
    "unet/" in a pipeline)."""
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            try:
                if name.endswith(".safetensors"):
                    return load_file(path)
                return torch.load(path, map_location="cpu", weights_only=True)
            except PermissionError as err:  # the system refuses to read it: nothing is wrong with its bytes
                raise CannotRead(
                    f"its weights {part}{name} cannot be read ({err.strerror or err})",
                    "make the file readable for this user",
                ) from err
            except (SafetensorError, RuntimeError, OSError, pickle.UnpicklingError, EOFError) as err:
                # The file is there but its bytes are not weights: WHOLE's config.json would not be the cause.
                raise InvalidValue(
                    f"its weights {part}{name} cannot be read ({str(err) or type(err).__name__}): "
                    "the file is damaged or cut short (a bad copy or a failing disk)",
                    DAMAGED,
                ) from err
    raise InvalidValue(f"it has no weights: no {part}{' or '.join(WEIGHT_FILES)}", WHOLE)


def schedule_settings(scheduler_config: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(DiffusionModule's schedule and prediction settings, its sampling defaults) for a DDPMScheduler config.

    ``trained_betas`` (which replace the named schedule, as in DDPMScheduler) become the ``"trained"`` schedule:
    what a diffusers export of this project writes for a schedule diffusers names otherwise or not at all (a
    linear one clipped at 0.999, sigmoid, zero terminal SNR), and any other valid betas."""
    what = "scheduler/scheduler_config.json"
    config = {**SCHEDULER_DEFAULTS, **(_json(scheduler_config, what) if scheduler_config else {})}
    where = f"its {what}" if scheduler_config else "the default DDPMScheduler"
    trained = config["trained_betas"] is not None
    refuse = {
        "thresholding": bool(config["thresholding"]), "rescale_betas_zero_snr": bool(config["rescale_betas_zero_snr"]),
        "clip_sample_range": config["clip_sample_range"] != 1.0,
        "beta_schedule": not trained and config["beta_schedule"] not in ("linear", "squaredcos_cap_v2"),
        "prediction_type": config["prediction_type"] not in PREDICTION_TYPES,
        "variance_type": config["variance_type"] not in VARIANCES,
    }  # fmt: skip
    for key, refused in refuse.items():
        if refused:
            raise InvalidValue(f"{where}: {key}={config[key]!r} has no counterpart in this project's schedules "
                            "and samplers", "use a model trained with a linear or cosine (squaredcos_cap_v2) "
                            "schedule, or trained_betas, and fixed variances")  # fmt: skip
    T = int(config["num_train_timesteps"])
    settings: dict[str, Any] = {
        "num_timesteps": T,
        "prediction_type": PREDICTION_TYPES[config["prediction_type"]],
        "zero_terminal_snr": False,
        "trained_betas": None,
    }
    if trained:
        try:
            betas = checked_betas(config["trained_betas"], T)
        except UserError as error:
            raise InvalidValue(f"{where}: {error.problem}",
                            "use a scheduler config whose trained_betas are a noise schedule, one beta per "
                            "training timestep") from error  # fmt: skip
        if betas[-1] == 1 and settings["prediction_type"] == "eps":
            raise InvalidValue(f"{where}: trained_betas end at alpha_bar_T = 0 (zero terminal SNR), where "
                            "prediction_type='epsilon' is undefined", "use a model with these betas that "
                            "predicts v_prediction or sample (x_0)")  # fmt: skip
        settings |= {"beta_schedule": "trained", "trained_betas": betas.tolist()}
    elif config["beta_schedule"] == "linear":
        # DDPMScheduler's betas are linspace(beta_start, beta_end, T); this project's are given at T = 1000.
        scale = T / 1000
        settings |= {"beta_schedule": "linear", "beta_start": config["beta_start"] * scale,
                     "beta_end": config["beta_end"] * scale}  # fmt: skip
    else:
        settings["beta_schedule"] = "cosine"
    sampling = {"sampler": "ddpm", "variance": VARIANCES[config["variance_type"]],
                "clip_denoised": bool(config["clip_sample"])}  # fmt: skip
    return settings, sampling


def init_settings(path: str | os.PathLike, flag: str = INIT_FROM) -> dict[str, Any] | None:
    """For `--model.init_from FOLDER`: the config values a run fine-tuning that diffusers model must train with
    (its network and schedule, by config key), or None when `path` is not a diffusers folder."""
    folders = diffusers_folders(path, flag)
    if folders is None:
        return None
    unet_folder, scheduler_config = folders
    with about(path, flag):
        arguments = unet_arguments_from_diffusers(unet_config(unet_folder))
        settings, _ = schedule_settings(scheduler_config)
    # in_channels and out_channels follow from the data and --model.variance, as for any run.
    network = {k: v for k, v in arguments.items() if k not in ("in_channels", "out_channels")}
    return {
        "model.network": {"class_path": "diffusion.models.UNet", "init_args": network},
        **{f"model.{key}": value for key, value in settings.items()},
    }


def read_init_weights(
    path: str | os.PathLike, network: torch.nn.Module | None = None, flag: str = INIT_FROM
) -> dict[str, torch.Tensor]:
    """The diffusers model's weights under this project's UNet's names (for `--model.init_from FOLDER`); with
    `network`, checked to have its input and output channels (the data's, which fine-tuning cannot change)."""
    unet_folder, _ = _folders(path, flag)
    with about(path, flag):
        arguments = unet_arguments_from_diffusers(unet_config(unet_folder))
        theirs = (arguments["in_channels"], arguments["out_channels"] or arguments["in_channels"])
        ours = _channels(network)
        if ours is not None and ours != theirs:
            raise InvalidValue(
                f"it is a diffusers UNet for {theirs[0]}-channel images ({theirs[0]} in, {theirs[1]} out), "
                f"and this run's network is for {ours[0]}-channel images ({ours[0]} in, {ours[1]} out: the data's "
                "channels, twice out with {DiffusionModule:--variance} learned_range)",
                f"fine-tune it on {theirs[0]}-channel images with {{DiffusionModule:--variance}} fixed, or start "
                "from a diffusers "
                f"model for {ours[0]}-channel images",
            )
        with torch.device("meta"):  # the names and shapes only
            unet = UNet(**arguments)
        return unet_weights_from_diffusers(unet, read_unet_weights(unet_folder, _part(path, unet_folder)))


def _channels(network: torch.nn.Module | None) -> tuple[int, int] | None:
    """A UNet's (input, output) channels, None for another network."""
    if not isinstance(network, UNet):
        return None
    return network.in_channels, network.conv_out.out_channels
