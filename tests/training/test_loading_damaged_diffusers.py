"""A diffusers folder whose weights file is there but damaged (its bytes cut short or overwritten) is said as a
damaged weights file, with the fix that mends one: not as a folder copied without its config.json."""

import re

import pytest
import torch

from diffusion.training import from_diffusers
from diffusion.training.loading import load_checkpoint

UNet2DModel = pytest.importorskip("diffusers").UNet2DModel


def save_unet(folder):
    """A tiny UNet2DModel of Ho et al.'s layout (which loads), saved by diffusers into `folder`."""
    torch.manual_seed(0)
    UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, block_out_channels=(32, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
        flip_sin_to_cos=False, freq_shift=1, downsample_padding=0, norm_eps=1e-6,
    ).save_pretrained(folder)  # fmt: skip


def test_damaged_weights_of_a_diffusers_folder_are_said_damaged_with_the_fix(tmp_path):
    # The fix said "(save_pretrained writes config.json beside the weights)", which the config.json there belies.
    save_unet(tmp_path / "model")
    weights = tmp_path / "model" / "diffusion_pytorch_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[20:40] = b"\xff" * 20  # inside the header: no longer UTF-8 JSON
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError) as refused:
        load_checkpoint(tmp_path / "model")
    assert re.match(
        rf"^{re.escape(str(tmp_path / 'model'))}: its weights diffusion_pytorch_model.safetensors cannot be read "
        r"\(.*\): the file is damaged or cut short \(a bad copy or a failing disk\) — copy the model's folder "
        r"again, or export it again from its checkpoint \(python -m diffusion.export, the diffusers format\)$",
        str(refused.value),
    ), str(refused.value)
    assert "config.json" not in str(refused.value)


def test_weights_the_system_refuses_to_read_are_not_said_damaged(tmp_path, monkeypatch):
    save_unet(tmp_path / "model")

    def refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(from_diffusers, "load_file", refused)
    with pytest.raises(
        OSError, match=r"cannot be read \(Permission denied\) — make the file readable"
    ) as raised:
        load_checkpoint(tmp_path / "model")
    assert "damaged" not in str(raised.value)
