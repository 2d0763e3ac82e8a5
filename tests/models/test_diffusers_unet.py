"""Our UNet as diffusers' UNet2DModel: with the mapped arguments and weights, both compute the same function, and
what does not map is refused in one line that says what to use instead."""

import pytest
import torch
from diffusers import UNet2DModel

from diffusion.errors import UserError
from diffusion.models import MLP, UNet
from diffusion.models.diffusers_unet import (
    check_maps_to_diffusers,
    diffusers_unet_config,
    diffusers_unet_weights,
)

CONFIGS = {
    "tiny": ({"in_channels": 1, "channels": 8, "channel_mult": (1, 2), "num_res_blocks": 1}, (16, 16)),
    "three_levels_attention_first_and_last": (
        {"in_channels": 3, "channels": 16, "channel_mult": (1, 2, 2), "num_res_blocks": 2,
         "attention_levels": (0, 2), "dropout": 0.1},
        (16, 16),
    ),
    "four_heads": (
        {"in_channels": 3, "channels": 32, "channel_mult": (1, 1, 1), "num_res_blocks": 1, "num_heads": 4},
        (8, 8),
    ),
    "one_level_no_attention": ({"in_channels": 2, "channels": 8, "channel_mult": (1,), "attention_levels": ()}, (8, 8)),
    "odd_width_not_square": (
        {"in_channels": 1, "channels": 6, "channel_mult": (1, 2), "num_res_blocks": 1, "attention_levels": (0,)},
        (8, 12),
    ),
}  # fmt: skip


def random_unet(**kwargs) -> UNet:
    """A UNet whose every weight is random: the zero-initialised layers would hide half the network."""
    torch.manual_seed(0)
    unet = UNet(**kwargs).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in unet.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=generator))
    return unet


@pytest.mark.parametrize(("kwargs", "size"), CONFIGS.values(), ids=CONFIGS.keys())
def test_the_mapped_unet2dmodel_computes_the_same_outputs(kwargs, size):
    ours = random_unet(**kwargs)
    theirs = UNet2DModel(**diffusers_unet_config(ours, (kwargs["in_channels"], *size))).eval()
    theirs.load_state_dict(diffusers_unet_weights(ours))  # strict: every weight has a place, and only one
    assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in ours.parameters())
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(3, kwargs["in_channels"], *size, generator=generator)
    t = torch.tensor([0, 17, 999])
    with torch.no_grad():
        expected = ours(x, t)
        got = theirs(x, t).sample
    assert expected.abs().max() > 0.1  # the outputs depend on the weights
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_the_sample_size_is_the_images():
    unet = UNet(in_channels=1, channels=8, channel_mult=(1, 2))
    assert diffusers_unet_config(unet, (1, 16, 16))["sample_size"] == 16
    assert diffusers_unet_config(unet, (1, 8, 12))["sample_size"] == [8, 12]


REFUSED = {
    "mlp": (lambda: MLP(in_channels=2, hidden_dim=8, num_blocks=1), r"a MLP network has no diffusers UNet2DModel"),
    "class_conditional": (lambda: UNet(channels=8, num_classes=3), r"class-conditional UNet does not map"),
    "learned_variances": (lambda: UNet(channels=8, out_channels=2), r"outputs 2 channels for 1 input channels"),
    "channel_mult_not_starting_at_1": (lambda: UNet(channels=8, channel_mult=(2, 2)), r"channel_mult\[0\] != 1"),
    "no_res_blocks": (lambda: UNet(channels=8, num_res_blocks=0), r"num_res_blocks=0 does not map"),
    "narrow": (lambda: UNet(channels=2, channel_mult=(1, 2)), r"channels=2 < 4"),
    "heads_of_different_widths": (
        lambda: UNet(channels=8, channel_mult=(1, 2), attention_levels=(0,), num_heads=2),
        r"num_heads=2 at attention widths \[8, 16\]",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("build", "expected"), REFUSED.values(), ids=REFUSED.keys())
def test_what_does_not_map_is_refused_with_what_to_use_instead(build, expected):
    network = build()
    for call in (check_maps_to_diffusers, diffusers_unet_weights):
        with pytest.raises(UserError, match=expected) as error:
            call(network)
        assert "--format safetensors" in str(error.value) and "\n" not in str(error.value)
