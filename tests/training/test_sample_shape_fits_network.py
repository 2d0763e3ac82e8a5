"""DiffusionModule holds its `sample_shape` against its network when built (the network's `check_input_shape`): a
shape the network cannot take was accepted, then refused at the first sample or step by a line that blamed "the
data" and `image_size`, neither of which a Python caller gave (tester round 10b, T8). A command sets sample_shape
from the data module, so it still says the data's wording (tests/cli/test_train_errors.py: image_size_vs_unet,
mlp_for_images)."""

import pickle

import pytest

from diffusion import DiffusionModule
from diffusion.models import MLP, UNet
from diffusion.models.checks import SampleShapeMisfit

TINY = {"channels": 8, "channel_mult": (1, 2), "num_res_blocks": 1, "attention_levels": ()}
UNET, MLP2 = UNet(in_channels=1, **TINY), MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8)

CASES = {
    "channels": (UNET, (3, 8, 8), r"^UNet is for images of 1 channel, and sample_shape=\(3, 8, 8\) has 3 — pass "
                 r"sample_shape=\(1, H, W\) for this network, or build it with in_channels=3$"),
    "size": (UNET, (1, 7, 7), r"^sample_shape=\(1, 7, 7\) has an image size 7x7 not divisible by 2 = 2\*\*\(levels - "
             r"1\) for the 2 levels of channel_mult — pass a sample_shape whose height and width are divisible by 2"),
    "mlp-for-images": (MLP2, (1, 8, 8), r"^MLP is for vectors of shape \(2,\), and sample_shape=\(1, 8, 8\) is of "
                       r"images — pass sample_shape=\(2,\) for this network, or train samples of shape \(1, 8, 8\) "
                       r"with a UNet \(network diffusion.models.UNet\)$"),
    "unet-for-vectors": (UNET, (2,), r"^UNet is for images of shape \(1, H, W\), and sample_shape=\(2,\) is of vectors"),
    "features": (MLP2, (3,), r"^MLP is for vectors of 2 features, and sample_shape=\(3,\) has 3 — "),
    "channels-last": (UNET, (8, 8, 1), r"^UNet is for images of 1 channel, \(C, H, W\), and sample_shape=\(8, 8, 1\) "
                      r"looks channels-last, \(H, W, C\) — pass sample_shape=\(1, 8, 8\), the images' channels first$"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_sample_shape_the_network_cannot_take_is_refused_when_built_naming_it(case):
    network, shape, line = CASES[case]
    with pytest.raises(ValueError, match=line):
        DiffusionModule(network, sample_shape=shape)


def test_the_default_shape_of_images_is_refused_for_an_mlp():
    with pytest.raises(ValueError, match=r"and sample_shape=\(1, 8, 8\) is of images"):
        DiffusionModule(MLP2)


def test_a_command_reads_the_data_wording_and_a_forward_is_said_as_before():
    # A command reads `problem` and `fix` (train.py links sample_shape from the data); pickled, it stays itself.
    with pytest.raises(SampleShapeMisfit) as refused:
        DiffusionModule(UNET, sample_shape=(1, 7, 7))
    assert refused.value.problem.startswith(
        "image size 7x7 ({LightningDataModule:--image_size}) is not divisible"
    )
    assert str(pickle.loads(pickle.dumps(refused.value))) == str(refused.value)
    # The network's own check, outside DiffusionModule, says it of the data as before.
    with pytest.raises(ValueError, match=r"^UNet is for images of 1 channel, and the data's samples have 3"):
        UNET.check_input_shape((3, 8, 8))


def test_channels_last_images_of_the_data_are_said_so_not_as_channels_to_build_for():
    # Round 25b's S3: (8, 8, 1) images were told "build it with in_channels 8"
    with pytest.raises(ValueError) as refused:
        UNET.check_input_shape((8, 8, 1))
    assert str(refused.value) == (
        "UNet is for images of 1 channel, (C, H, W), and the data's samples of shape (8, 8, 1) look channels-last, "
        "(H, W, C) — put the channels first: x.permute(2, 0, 1) for an image (x.permute(0, 3, 1, 2) for a batch of "
        "them)"
    )
    wide = UNet(in_channels=8, **TINY)  # 3 channels of 8x8 for an 8-channel network: no layout of theirs
    with pytest.raises(ValueError, match=r"^UNet is for images of 8 channels, and the data's samples have 3"):
        wide.check_input_shape((3, 8, 8))


def test_shapes_that_fit_are_taken():
    assert DiffusionModule(UNET, sample_shape=(1, 16, 8)).sample_shape == (1, 16, 8)
    assert DiffusionModule(MLP2, sample_shape=(2,)).sample_shape == (2,)
