"""A trained model from its checkpoint alone, or from an export of it: no config file, no code run
(``weights_only=True``; an export is JSON and safetensors)."""

import os
import sys
from pathlib import Path
from typing import Any, Literal

import torch

from diffusion.data.file_in_folder import check_local_file, file_in_folder
from diffusion.errors import InvalidValue, WrongType, check_choice
from diffusion.models import UNet
from diffusion.models.diffusers_unet import unet_weights_from_diffusers
from diffusion.training.checkpoint_files import (
    CheckedLoad,
    check_device_available,
    check_finite,
    check_written_by_train,
    read_checkpoint,
)
from diffusion.training.checkpoint_paths import CHECKPOINT, check_not_an_export_without_config
from diffusion.training.checkpoint_paths import (
    is_export_without_config as is_export_without_config,  # cli.export
)
from diffusion.training.export_files import CONFIG, folder_of_weights_file, is_export
from diffusion.training.exported import check_model_settings, load_export, read_export_config
from diffusion.training.from_diffusers import (
    about,
    diffusers_folders,
    diffusers_hyperparameters,
    module_settings,
)
from diffusion.training.module import DiffusionModule

Weights = Literal["ema", "raw"]
ModelKind = Literal["diffusers", "export", "checkpoint"]
NOT_FINITE_FIX = "training diverged before it was saved: use an earlier checkpoint of the run"
SETTINGS_FIX = "use another checkpoint of the run, or one written by train.py unchanged"


def load_checkpoint(
    path: str | os.PathLike, weights: Weights | None = None, map_location: str | torch.device = "cpu"
) -> DiffusionModule:
    """A DiffusionModule from a checkpoint alone (no config), with its EMA weights or its raw ones.

    Lightning's EMA callback stores the averaged weights under "state_dict" and the raw ones under
    "current_model_state"; a run without EMA has only raw weights, which both choices then return. None: EMA.

    `path` may also be a folder written by `python -m diffusion.export --format safetensors` (or its config.json),
    or a diffusers DDPMPipeline or UNet2DModel folder (`diffusion.training.from_diffusers`), which hold one set
    of weights: None returns it, and asking for the other set is an error. Any other folder holding exactly
    one checkpoint stands for it (`diffusion.data.file_in_folder`).
    """
    if not isinstance(path, str | os.PathLike):
        raise WrongType("path", path, "a path", "pass the checkpoint's path (a str or pathlib.Path)")
    if isinstance(path, str) and not path:  # not the current folder, as Path("") would read it
        raise InvalidValue(
            "path is empty",
            "pass the checkpoint's path (an unset variable or a blank line may have given '')",
        )
    if weights is not None:
        if not isinstance(weights, str):
            raise WrongType(
                "weights", weights, "'ema' or 'raw'", "pass weights='ema' or weights='raw' (None: ema)"
            )
        check_choice("weights", weights, Weights)
    if not isinstance(map_location, str | torch.device):
        raise WrongType(
            "map_location", map_location, "a device", "pass 'cpu', 'cuda', 'cuda:1' or a torch.device"
        )
    check_device_available(map_location)
    kind, path = model_source(path, "path")
    if kind == "diffusers":
        if weights == "raw":
            raise InvalidValue(
                f"{path} is a diffusers model: it holds one set of weights", "load it without weights="
            )
        return load_diffusers(path, map_location)
    if kind == "export":
        exported = read_export_config(path)[0].get("weights")
        if weights is not None and weights != exported:
            # {--weights}: load_checkpoint's argument, a command's --weights (its owner then the command's)
            raise InvalidValue(
                f"{path} holds {exported} weights, not {weights} ({{--weights}} {weights})",
                f"pass {{--weights}} {exported} to load them, or export the checkpoint again with "
                f"{{command:--weights}} {weights}",
            )
        module = load_export(path, map_location)
        check_finite(module.network.state_dict(), str(path), NOT_FINITE_FIX)
        return module
    # Read and checked before Lightning reads it again: Lightning's own load_from_checkpoint, not DiffusionModule's,
    # which would check the file a second time (`CheckedLoad`)
    checkpoint = read_checkpoint(path, "path", map_location=map_location)
    check_model_settings(check_written_by_train(checkpoint, path), str(path), SETTINGS_FIX)
    lightning_load = super(CheckedLoad, DiffusionModule).load_from_checkpoint
    module = lightning_load(path, map_location=map_location, weights_only=True)
    if weights == "raw" and "current_model_state" in checkpoint:
        module.load_state_dict(checkpoint["current_model_state"])
    check_finite(module.network.state_dict(), f"{path} ({weights or 'ema'} weights)", NOT_FINITE_FIX)
    return module.eval()


def model_source(path: str | os.PathLike, flag: str = "checkpoint") -> tuple[ModelKind, Path]:
    """What a path given for a model is, decided in this one place for every command and `load_checkpoint`: a
    diffusers DDPMPipeline or UNet2DModel folder, an export (its folder, its config.json, or its model.safetensors,
    which stands for its folder with a note), else a checkpoint file,
    which a folder holding exactly one stands for (`file_in_folder`; `flag` names the option in its errors).
    A diffusers folder that is broken (a part missing, a model of another class) is refused as one, naming what
    is wrong with it (`diffusers_folders`), not searched for a checkpoint; so is an export that lost its config.json
    (`check_not_an_export_without_config`). An object-storage URL is refused (`check_local_file`)."""
    check_local_file(path, flag, "a model")
    if diffusers_folders(path, flag) is not None:
        return "diffusers", Path(path)
    if is_export(path):
        return "export", Path(path)
    folder = folder_of_weights_file(path)
    if folder is not None:  # the model is the folder: its config.json holds the settings these weights need
        print(
            f"note: {flag} {path} is the weights file of an export: using its folder {folder} (the model's "
            f"settings are in its {CONFIG})",
            file=sys.stderr,
        )
        return "export", folder
    check_not_an_export_without_config(path, flag)
    return "checkpoint", file_in_folder(path, flag, CHECKPOINT)


def model_hyperparameters(path: str | os.PathLike, flag: str = "checkpoint") -> dict[str, Any]:
    """The settings of the model `path` names (`model_source`) as a checkpoint stores them (its "network" config,
    sample shape, classes, ...), read without building it: what a command checks before spending any time."""
    kind, path = model_source(path, flag)
    if kind == "diffusers":
        return diffusers_hyperparameters(path, flag)
    if kind == "export":
        return read_export_config(path)[0]["hyper_parameters"]
    hparams = check_written_by_train(read_checkpoint(path, flag), path, flag)
    check_model_settings(hparams, str(path), SETTINGS_FIX)
    return hparams


def load_diffusers(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> DiffusionModule:
    """A DiffusionModule, in eval mode, that samples as the diffusers model in `path` (a DDPMPipeline or
    UNet2DModel folder) does."""
    arguments, settings, weights = module_settings(path)
    network = UNet(**arguments)
    with about(path):  # weights that do not fit its config.json: the folder is named
        # unet_weights_from_diffusers names a missing, left-over or reshaped weight itself.
        network.load_state_dict(unet_weights_from_diffusers(network, weights))
    return DiffusionModule(network, **settings).to(map_location).eval()
