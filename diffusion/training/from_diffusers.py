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
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from diffusion.errors import UserError
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


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path} cannot be read as JSON ({err})", FIX) from err
    if not isinstance(value, dict):
        raise UserError(f"{path} is not a diffusers config (a JSON object)", FIX)
    return value


def diffusers_folders(path: str | os.PathLike) -> tuple[Path, Path | None] | None:
    """(the UNet2DModel's folder, the scheduler config or None) when `path` is a diffusers folder, else None."""
    path = Path(path).expanduser()
    if not path.is_dir():
        return None
    if (path / "model_index.json").is_file():
        scheduler = path / "scheduler" / "scheduler_config.json"
        return path / "unet", scheduler if scheduler.is_file() else None
    config = path / "config.json"
    if config.is_file() and _json(config).get("_class_name") == "UNet2DModel":
        return path, None
    return None


def module_settings(
    path: str | os.PathLike,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, torch.Tensor]]:
    """(the UNet's arguments, DiffusionModule's other settings, the weights under diffusers' names) of the
    diffusers model in `path`."""
    folders = diffusers_folders(path)
    if folders is None:
        raise UserError(f"{path} is not a diffusers model folder", FIX)
    arguments, settings = model_settings(*folders)
    return arguments, settings, read_unet_weights(folders[0])


def diffusers_hyperparameters(path: str | os.PathLike) -> dict[str, Any]:
    """The diffusers model in `path` as a checkpoint's hyperparameters (network and settings; no weights read)."""
    folders = diffusers_folders(path)
    if folders is None:
        raise UserError(f"{path} is not a diffusers model folder", FIX)
    arguments, settings = model_settings(*folders)
    return {"network": {"class_path": "diffusion.models.UNet", "init_args": arguments}, **settings}


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


def unet_config(folder: Path) -> dict[str, Any]:
    config = _json(folder / "config.json")
    if config.get("_class_name") not in (None, "UNet2DModel"):
        raise UserError(f"{folder} holds a diffusers {config['_class_name']}, not a UNet2DModel",
                        "pass a DDPMPipeline or UNet2DModel folder")  # fmt: skip
    return config


def read_unet_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The UNet2DModel's state_dict, under diffusers' names."""
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            try:
                if name.endswith(".safetensors"):
                    return load_file(path)
                return torch.load(path, map_location="cpu", weights_only=True)
            except (SafetensorError, RuntimeError, OSError) as err:
                raise UserError(f"{path} cannot be read ({str(err) or type(err).__name__})", FIX) from err
    raise FileNotFoundError(f"{folder} holds no {' or '.join(WEIGHT_FILES)} — {FIX}")


def schedule_settings(scheduler_config: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(DiffusionModule's schedule and prediction settings, its sampling defaults) for a DDPMScheduler config."""
    config = {**SCHEDULER_DEFAULTS, **(_json(scheduler_config) if scheduler_config else {})}
    where = scheduler_config or "the default DDPMScheduler"
    refuse = {
        "trained_betas": config["trained_betas"] is not None, "thresholding": bool(config["thresholding"]),
        "rescale_betas_zero_snr": bool(config["rescale_betas_zero_snr"]),
        "clip_sample_range": config["clip_sample_range"] != 1.0,
        "beta_schedule": config["beta_schedule"] not in ("linear", "squaredcos_cap_v2"),
        "prediction_type": config["prediction_type"] not in PREDICTION_TYPES,
        "variance_type": config["variance_type"] not in VARIANCES,
    }  # fmt: skip
    for key, refused in refuse.items():
        if refused:
            raise UserError(f"{where}: {key}={config[key]!r} has no counterpart in this project's schedules "
                            "and samplers", "use a model trained with a linear or cosine (squaredcos_cap_v2) "
                            "schedule and fixed variances")  # fmt: skip
    T = int(config["num_train_timesteps"])
    settings: dict[str, Any] = {
        "num_timesteps": T,
        "prediction_type": PREDICTION_TYPES[config["prediction_type"]],
    }
    if config["beta_schedule"] == "linear":
        # DDPMScheduler's betas are linspace(beta_start, beta_end, T); this project's are given at T = 1000.
        scale = T / 1000
        settings |= {"beta_schedule": "linear", "beta_start": config["beta_start"] * scale,
                     "beta_end": config["beta_end"] * scale}  # fmt: skip
    else:
        settings["beta_schedule"] = "cosine"
    sampling = {"sampler": "ddpm", "variance": VARIANCES[config["variance_type"]],
                "clip_denoised": bool(config["clip_sample"])}  # fmt: skip
    return settings, sampling


def init_settings(path: str | os.PathLike) -> dict[str, Any] | None:
    """For `--model.init_from FOLDER`: the config values a run fine-tuning that diffusers model must train with
    (its network and schedule, by config key), or None when `path` is not a diffusers folder."""
    folders = diffusers_folders(path)
    if folders is None:
        return None
    unet_folder, scheduler_config = folders
    arguments = unet_arguments_from_diffusers(unet_config(unet_folder))
    settings, _ = schedule_settings(scheduler_config)
    # in_channels and out_channels follow from the data and --model.variance, as for any run.
    network = {k: v for k, v in arguments.items() if k not in ("in_channels", "out_channels")}
    return {
        "model.network": {"class_path": "diffusion.models.UNet", "init_args": network},
        **{f"model.{key}": value for key, value in settings.items()},
    }


def read_init_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The diffusers model's weights under this project's UNet's names (for `--model.init_from FOLDER`)."""
    unet_folder, _ = diffusers_folders(path) or (Path(path), None)
    with torch.device("meta"):  # the names and shapes only
        network = UNet(**unet_arguments_from_diffusers(unet_config(unet_folder)))
    return unet_weights_from_diffusers(network, read_unet_weights(unet_folder))
