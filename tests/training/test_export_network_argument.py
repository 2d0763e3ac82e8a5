"""`write_export(module, network, folder, weights)` refuses a `network` the module's network was not built with,
naming the argument, before anything is written: an MLP's config for a UNet module was written with its
class_path silently swapped to UNet, and changed init_args wrote an export that load_export then refused, blaming
the folder (tester round 15b: S2)."""

import pytest
import torch

from diffusion.models import UNet
from diffusion.training.exported import load_export, write_export
from diffusion.training.module import DiffusionModule

INIT_ARGS = {
    "in_channels": 1,
    "channels": 8,
    "channel_mult": [1, 2],
    "num_res_blocks": 1,
    "attention_levels": [1],
}
MODULE = DiffusionModule(UNet(**INIT_ARGS), sample_shape=(1, 8, 8), num_timesteps=10)


def config(class_path="diffusion.models.UNet", **changes):
    return {"class_path": class_path, "init_args": {**INIT_ARGS, **changes}}


CASES = {
    "another-class": ({"class_path": "diffusion.models.MLP", "init_args": {"hidden_dim": 4}}, "class_path"),
    "no-class-path": ({"init_args": INIT_ARGS}, "class_path"),
    "a-class-of-elsewhere": (config("mypackage.UNet"), "class_path"),
    "other-weight-shapes": (config(channels=16), "init_args"),
    "other-dropout": (config(dropout=0.3), "init_args"),  # the same weights' shapes, another network
    "other-heads": (config(num_heads=2), "init_args"),
    "unknown-setting": (config(bogus=3), "init_args"),
    "refused-setting": (config(channels=-3), "init_args"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_network_config_of_another_network_is_refused_naming_it(case, tmp_path):
    network, part = CASES[case]
    with pytest.raises(ValueError) as raised:
        write_export(MODULE, network, tmp_path, "ema")
    problem, _, fix = str(raised.value).partition(" — ")
    assert f"network['{part}']" in problem and 'hyper_parameters"]["network"]' in fix, raised.value
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    "class_path", ["diffusion.UNet", "diffusion.models.UNet", "diffusion.models.unet.UNet"]
)
def test_the_module_s_own_network_config_is_taken_and_loads(class_path, tmp_path):
    # diffusion.UNet: as the recipes (and so the checkpoints) write it
    write_export(MODULE, config(class_path), tmp_path, "raw")
    loaded = load_export(tmp_path)
    for key, value in MODULE.network.state_dict().items():
        torch.testing.assert_close(loaded.network.state_dict()[key], value)
