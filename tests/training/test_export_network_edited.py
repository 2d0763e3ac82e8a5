"""An export whose config.json's network was edited (its weights, checked by their checksum, are the ones the export
wrote): the misfit is said of config.json's network, with the fix there, not as a folder that export never wrote
(round 19's P1: `pass a folder written by python -m diffusion.export`, to a user who had)."""

import json
import re

import pytest
import torch
from helpers.user_errors import error_line

import diffusion
from diffusion.cli.sample import main as sample_main
from diffusion.errors import WeightsDoNotFit
from diffusion.models import UNet
from diffusion.training.exported import CONFIG, WEIGHTS, write_export
from diffusion.training.module import DiffusionModule

INIT_ARGS = {"in_channels": 1, "channels": 8, "channel_mult": [1, 2], "num_res_blocks": 1}
FIX = "to the network the weights were trained with"


@pytest.fixture
def edited(tmp_path):
    """An export of a tiny model whose config.json says channels 16 (the weights were trained at 8)."""
    module = DiffusionModule(
        UNet(**INIT_ARGS), sample_shape=(1, 8, 8), normalization={"shift": [0.5], "scale": [0.5]},
        beta_schedule="cosine", num_timesteps=10, class_names=None,
    )  # fmt: skip
    folder = tmp_path / "e_ch"
    folder.mkdir()
    write_export(module, {"class_path": "diffusion.models.UNet", "init_args": INIT_ARGS}, folder, "ema")
    config = json.loads((folder / CONFIG).read_text())
    config["hyper_parameters"]["network"]["init_args"]["channels"] = 16
    (folder / CONFIG).write_text(json.dumps(config))
    return folder


def expected_line(folder) -> str:
    return (
        rf"{folder / WEIGHTS}: these weights do not fit the UNet config.json describes \(\d+ of another shape "
        rf"\(e\.g\. [^)]*\)\) — correct hyper_parameters.network in {folder / CONFIG} {FIX}, or export the "
        r"checkpoint again \(python -m diffusion.export\)$"
    )


def test_load_checkpoint_says_config_json_network_does_not_fit_its_weights(edited):
    with pytest.raises(WeightsDoNotFit) as refusal:
        diffusion.load_checkpoint(edited)
    assert isinstance(refusal.value, RuntimeError)  # as torch's own load_state_dict error is
    line = str(refusal.value)
    assert re.fullmatch(expected_line(edited), line), line
    assert "pass a folder written by" not in line


def test_the_sample_command_says_it_in_one_line(edited, tmp_path, capsys):
    out = tmp_path / "s_e_ch"
    with pytest.raises(SystemExit) as exited:
        sample_main(["--ckpt", str(edited), "--num_samples", "2", "--steps", "2", "--out", str(out)])
    assert exited.value.code == 2
    line = error_line(capsys.readouterr().err).removeprefix("error: ")
    assert re.fullmatch(expected_line(edited), line), line
    assert not out.exists() or not any(out.iterdir())


def test_an_export_without_a_checksum_may_hold_other_weights(edited):
    config = json.loads((edited / CONFIG).read_text())
    del config[
        "weights_sha256"
    ]  # an export written before the checksum: its weights are not known to be its own
    (edited / CONFIG).write_text(json.dumps(config))
    with pytest.raises(
        WeightsDoNotFit, match=rf"{FIX} \(or put back the model.safetensors the export wrote\), or"
    ):
        diffusion.load_checkpoint(edited)


def test_the_export_as_written_still_loads(edited):
    config = json.loads((edited / CONFIG).read_text())
    config["hyper_parameters"]["network"]["init_args"]["channels"] = 8
    (edited / CONFIG).write_text(json.dumps(config))
    assert torch.is_tensor(next(diffusion.load_checkpoint(edited).network.parameters()))


@pytest.mark.parametrize("checksum", [12, "abc", "g" * 64, None], ids=["number", "short", "not hex", "null"])
def test_a_weights_checksum_that_is_none_is_said_of_config_json(edited, checksum):
    """Round 20b's S4: `"weights_sha256": 12` was said as model.safetensors damaged (a bad copy or a failing disk)."""
    config = json.loads((edited / CONFIG).read_text())
    config["hyper_parameters"]["network"]["init_args"]["channels"] = 8  # the network of the weights again
    config["weights_sha256"] = checksum
    (edited / CONFIG).write_text(json.dumps(config))
    if checksum is None:  # an export written without it: read unchecked
        assert isinstance(diffusion.load_checkpoint(edited), DiffusionModule)
        return
    with pytest.raises(ValueError) as refused:
        diffusion.load_checkpoint(edited)
    assert str(refused.value) == (
        f"{edited / CONFIG}: weights_sha256={checksum!r} is not a SHA-256 (64 hex digits) — write back the value "
        f"export wrote, or export the checkpoint again (python -m diffusion.export) into {edited}"
    )
