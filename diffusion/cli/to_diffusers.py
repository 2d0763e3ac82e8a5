"""A trained model as a diffusers ``DDPMPipeline`` (a ``UNet2DModel`` and a ``DDPMScheduler``) that
``DDPMPipeline.from_pretrained(folder)`` loads without this package.

The network maps exactly (`diffusion.models.diffusers_unet`); the scheduler is set to sample as this project's
DDPM does: the same betas (diffusers' named schedule where its betas agree with ours to float32 rounding, else
``trained_betas``), the prediction type, the model's sampling defaults for the variance (``fixed_large`` = beta_t,
``fixed_small`` = beta~_t) and for clipping x_0 to [-1, 1], and ``timestep_spacing="linspace"``, whose
``num_inference_steps`` < T visit the timesteps our respaced DDPM (``--steps``) visits. ``DDPMPipeline`` maps
samples to [0, 1] as ``x / 2 + 0.5``, the normalization of every image model here.

diffusers is an optional dependency: imported here, when a command asks for this format.
"""

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from safetensors.torch import save

from diffusion.core.sampling import SamplingOptions
from diffusion.errors import UserError
from diffusion.models.diffusers_unet import (
    INSTEAD,
    check_maps_to_diffusers,
    diffusers_unet_config,
    diffusers_unet_weights,
)
from diffusion.training.atomic_writes import writing_whole
from diffusion.training.exported import (
    EXPORT_ON_ANOTHER_DISK,
    WRITE_AGAIN,
    check_export_arguments,
    float64_betas,
)
from diffusion.training.module import DiffusionModule

PREDICTION_TYPES = {"eps": "epsilon", "x0": "sample", "v": "v_prediction"}
VARIANCE_TYPES = {"fixedlarge": "fixed_large", "fixedsmall": "fixed_small"}
PIPELINE_NORMALIZATION = (0.5, 0.5)  # DDPMPipeline's (shift, scale): images = x / 2 + 0.5
SAFETENSORS_WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"  # a diffusers model's weights, one shard


def import_diffusers() -> ModuleType:
    try:
        import diffusers
    except ImportError as err:
        raise UserError(
            "--format diffusers needs the diffusers package, which is not installed",
            'pip install diffusers (or pip install -e ".[dev]"), or export with --format safetensors',
        ) from err
    return diffusers


def check_pipeline_fits(module: DiffusionModule) -> None:
    """Raise UserError (one line) unless a DDPMPipeline samples what `module` samples."""
    check_maps_to_diffusers(module.network)
    variance = module.hparams.get("variance", "fixed")
    if variance != "fixed":
        raise UserError(f"hparam variance={variance!r} != 'fixed' does not map to DDPMPipeline", INSTEAD)
    normalization = module.normalization
    if any(
        (shift, scale) != PIPELINE_NORMALIZATION
        for shift, scale in zip(normalization["shift"], normalization["scale"], strict=True)
    ):
        raise UserError(f"normalization {normalization} is not DDPMPipeline's images = x / 2 + 0.5", INSTEAD)


def ddpm_scheduler_config(module: DiffusionModule, scheduler_class: type) -> dict[str, Any]:
    """DDPMScheduler's arguments that sample as `module`'s DDPM; `scheduler_class` is diffusers' DDPMScheduler,
    built once to compare its named schedule's betas with the module's."""
    hparams: Any = module.hparams  # Lightning's AttributeDict: the module's arguments as attributes
    schedule = module.schedule
    ddpm = module.sampler(SamplingOptions(sampler="ddpm"))  # the model's DDPM: its variance and clipping
    T = schedule.num_timesteps
    config: dict[str, Any] = {
        "num_train_timesteps": T,
        "prediction_type": PREDICTION_TYPES[hparams.prediction_type],
        "variance_type": VARIANCE_TYPES[ddpm.variance],  # type: ignore[attr-defined]  # a DDPM sampler's
        "clip_sample": bool(ddpm.clip_denoised),
        "clip_sample_range": 1.0,
        "thresholding": False,
        "timestep_spacing": "linspace",
        "steps_offset": 0,
        "rescale_betas_zero_snr": False,
    }
    scale = 1000 / T  # make_betas' rule: beta_start and beta_end are the values at T = 1000
    named = {
        "linear": {"beta_schedule": "linear", "beta_start": scale * hparams.beta_start, "beta_end": scale * hparams.beta_end},
        "cosine": {"beta_schedule": "squaredcos_cap_v2"},
    }.get(hparams.beta_schedule)  # fmt: skip
    betas = schedule.betas.detach().cpu().double()
    if named is not None:
        theirs = scheduler_class(**config, **named).betas.double()
        if torch.allclose(theirs, betas, rtol=1e-6, atol=0):
            return {**config, **named}
    # Clipped at 0.999 (a linear schedule with T <= 20), rescaled to zero terminal SNR, or a schedule diffusers does
    # not name (sigmoid, trained): the betas themselves, in float64 (DDPMScheduler reads them as float32, as our
    # buffers hold them, and this project's reader keeps the digits of 1 - beta near 1). beta_start and beta_end
    # only document the ends.
    exact = float64_betas(module)
    return {
        **config,
        "trained_betas": exact.tolist(),
        "beta_start": exact[0].item(),
        "beta_end": exact[-1].item(),
    }


def save_pipeline(module: DiffusionModule, folder: str | os.PathLike) -> None:
    """Write `module` as a DDPMPipeline into `folder`, the files `save_pretrained` writes (model_index.json,
    scheduler/scheduler_config.json, unet/config.json, unet/diffusion_pytorch_model.safetensors): refused in one
    line unless it maps.

    Each file is written by Python, not by `save_pretrained`: diffusers writes the weights with safetensors' own
    writer, which says a full disk as a SafetensorError naming no errno, where a Python write raises the OSError
    that the export command names as a full disk (as `diffusion.training.exported.write_export` does). The files
    are written whole, or none (`writing_whole`; a pipeline already in `folder` stays as it was): a full disk or a
    folder that refuses writes raises DiskFull, FlaggedFolder or CannotWrite, naming `folder`."""
    check_export_arguments(module, folder)
    diffusers = import_diffusers()
    check_pipeline_fits(module)
    network: Any = module.network  # a UNet: check_pipeline_fits refuses any other network
    unet = diffusers.UNet2DModel(**diffusers_unet_config(network, module.sample_shape))
    unet.load_state_dict(diffusers_unet_weights(network))  # strict: every weight has its place
    scheduler = diffusers.DDPMScheduler(**ddpm_scheduler_config(module, diffusers.DDPMScheduler))
    pipeline = diffusers.DDPMPipeline(unet=unet, scheduler=scheduler)
    weights = {name: value.detach().cpu().contiguous() for name, value in unet.state_dict().items()}
    # All files or none (as write_export's): a full disk left a 0-byte model_index.json, said as a bare OSError
    with writing_whole(Path(folder), "the pipeline", EXPORT_ON_ANOTHER_DISK, WRITE_AGAIN) as staged:
        pipeline.save_config(staged)  # model_index.json: which class each part is
        scheduler.save_pretrained(staged / "scheduler")  # a config file alone
        unet.save_config(staged / "unet")
        with open(staged / "unet" / SAFETENSORS_WEIGHTS_NAME, "wb") as file:
            file.write(save(weights, metadata={"format": "pt"}))  # save_pretrained's one shard, its metadata


if __name__ == "__main__":  # the command is export's --format diffusers
    from diffusion.cli.reporting import not_a_command

    not_a_command(
        "export a diffusers folder with python -m diffusion.export --ckpt CKPT --format diffusers --out DIR"
    )
