"""A model as a diffusers DDPMPipeline: the scheduler has the model's betas, and from the same generator the
pipeline's DDPM samples equal `DiffusionModule.sample`'s, for every prediction type, variance, clipping and
schedule, with all T steps or fewer (the fresh-session test of the exported folder: tests/cli/test_export.py)."""

import json
from pathlib import Path

import lightning
import numpy as np
import pytest
import torch
from diffusers import DDPMPipeline, DDPMScheduler
from helpers.user_errors import error_line

from diffusion.cli import export
from diffusion.cli.sample import main as sample
from diffusion.cli.to_diffusers import check_pipeline_fits, ddpm_scheduler_config, save_pipeline
from diffusion.core.sampling import SamplingOptions
from diffusion.errors import UserError
from diffusion.models import UNet
from diffusion.training.from_diffusers import diffusers_hyperparameters
from diffusion.training.loading import load_checkpoint
from diffusion.training.module import DiffusionModule

IMAGES = {"shift": [0.5], "scale": [0.5]}


def clipped_linear(T: int) -> list[float]:
    """The linear betas of T <= 20 steps as this project clips them at 0.999 (with a warning), given as a "trained"
    schedule: betas no named schedule of diffusers' has (its trained_betas)."""
    return torch.linspace(1e-4 * 1000 / T, 0.02 * 1000 / T, T, dtype=torch.float64).clamp(max=0.999).tolist()


def module(beta_schedule="trained", num_timesteps=10, prediction_type="eps", **sampling) -> DiffusionModule:
    """A tiny image model with random weights everywhere, so every layer shapes the samples; the "trained" schedule
    is `clipped_linear`'s."""
    torch.manual_seed(0)
    network = UNet(in_channels=1, channels=8, channel_mult=(1, 2), num_res_blocks=1)
    with torch.no_grad():
        for p in network.parameters():
            p.normal_(0, 0.2)
    return DiffusionModule(
        network, sample_shape=(1, 8, 8), normalization=IMAGES, beta_schedule=beta_schedule,
        num_timesteps=num_timesteps, prediction_type=prediction_type, sampling=SamplingOptions(**sampling),
        trained_betas=clipped_linear(num_timesteps) if beta_schedule == "trained" else None,
    ).eval()  # fmt: skip


SCHEDULES = {
    "linear_1000": ("linear", 1000, "linear"),
    "linear_50": ("linear", 50, "linear"),  # betas scaled by 1000 / T
    "trained_20_clipped_linear": ("trained", 20, None),
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


CASES = {  # T = 10 and the clipped linear betas (trained_betas) unless given
    "eps_fixedlarge_clipped": ({}, 10),
    "eps_fixedsmall": ({"variance": "fixedsmall"}, 10),
    "v_unclipped": ({"prediction_type": "v", "clip_denoised": False}, 10),
    "x0_cosine": ({"prediction_type": "x0", "beta_schedule": "cosine"}, 10),
    "named_linear_respaced": ({"beta_schedule": "linear", "num_timesteps": 50}, 5),
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


# ---- export and re-import: every schedule the project trains comes back ------------------------------------------
INIT_ARGS = {"in_channels": 1, "channels": 8, "channel_mult": [1, 2], "num_res_blocks": 1}
UNET = "diffusion.models.UNet"


def save_checkpoint(model: DiffusionModule, network: dict, path: Path) -> Path:
    """`model` as train.py's checkpoints hold it (settings, the network's config, weights), without a Trainer."""
    hparams = {
        **model.hparams,
        "network": network,
        "_instantiator": "lightning.pytorch.cli.instantiate_module",
    }
    torch.save({"pytorch-lightning_version": lightning.__version__, "state_dict": model.state_dict(),
                "hyper_parameters": hparams}, path)  # fmt: skip
    return path


def trained(path: Path, variance: str = "fixed", **settings) -> Path:
    """A checkpoint of a tiny image model with random weights and these settings."""
    init_args = {**INIT_ARGS, "out_channels": 2 if variance == "learned_range" else None}
    torch.manual_seed(0)
    network = UNet(**init_args)
    with torch.no_grad():
        for p in network.parameters():
            p.normal_(0, 0.2)
    model = DiffusionModule(
        network, sample_shape=(1, 8, 8), normalization=IMAGES, variance=variance, **settings
    )
    return save_checkpoint(model, {"class_path": UNET, "init_args": init_args}, path)


CLIPPED_20 = clipped_linear(20)
# beta_schedule, T, prediction: every named schedule at T = 1000 and at a few steps (the clipped linear betas of
# T = 20: trained_betas), zero terminal SNR (trained_betas ending at 1), learned variances (diffusers:
# refused), and the "trained" schedule a re-import gives, itself exported again (betas that even decrease).
ROUND_TRIPS = {
    "linear_1000_eps": {"beta_schedule": "linear", "num_timesteps": 1000},
    "trained_20_eps_clipped_linear": {"beta_schedule": "trained", "num_timesteps": 20, "trained_betas": CLIPPED_20},
    "linear_50_x0_fixedsmall": {"num_timesteps": 50, "prediction_type": "x0", "sampling": {"variance": "fixedsmall"}},
    "linear_1000_v_zero_snr": {"num_timesteps": 1000, "prediction_type": "v", "zero_terminal_snr": True},
    "trained_20_v_learned": {"beta_schedule": "trained", "num_timesteps": 20, "trained_betas": CLIPPED_20,
                             "prediction_type": "v", "variance": "learned_range"},
    "cosine_1000_v": {"beta_schedule": "cosine", "num_timesteps": 1000, "prediction_type": "v"},
    "cosine_20_eps_learned": {"beta_schedule": "cosine", "num_timesteps": 20, "variance": "learned_range"},
    "cosine_20_x0_zero_snr": {"beta_schedule": "cosine", "num_timesteps": 20, "prediction_type": "x0",
                              "zero_terminal_snr": True},
    "sigmoid_1000_x0": {"beta_schedule": "sigmoid", "num_timesteps": 1000, "prediction_type": "x0"},
    "sigmoid_50_eps": {"beta_schedule": "sigmoid", "num_timesteps": 50},
    "sigmoid_20_v_zero_snr_learned": {"beta_schedule": "sigmoid", "num_timesteps": 20, "prediction_type": "v",
                                      "zero_terminal_snr": True, "variance": "learned_range"},
    "trained_20_v": {"beta_schedule": "trained", "num_timesteps": 20, "prediction_type": "v",
                     "trained_betas": [0.02, 0.01, *torch.linspace(0.05, 0.6, 18).tolist()]},
}  # fmt: skip


def assert_same_model(loaded: DiffusionModule, original: DiffusionModule) -> None:
    """The same schedule (float tolerance), network function and sampling settings, and the same samples from the
    same seed (DDPM over 3 steps, respaced: the first step is t = T - 1, where a zero-SNR schedule ends)."""
    for name in ("betas", "alphas_cumprod", "sqrt_one_minus_alphas_cumprod"):
        theirs, ours = getattr(loaded.schedule, name), getattr(original.schedule, name)
        torch.testing.assert_close(theirs, ours, rtol=1e-6, atol=0, msg=name)
    assert loaded.schedule.zero_terminal_snr == original.schedule.zero_terminal_snr
    assert loaded.sample_shape == original.sample_shape and loaded.normalization == original.normalization
    for key in ("prediction_type", "variance"):
        assert loaded.hparams[key] == original.hparams[key], key
    assert loaded.sampling == original.sampling or loaded.sampling.variance == original.sampler().variance
    x, t = torch.randn(3, 1, 8, 8), torch.tensor([0, 7, original.schedule.num_timesteps - 1])
    with torch.no_grad():
        torch.testing.assert_close(loaded.network(x, t), original.network(x, t), rtol=0, atol=1e-5)
    samples = [m.sample(2, seed=3, options=SamplingOptions(steps=3)) for m in (loaded, original)]
    assert (samples[1][0] - samples[1][1]).abs().max() > 0.1  # samples, not a constant image
    torch.testing.assert_close(samples[0], samples[1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("settings", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_an_export_loads_back_as_the_model_it_was_in_both_formats(settings, tmp_path, capsys):
    checkpoint = trained(tmp_path / "model.ckpt", **settings)
    original = load_checkpoint(checkpoint)
    out = export.main(
        ["--ckpt", str(checkpoint), "--format", "safetensors", "--out", str(tmp_path / "safetensors")]
    )
    assert_same_model(load_checkpoint(out), original)
    args = ["--ckpt", str(checkpoint), "--format", "diffusers", "--out", str(tmp_path / "diffusers")]
    if (
        settings.get("variance") == "learned_range"
    ):  # DDPMPipeline has no learned variances: one line, as ever
        with pytest.raises(SystemExit) as exit_info:
            export.main(args)
        line = error_line(capsys.readouterr().err)
        assert exit_info.value.code == 2 and "(learned variances); diffusers' DDPMPipeline takes" in line, (
            line
        )
        return
    out = export.main(args)
    loaded = load_checkpoint(out)
    assert_same_model(loaded, original)
    # diffusers' own pipeline samples the folder as the model does ...
    pipe = DDPMPipeline.from_pretrained(out)
    torch.testing.assert_close(
        pipeline_images(pipe, 2, 5, 3), our_images(original, 2, 5, 3), rtol=0, atol=1e-5
    )
    # ... and what was read back is a model whose checkpoint holds plain data (weights_only=True, no code run).
    network = diffusers_hyperparameters(out)["network"]
    again = load_checkpoint(save_checkpoint(loaded, network, tmp_path / "reimported.ckpt"))
    assert_same_model(again, original)


def test_the_sample_command_samples_a_diffusers_export_as_its_checkpoint(tmp_path):
    """`python -m diffusion.sample --ckpt EXPORT` of a run with 20 timesteps (the clipped linear betas:
    trained_betas)."""
    checkpoint = trained(
        tmp_path / "model.ckpt", beta_schedule="trained", num_timesteps=20, trained_betas=CLIPPED_20
    )
    out = export.main(
        ["--ckpt", str(checkpoint), "--format", "diffusers", "--out", str(tmp_path / "pipeline")]
    )
    samples = {}
    for name, model in (("checkpoint", checkpoint), ("export", out)):
        path = sample(
            ["--ckpt", str(model), "--out", str(tmp_path / name), "--num_samples", "3", "--steps", "4"]
        )
        with np.load(path) as npz:
            samples[name] = npz["arr_0"].astype(int)
    assert samples["export"].shape == (3, 8, 8, 1) and samples["export"].std() > 10
    assert np.abs(samples["export"] - samples["checkpoint"]).max() <= 1  # uint8 rounding of equal floats


def edit_scheduler(folder: Path, **changes) -> None:
    path = folder / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


BAD_BETAS = {  # trained_betas (of a T = 20 export) -> what the line says, the betas summarised
    "too_few": (lambda betas: betas[:-1], r"trained_betas=<19 betas, 0.005 ... 0.947632> are not one beta per timestep \(num_timesteps=20\)"),
    "above_1": (lambda betas: [*betas[:5], 1.5, *betas[6:]], r"<20 betas, 0.005 ... 0.999> .* beta\[5\]=1.5 outside"),
    "zero": (lambda betas: [0.0, *betas[1:]], r"beta\[0\]=0 outside \(0, 1\)"),
    "not_finite": (lambda betas: [*betas[:-1], float("nan")], r"beta\[19\]=nan outside"),
    "zero_snr_for_eps": (lambda betas: [*betas[:-1], 1.0], r"trained_betas end at alpha_bar_T = 0 .*, where prediction_type='epsilon' is undefined"),
}  # fmt: skip


@pytest.mark.parametrize(("change", "message"), BAD_BETAS.values(), ids=BAD_BETAS.keys())
def test_trained_betas_that_are_no_schedule_are_refused_in_one_short_line(change, message, tmp_path):
    model = trained(
        tmp_path / "model.ckpt", beta_schedule="trained", num_timesteps=20, trained_betas=CLIPPED_20
    )
    out = export.main(["--ckpt", str(model), "--format", "diffusers",
                       "--out", str(tmp_path / "pipeline")])  # fmt: skip
    betas = json.loads((out / "scheduler" / "scheduler_config.json").read_text())["trained_betas"]
    edit_scheduler(out, trained_betas=change(betas))
    with pytest.raises(UserError, match=message) as error:
        load_checkpoint(out)
    line = str(error.value)
    assert line.startswith(f"{out}: its scheduler/scheduler_config.json: ") and "\n" not in line
    assert len(line) - len(str(out)) < 250, line  # 20 betas would take 400 characters


def test_the_pipeline_is_written_as_save_pretrained_writes_it(tmp_path):
    """save_pipeline writes each file itself (a full disk is then an OSError the export names, where safetensors'
    own writer raised a SafetensorError): the same files as diffusers' save_pretrained, the weights byte for byte,
    and the pipeline loads back from them."""
    model = module("linear", 50)
    save_pipeline(model, tmp_path / "ours")
    pipe = DDPMPipeline.from_pretrained(tmp_path / "ours")
    pipe.save_pretrained(tmp_path / "theirs")

    def files(folder: Path) -> dict[str, bytes]:
        return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

    ours, theirs = files(tmp_path / "ours"), files(tmp_path / "theirs")
    assert ours.keys() == theirs.keys() == {
        "model_index.json", "scheduler/scheduler_config.json", "unet/config.json",
        "unet/diffusion_pytorch_model.safetensors",
    }  # fmt: skip
    for name in ours:
        if name.endswith(".json"):
            loaded_from = {"_name_or_path": str(tmp_path / "ours")}  # what from_pretrained adds
            assert {**json.loads(ours[name]), **loaded_from} == {**json.loads(theirs[name]), **loaded_from}, (
                name
            )
        else:
            assert ours[name] == theirs[name], name
