"""An export of this project's format (`python -m diffusion.export --format safetensors`) as a model: its folder, its
config.json or its model.safetensors. `--model.init_from` starts a new run from the one set of weights it holds (as
from a checkpoint's network weights, refused for a network of another class); its model.safetensors passed alone
stands for its folder (with a note) wherever a model is read, and any other safetensors file is said to be one, not
"truncated"; a raw-weights export asked for its EMA weights says which flag to pass."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import QUICK, TINY_UNET
from helpers.user_errors import run_in_process
from safetensors.torch import load_file

from diffusion.cli import evaluate, export, sample
from diffusion.cli.reporting import one_line
from diffusion.cli.train import DiffusionCLI, main, with_default_config
from diffusion.errors import UserError
from diffusion.training.loading import load_checkpoint

FLAGS = [*TINY_UNET, "--trainer.logger", "false"]


@pytest.fixture(scope="module")
def raw_export(digits_checkpoint, tmp_path_factory) -> Path:
    """The tiny digits run's raw weights exported (the tester's x/d09)."""
    out = tmp_path_factory.mktemp("exports") / "d09"
    export.main(
        ["--ckpt", str(digits_checkpoint), "--format", "safetensors", "--out", str(out), "--weights", "raw"]
    )
    return out


def assert_same(state: dict, expected: dict) -> None:
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(state[key], value), key


@pytest.mark.parametrize("given", ["folder", "config.json", "model.safetensors"])
def test_init_from_an_export_starts_from_the_weights_it_holds(given, raw_export, caplog):
    expected = load_file(raw_export / "model.safetensors")
    args = with_default_config(FLAGS)
    fresh = DiffusionCLI(args).model.network.state_dict()
    assert any(not torch.equal(fresh[key], expected[key]) for key in expected), (
        "precondition: a fresh init differs"
    )
    path = raw_export if given == "folder" else raw_export / given
    model = DiffusionCLI([*args, "--model.init_from", str(path)]).model
    assert_same(model.network.state_dict(), expected)
    shown = (
        raw_export / "config.json" if given == "config.json" else raw_export
    )  # the weights file: its folder
    assert f"--model.init_from {shown}: starting from the raw weights the export holds" in caplog.text


def test_a_run_from_an_export_trains(raw_export, tmp_path):
    # It was refused: "is an export (python -m diffusion.export), which holds one set of weights and no training
    # state", though init_from takes weights alone (and a diffusers export of the same model was taken).
    main([*TINY_UNET, *QUICK, "--max_steps", "2", "--trainer.val_check_interval", "2",
          "--trainer.logger.init_args.save_dir", str(tmp_path), "--model.init_from", str(raw_export)])  # fmt: skip
    assert (tmp_path / "digits" / "version_0" / "checkpoints" / "last.ckpt").is_file()


def test_init_from_an_export_of_another_network_class_is_refused(raw_export, tmp_path):
    edited = tmp_path / "mlp"
    shutil.copytree(raw_export, edited)
    config = json.loads((edited / "config.json").read_text())
    config["hyper_parameters"]["network"]["class_path"] = "diffusion.models.MLP"
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError) as caught:
        DiffusionCLI(with_default_config([*FLAGS, "--model.init_from", str(edited)]))
    # Its class_path edited to MLP beside UNet's init_args: the file is said as inconsistent, by its key (round 16b's
    # F2 check of a model file's network settings), before its weights are compared with this run's network.
    line = one_line(caught.value)
    assert line.startswith(f"{edited / 'config.json'}: network.init_args holds a setting MLP"), line
    assert line.endswith(
        "— correct it in config.json's hyper_parameters, or export the checkpoint again (python -m diffusion.export)"
    )


def test_an_exports_weights_file_stands_for_its_folder(raw_export, capsys):
    # It was "is truncated or not a PyTorch checkpoint (no intact zip archive)": false of an intact file.
    loaded = load_checkpoint(raw_export / "model.safetensors").state_dict()
    assert f"is the weights file of an export: using its folder {raw_export}" in capsys.readouterr().err
    assert_same(loaded, load_checkpoint(raw_export).state_dict())


def test_another_safetensors_file_is_said_to_be_one(raw_export, tmp_path):
    alone = tmp_path / "weights.safetensors"
    shutil.copy(raw_export / "model.safetensors", alone)
    with pytest.raises(ValueError, match=f"^path {alone} is a safetensors file: weights alone, without the model's "
                       r"settings, not a PyTorch checkpoint — pass a \.ckpt written by train\.py, or where a model is read"):  # fmt: skip
        load_checkpoint(alone)


def test_a_raw_export_asked_for_ema_weights_names_the_argument_or_flag(raw_export, tmp_path, capsys):
    with pytest.raises(ValueError) as caught:
        load_checkpoint(raw_export, weights="ema")
    assert str(caught.value) == (
        f"{raw_export} holds raw weights, not ema (weights ema) — pass weights raw to load them, or export the "
        "checkpoint again with --weights ema"
    )
    # The commands that read a model with --weights say it in their flags: sample, evaluate --nll
    said = (
        f"{raw_export} holds raw weights, not ema (--weights ema) — pass --weights raw to load them, or export the "
        "checkpoint again with --weights ema"
    )
    out = tmp_path / "samples"
    sampled = [
        "--ckpt",
        str(raw_export),
        "--num_samples",
        "2",
        "--steps",
        "2",
        "--out",
        str(out),
        "--device",
        "cpu",
    ]
    assert run_in_process(sample.main, sampled, tmp_path, capsys) == f"error: {said}"
    np.savez(tmp_path / "images.npz", np.zeros((2, 8, 8, 1), np.uint8))
    nll = ["--nll", "--ckpt", str(raw_export), "--data.path", str(tmp_path / "images.npz"), "--device", "cpu"]
    assert run_in_process(evaluate.main, nll, tmp_path, capsys) == f"error: {said}"
