"""A model as a diffusers DDPMPipeline: the scheduler has the model's betas, and from the same generator the
pipeline's DDPM samples equal `DiffusionModule.sample`'s, for every prediction type, variance, clipping and
schedule, with all T steps or fewer (the fresh-session test of the exported folder: tests/cli/test_export.py)."""

import pytest
import torch
from diffusers import DDPMPipeline, DDPMScheduler

from diffusion.cli.to_diffusers import check_pipeline_fits, ddpm_scheduler_config, save_pipeline
from diffusion.core.sampling import SamplingOptions
from diffusion.errors import UserError
from diffusion.models import UNet
from diffusion.training.module import DiffusionModule

IMAGES = {"shift": [0.5], "scale": [0.5]}


def module(beta_schedule="linear", num_timesteps=10, prediction_type="eps", **sampling) -> DiffusionModule:
    """A tiny image model with random weights everywhere, so every layer shapes the samples."""
    torch.manual_seed(0)
    network = UNet(in_channels=1, channels=8, channel_mult=(1, 2), num_res_blocks=1)
    with torch.no_grad():
        for p in network.parameters():
            p.normal_(0, 0.2)
    return DiffusionModule(
        network, sample_shape=(1, 8, 8), normalization=IMAGES, beta_schedule=beta_schedule,
        num_timesteps=num_timesteps, prediction_type=prediction_type, sampling=SamplingOptions(**sampling),
    ).eval()  # fmt: skip


SCHEDULES = {
    "linear_1000": ("linear", 1000, "linear"),
    "linear_50": ("linear", 50, "linear"),  # betas scaled by 1000 / T
    "linear_20_clipped_at_0.999": ("linear", 20, None),
    "cosine_20": ("cosine", 20, "squaredcos_cap_v2"),
    "cosine_1000": ("cosine", 1000, "squaredcos_cap_v2"),
    "sigmoid_30": ("sigmoid", 30, None),
}


@pytest.mark.parametrize(("schedule", "T", "named"), SCHEDULES.values(), ids=SCHEDULES.keys())
def test_the_scheduler_has_the_models_betas(schedule, T, named):
    model = module(schedule, T)
    config = ddpm_scheduler_config(model, DDPMScheduler)
    if named:
        assert config["beta_schedule"] == named and "trained_betas" not in config
    else:
        assert len(config["trained_betas"]) == T
    betas = DDPMScheduler(**config).betas
    torch.testing.assert_close(betas, model.schedule.betas, rtol=1e-6, atol=0)


def pipeline_images(pipe: DDPMPipeline, n: int, seed: int, steps: int) -> torch.Tensor:
    pipe.set_progress_bar_config(disable=True)
    return pipe(batch_size=n, generator=torch.Generator().manual_seed(seed), num_inference_steps=steps,
                output_type="pt").images  # fmt: skip


def our_images(model: DiffusionModule, n: int, seed: int, steps: int) -> torch.Tensor:
    torch.manual_seed(
        seed
    )  # the global generator draws as a fresh one seeded alike: x_T, then each step's noise
    samples = model.sample(n, options=SamplingOptions(sampler="ddpm", steps=steps))
    return (samples * 0.5 + 0.5).clamp(0, 1)


CASES = {  # T = 10 unless given: a linear schedule then clips its betas (trained_betas)
    "eps_fixedlarge_clipped": ({}, 10),
    "eps_fixedsmall": ({"variance": "fixedsmall"}, 10),
    "v_unclipped": ({"prediction_type": "v", "clip_denoised": False}, 10),
    "x0_cosine": ({"prediction_type": "x0", "beta_schedule": "cosine"}, 10),
    "named_linear_respaced": ({"num_timesteps": 50}, 5),
    "sigmoid_fixedsmall_respaced": ({"beta_schedule": "sigmoid", "variance": "fixedsmall"}, 4),
}


@pytest.mark.parametrize(("settings", "steps"), CASES.values(), ids=CASES.keys())
def test_the_pipeline_samples_as_the_model(settings, steps, tmp_path):
    model = module(**settings)
    save_pipeline(model, tmp_path)
    pipe = DDPMPipeline.from_pretrained(tmp_path)
    got, expected = pipeline_images(pipe, 2, 5, steps), our_images(model, 2, 5, steps)
    assert (expected[0] - expected[1]).abs().max() > 0.1  # samples, not a constant image
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_a_model_normalized_otherwise_is_refused():
    model = module()
    model.hparams["normalization"] = {"shift": [0.0], "scale": [1.0]}
    with pytest.raises(
        UserError, match=r"normalization .* is not DDPMPipeline's .* — export with --format safetensors"
    ):
        check_pipeline_fits(model)


def test_a_model_with_learned_variances_is_refused():
    model = module()
    model.hparams["variance"] = "learned_range"
    with pytest.raises(UserError, match=r"hparam variance='learned_range' != 'fixed'"):
        check_pipeline_fits(model)
