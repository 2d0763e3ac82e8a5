"""Round 17's model files holding a setting the model refuses, said as the file's key with the file's fix: a
train.py checkpoint's hyper_parameters (jsonargparse's `Parser key "module.prediction_type": ...` named no file, and
sample added "see --help"), an export's config.json (lines of arguments the user never passed:
`pass sample_shape=(1, H, W) for this network`), and an export's `weights` that is neither ema nor raw (sample told
to pass `--weights bogus`, which it then refused)."""

import json
from pathlib import Path

import pytest
import torch
from helpers.user_errors import error_line

from diffusion.cli import sample
from diffusion.errors import InvalidValue
from diffusion.models import UNet
from diffusion.training.exported import CONFIG, write_export
from diffusion.training.loading import SETTINGS_FIX, load_checkpoint
from diffusion.training.module import DiffusionModule

INIT_ARGS = {
    "in_channels": 1,
    "channels": 8,
    "channel_mult": [1],
    "num_res_blocks": 1,
    "attention_levels": [],
}
NETWORK = {"class_path": "diffusion.models.UNet", "init_args": INIT_ARGS}
EXPORT_FIX = "correct it in config.json's hyper_parameters, or export the checkpoint again (python -m diffusion.export)"

# A setting of DiffusionModule edited in a model's file, and how the line says it (its own check's words)
CHECKPOINT_SETTINGS = {
    "prediction_type": ("q", "prediction_type='q' is not supported"),
    "lr_schedule": ("x", "lr_schedule='x' is not supported"),
    "loss_weighting": ("x", "loss_weighting='x' is not supported"),
    "noise_mode": ("x", "noise_mode='x' is not supported"),
    "variance": ("x", "variance='x' is not supported"),
    "lr": ("abc", "lr='abc' is a str, not a number"),
    "adam_betas": ([0.9], "adam_betas=[0.9] must be two numbers in [0, 1)"),
    "class_names": (5, "class_names=5 is an int, not a list of names"),
    "compile_mode": ("x", "compile_mode='x' is not supported"),
    "compile_training": ("yes", "compile_training='yes' is not supported"),
}
EXPORT_SETTINGS = {
    **CHECKPOINT_SETTINGS,
    # two keys that do not fit each other (the network's channels and the samples'): the file's, not arguments
    "sample_shape": ([3, 8, 8], "UNet is for images of 1 channel, and sample_shape=(3, 8, 8) has 3"),
    "label_dropout": (2.0, "label_dropout=2.0 must be in [0, 1)"),
    "normalization": (
        {"shift": [0.5, 0.5], "scale": [0.5, 0.5]},
        "normalization has 2 shift and 2 scale values, but the samples of sample_shape=(1, 8, 8) have 1 channel",
    ),
}


def edited_checkpoint(checkpoint: Path, folder: Path, key: str, value: object) -> Path:
    """A copy of train.py's `checkpoint` in `folder` whose hyper_parameters hold `value` for `key`."""
    contents = torch.load(checkpoint, map_location="cpu", weights_only=True)
    contents["hyper_parameters"][key] = value
    path = folder / f"edited_{key}.ckpt"
    torch.save(contents, path)
    return path


def edited_export(folder: Path, key: str, value: object, hyper_parameter: bool = True) -> Path:
    """A tiny export in `folder` whose config.json holds `value` for `key` (of its hyper_parameters, or its own)."""
    torch.manual_seed(0)
    module = DiffusionModule(
        UNet(**INIT_ARGS), sample_shape=(1, 8, 8), num_timesteps=10, beta_schedule="cosine"
    )
    write_export(module, NETWORK, folder, "ema")
    config = json.loads((folder / CONFIG).read_text())
    (config["hyper_parameters"] if hyper_parameter else config)[key] = value
    (folder / CONFIG).write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("key", CHECKPOINT_SETTINGS)
def test_a_checkpoint_setting_the_module_refuses_is_said_as_the_files_key(key, digits_checkpoint, tmp_path):
    value, said = CHECKPOINT_SETTINGS[key]
    path = edited_checkpoint(digits_checkpoint, tmp_path, key, value)
    with pytest.raises(InvalidValue) as refused:
        load_checkpoint(path)
    assert str(refused.value) == f"{path}: {said} — {SETTINGS_FIX}"


@pytest.mark.parametrize("key", EXPORT_SETTINGS)
def test_an_export_setting_the_module_refuses_is_said_as_the_files_key(key, tmp_path):
    value, said = EXPORT_SETTINGS[key]
    folder = edited_export(tmp_path, key, value)
    with pytest.raises(InvalidValue) as refused:
        load_checkpoint(folder)
    assert str(refused.value) == f"{folder / CONFIG}: {said} — {EXPORT_FIX}"


@pytest.mark.parametrize("weights", [None, "raw"])
def test_an_exports_weights_neither_ema_nor_raw_is_said_as_the_files_key(weights, tmp_path):
    folder = edited_export(tmp_path, "weights", "bogus", hyper_parameter=False)
    with pytest.raises(InvalidValue) as refused:
        load_checkpoint(folder, weights=weights)
    assert str(refused.value) == (
        f"{folder / CONFIG}: weights='bogus' is not 'ema' or 'raw' (which of the run's weights model.safetensors "
        'holds) — set it to "ema" in config.json ("raw" if the export holds the raw weights), or export '
        "the checkpoint again (python -m diffusion.export)"
    )


def test_sample_says_a_checkpoint_setting_as_the_files_key(digits_checkpoint, tmp_path, capsys):
    path = edited_checkpoint(digits_checkpoint, tmp_path, "prediction_type", "q")
    args = ["--ckpt", str(path), "--num_samples", "2", "--out", str(tmp_path / "s")]
    with pytest.raises(SystemExit) as exit_info:
        sample.main(args)
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert line == f"error: {path}: prediction_type='q' is not supported — {SETTINGS_FIX}"  # no "see --help"
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("key", ["sample_shape", "normalization", "network", "num_timesteps"])
def test_a_setting_deleted_from_an_exports_config_is_said_as_the_key_it_lacks(key, tmp_path):
    # sample_shape deleted was filled in as (1, 8, 8) without a word, normalization deleted said as the model's lack
    # with a fix in Python, network deleted a KeyError (tester round 23a, R1)
    folder = edited_export(tmp_path, "unused", None)
    config = json.loads((folder / CONFIG).read_text())
    del config["hyper_parameters"][key], config["hyper_parameters"]["unused"]
    (folder / CONFIG).write_text(json.dumps(config))
    with pytest.raises(InvalidValue) as refused:
        load_checkpoint(folder)
    assert str(refused.value) == (
        f"{folder / CONFIG}: hyper_parameters has no {key} (every export writes network, sample_shape, "
        "normalization, num_timesteps, beta_schedule, prediction_type) — put it back in config.json's "
        "hyper_parameters as the export wrote it, or export the checkpoint again (python -m diffusion.export)"
    )
