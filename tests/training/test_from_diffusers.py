"""Pretrained diffusers models in: a UNet2DModel or DDPMPipeline folder written by diffusers itself (small widths,
random weights, save_pretrained) loads as a DiffusionModule whose network computes UNet2DModel's function and
whose DDPM samples are the pipeline's for the same noise; it fine-tunes with --model.init_from; a layout that
does not map is refused in one line naming what differs. Nothing is downloaded."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel
from helpers import QUICK
from helpers.user_errors import error_line
from safetensors.torch import load_file, save_file

from diffusion.cli.evaluate import main as evaluate
from diffusion.cli.sample import main as sample
from diffusion.cli.train import main
from diffusion.core.sampling import SamplingOptions
from diffusion.errors import UserError
from diffusion.models.diffusers_unet import diffusers_unet_weights
from diffusion.training.checkpoint_files import read_network_weights
from diffusion.training.loading import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
# Ho et al.'s layout at small widths: google/ddpm-cifar10-32's settings (attention at the second level).
HO_LAYOUT = {
    "block_out_channels": (32, 64), "layers_per_block": 1, "down_block_types": ("DownBlock2D", "AttnDownBlock2D"),
    "up_block_types": ("AttnUpBlock2D", "UpBlock2D"), "attention_head_dim": None, "norm_eps": 1e-6,
    "flip_sin_to_cos": False, "freq_shift": 1, "downsample_padding": 0, "norm_num_groups": 32,
}  # fmt: skip


def diffusers_unet(in_channels: int = 3, **overrides) -> UNet2DModel:
    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=16, in_channels=in_channels, out_channels=in_channels, **{**HO_LAYOUT, **overrides}
    )
    with torch.no_grad():  # every layer shapes the output (diffusers zero-initialises none, but be sure)
        for parameter in unet.parameters():
            parameter.normal_(0, 0.1)
    return unet.eval()


@pytest.mark.parametrize("head_dim", [None, 16], ids=["one_head", "four_heads"])
def test_the_network_computes_the_unet2dmodels_function(head_dim, tmp_path):
    unet = diffusers_unet(attention_head_dim=head_dim)
    unet.save_pretrained(tmp_path)
    module = load_checkpoint(tmp_path)
    x, t = torch.randn(3, 3, 16, 16), torch.tensor([0, 421, 999])
    with torch.no_grad():
        torch.testing.assert_close(module.network(x, t), unet(x, t).sample, atol=1e-5, rtol=0)
    assert (
        module.sample_shape == (3, 16, 16) and module.hparams.num_timesteps == 1000
    )  # no scheduler: Ho et al.'s


def test_weights_under_older_diffusers_attention_names_load_alike(tmp_path):
    unet = diffusers_unet()
    unet.save_pretrained(tmp_path)
    path = tmp_path / "diffusion_pytorch_model.safetensors"
    old = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
    state = {}
    for key, value in load_file(path).items():
        for new, before in old.items():
            key = key.replace(f".{new}.", f".{before}.")
        state[key] = value
    assert any(".query." in key for key in state)
    save_file(state, path)
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([3, 700])
    with torch.no_grad():
        torch.testing.assert_close(
            load_checkpoint(tmp_path).network(x, t), unet(x, t).sample, atol=1e-5, rtol=0
        )


SCHEDULERS = {
    "linear_fixed_small_clipped": {"num_train_timesteps": 10},
    "linear_fixed_large_v": {"num_train_timesteps": 10, "variance_type": "fixed_large",
                             "prediction_type": "v_prediction", "clip_sample": False},
    "cosine_x0": {"num_train_timesteps": 12, "beta_schedule": "squaredcos_cap_v2", "prediction_type": "sample"},
}  # fmt: skip


@pytest.mark.parametrize("scheduler", SCHEDULERS.values(), ids=SCHEDULERS.keys())
def test_the_pipeline_samples_as_diffusers_samples(scheduler, tmp_path):
    pipe = DDPMPipeline(unet=diffusers_unet(), scheduler=DDPMScheduler(**scheduler))
    pipe.save_pretrained(tmp_path)
    pipe.set_progress_bar_config(disable=True)
    T = scheduler["num_train_timesteps"]
    theirs = pipe(batch_size=2, generator=torch.Generator().manual_seed(5), num_inference_steps=T,
                  output_type="pt").images  # fmt: skip
    module = load_checkpoint(tmp_path)
    torch.testing.assert_close(module.schedule.betas, DDPMScheduler(**scheduler).betas, rtol=1e-6, atol=0)
    torch.manual_seed(5)  # as the pipeline's generator: x_T, then each step's noise
    ours = (module.sample(2, options=SamplingOptions(steps=T)) * 0.5 + 0.5).clamp(0, 1)
    assert (theirs[0] - theirs[1]).abs().max() > 0.1  # samples, not a constant image
    torch.testing.assert_close(ours, torch.as_tensor(theirs), atol=1e-5, rtol=0)


def test_the_sample_command_export_md_prints_samples_a_pipeline_folder(tmp_path, monkeypatch):
    """docs/export.md's `python -m diffusion.sample --ckpt ddpm-cifar10-32/ ...`, as printed (a folder given as
    --ckpt is a diffusers model before it is a folder to search for a checkpoint), fewer samples and steps
    appended."""
    (printed,) = [
        line.split("#")[0].split()
        for line in (ROOT / "docs" / "export.md").read_text().splitlines()
        if line.startswith("python -m diffusion.sample --ckpt ddpm-cifar10-32/")
    ]
    DDPMPipeline(unet=diffusers_unet(), scheduler=DDPMScheduler()).save_pretrained(
        tmp_path / "ddpm-cifar10-32"
    )
    monkeypatch.chdir(tmp_path)
    path = sample(printed[3:] + ["--num_samples", "2", "--steps", "2"])
    with np.load(path) as samples:
        assert samples["arr_0"].shape == (2, 16, 16, 3) and samples["arr_0"].dtype == np.uint8


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"flip_sin_to_cos": True}, "flip_sin_to_cos=True does not map"),
     ({"attention_head_dim": 8, "down_block_types": ("AttnDownBlock2D", "DownBlock2D"),
       "up_block_types": ("UpBlock2D", "AttnUpBlock2D")}, r"attention_head_dim=8 at attention widths \[32, 64\]"),
     ({"downsample_padding": 1}, "downsample_padding=1 does not map")],
)  # fmt: skip
def test_a_layout_that_does_not_map_is_refused_naming_what_differs(overrides, message, tmp_path):
    diffusers_unet(**overrides).save_pretrained(tmp_path)
    with pytest.raises(UserError, match=message):
        load_checkpoint(tmp_path)


def test_a_scheduler_without_counterpart_is_refused(tmp_path):
    DDPMPipeline(
        unet=diffusers_unet(), scheduler=DDPMScheduler(beta_schedule="scaled_linear")
    ).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="beta_schedule='scaled_linear' has no counterpart"):
        load_checkpoint(tmp_path)


def test_init_from_a_pipeline_fine_tunes_its_network_and_schedule(tmp_path):
    unet = diffusers_unet(in_channels=1)  # the digits' one channel
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=200)).save_pretrained(
        tmp_path / "pipe"
    )
    cli = main([*QUICK, "--model.init_from", str(tmp_path / "pipe"), "--max_steps", "1", "--model.lr", "1e-12",
                "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")])  # fmt: skip
    assert cli.model.hparams.num_timesteps == 200
    assert dict(cli.config.model.network.init_args)["channel_mult"] == [1, 2]
    start = read_network_weights(tmp_path / "pipe")
    # Adam's first step moves each weight by about lr: with lr 1e-12 the trained weights are the loaded ones.
    for key, value in cli.model.network.state_dict().items():
        torch.testing.assert_close(value, start[key], atol=1e-9, rtol=0, msg=key)
    assert set(diffusers_unet_weights(cli.model.network)) == set(unet.state_dict())


def broken_folders(root: Path) -> dict[str, Path]:
    """Diffusers folders with one thing wrong each (from one pipeline written by diffusers), by case."""
    DDPMPipeline(unet=diffusers_unet(in_channels=1), scheduler=DDPMScheduler()).save_pretrained(root / "pipe")
    folders = {}
    for case in ("pipeline_without_unet_config", "pipeline_without_weights", "weights_without_config",
                 "another_class", "layout_that_does_not_map"):  # fmt: skip
        shutil.copytree(root / "pipe", root / case)
        folders[case] = root / case
    (root / "pipeline_without_unet_config" / "unet" / "config.json").unlink()
    for weights in (root / "pipeline_without_weights" / "unet").glob("diffusion_pytorch_model.*"):
        weights.unlink()
    for case, change in [("weights_without_config", None), ("another_class", {"_class_name": "UNet2DConditionModel"}),
                         ("layout_that_does_not_map", {"flip_sin_to_cos": True})]:  # fmt: skip
        unet = root / case / "unet"
        (root / case / "model_index.json").unlink()
        config = json.loads((unet / "config.json").read_text())
        (unet / "config.json").unlink()
        if change is not None:
            (unet / "config.json").write_text(json.dumps({**config, **change}))
        folders[case] = unet  # a UNet2DModel folder
    return folders


BROKEN = {  # what the line says of each folder (after "<flag> <folder>: ")
    "pipeline_without_unet_config": "it has no unet/config.json",
    "pipeline_without_weights": "it has no weights: no unet/diffusion_pytorch_model.safetensors or",
    "weights_without_config": r"it holds diffusers weights \(diffusion_pytorch_model.safetensors\) but no config.json",
    "another_class": "its config.json is a diffusers UNet2DConditionModel's, not a UNet2DModel's",
    "layout_that_does_not_map": "a UNet2DModel with flip_sin_to_cos=True does not map to this project's UNet",
}
COMMANDS = {  # flag: the command, given a folder with that flag
    "--ckpt": lambda folder, out: sample(["--ckpt", str(folder), "--out", str(out)]),
    "--nll --ckpt": lambda folder, out: evaluate(["--nll", "--ckpt", str(folder)]),
    "--model.init_from": lambda folder, out: main(
        [*QUICK, "--model.init_from", str(folder), "--trainer.logger.init_args.save_dir", str(out)]
    ),
}


def test_a_broken_diffusers_folder_is_named_as_such_by_every_flag_that_takes_one(tmp_path, capsys):
    folders = broken_folders(tmp_path / "models")
    for case, folder in folders.items():
        for flag, command in COMMANDS.items():
            with pytest.raises(SystemExit) as exit_info:
                command(folder, tmp_path / "out")
            line = error_line(capsys.readouterr().err)
            subject = f"{flag.split()[-1]} {folder}: "
            assert exit_info.value.code == 2 and re.search(f"error: {re.escape(subject)}{BROKEN[case]}", line), (
                case, flag, line,
            )  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_diffusers_model_of_other_channels_than_the_data_is_refused_naming_both(tmp_path, capsys):
    diffusers_unet(in_channels=3).save_pretrained(tmp_path / "rgb")
    with pytest.raises(SystemExit) as exit_info:
        COMMANDS["--model.init_from"](tmp_path / "rgb", tmp_path / "runs")  # the digits: 1 channel
    line = error_line(capsys.readouterr().err)
    assert exit_info.value.code == 2 and line.startswith(
        f"error: --model.init_from {tmp_path / 'rgb'}: it is a diffusers UNet for 3-channel images (3 in, 3 out), "
        "and this run's network is for 1-channel images (1 in, 1 out"
    ), line


def test_weights_of_another_shape_than_the_config_name_the_folder(tmp_path):
    diffusers_unet().save_pretrained(tmp_path / "damaged")
    weights = tmp_path / "damaged" / "diffusion_pytorch_model.safetensors"
    state = load_file(weights)
    state["conv_in.weight"] = torch.zeros(5, 3, 3, 3)  # 135 values where 32 x 3 x 3 x 3 belong
    save_file(state, weights)
    with pytest.raises(UserError, match=re.escape(
        f"{tmp_path / 'damaged'}: its weight conv_in.weight has shape [5, 3, 3, 3], and its config.json asks for "
        "[32, 3, 3, 3]"
    )):  # fmt: skip
        load_checkpoint(tmp_path / "damaged")
