"""The safetensors export: `load_checkpoint` rebuilds the exported model from JSON and safetensors alone, runs no
code to do it, and refuses what it cannot read in one line (the export command: tests/cli/test_export.py)."""

import json

import pytest
import torch

from diffusion.errors import UserError
from diffusion.models import UNet
from diffusion.training.exported import CONFIG, WEIGHTS, write_export
from diffusion.training.loading import load_checkpoint
from diffusion.training.module import DiffusionModule

INIT_ARGS = {"in_channels": 1, "channels": 8, "channel_mult": [1, 2], "num_res_blocks": 1}


@pytest.fixture
def exported(tmp_path):
    """An export of a tiny image model with random weights, and the model."""
    torch.manual_seed(0)
    module = DiffusionModule(
        UNet(**INIT_ARGS), sample_shape=(1, 8, 8), normalization={"shift": [0.5], "scale": [0.5]},
        beta_schedule="cosine", num_timesteps=10, class_names=None,
    )  # fmt: skip
    with torch.no_grad():
        for p in module.network.parameters():
            p.normal_(0, 0.2)
    folder = tmp_path / "export"
    folder.mkdir()
    write_export(module, {"class_path": "diffusion.models.UNet", "init_args": INIT_ARGS}, folder, "ema")
    return folder, module


def edit_config(folder, change) -> None:
    config = json.loads((folder / CONFIG).read_text())
    change(config)
    (folder / CONFIG).write_text(json.dumps(config))


def test_load_checkpoint_rebuilds_the_exported_model(exported):
    folder, module = exported
    for path in (folder, folder / CONFIG, str(folder)):
        loaded = load_checkpoint(path)
        assert not loaded.training
        assert loaded.state_dict().keys() == module.state_dict().keys()
        for key, value in module.state_dict().items():  # the network's weights and the schedule's buffers
            assert torch.equal(loaded.state_dict()[key], value), key
        assert json.dumps(dict(loaded.hparams), sort_keys=True) == json.dumps(
            dict(module.hparams), sort_keys=True
        )
    config = json.loads((folder / CONFIG).read_text())
    assert torch.equal(torch.tensor(config["betas"], dtype=torch.float32), module.schedule.betas)


def test_an_export_holds_the_weights_it_names(exported):
    folder, _ = exported
    assert load_checkpoint(folder, weights="ema") is not None
    with pytest.raises(
        UserError,
        match=r"holds ema weights, not raw \(weights raw\) — pass weights ema to load them, or export the "
        r"checkpoint again with --weights raw",
    ):
        load_checkpoint(folder, weights="raw")


BROKEN = {
    "not_json": (lambda f: (f / CONFIG).write_text("{nope"), r"config.json is not valid JSON .* diffusion.export"),
    "another_json": (lambda f: (f / CONFIG).write_text('{"a": 1}'), r"is not the config of an export of this project"),
    "a_later_format": (
        lambda f: edit_config(f, lambda c: c.update(format_version=2)),
        r"has format_version 2, this version reads 1",
    ),
    "code_as_the_network": (
        lambda f: edit_config(f, lambda c: c["hyper_parameters"]["network"].update(class_path="os.system")),
        r"config.json: the export's network os.system is not one of this project's networks, and loading runs no "
        r"other code",
    ),
    "not_a_network": (
        lambda f: edit_config(
            f, lambda c: c["hyper_parameters"]["network"].update(class_path="diffusion.models.ClassEmbedding")
        ),
        r"not one of this project's networks",
    ),
    "a_setting_of_another_version": (
        lambda f: edit_config(f, lambda c: c["hyper_parameters"].update(temperature=0.5)),
        r"config.json: hyper_parameters holds temperature, which this version's DiffusionModule does not take — "
        r"remove it from config.json's hyper_parameters if it was added there, or load the export with the version",
    ),
    "no_weights": (lambda f: (f / WEIGHTS).unlink(), r"model.safetensors cannot be read"),
    "random_weights_file": (
        lambda f: (f / WEIGHTS).write_bytes(b"\x00" * 64), r"model.safetensors is damaged: its bytes do not match"
    ),
}  # fmt: skip


@pytest.mark.parametrize(("damage", "expected"), BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_export_is_refused_in_one_line(exported, damage, expected):
    folder, _ = exported
    damage(folder)
    with pytest.raises(UserError, match=expected) as error:
        load_checkpoint(folder)
    assert "\n" not in str(error.value) and " — " in str(error.value)


def test_a_missing_export_says_what_to_pass(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"no export config at .*nope.json — pass a folder written by"
    ):
        load_checkpoint(tmp_path / "nope.json")
