"""An export folder whose model.safetensors is a torch checkpoint (a .ckpt copied there) is said as that, not as a
damaged copy (its checksum) or as safetensors' "header too large" (tester 18b, M9): by `load_checkpoint` and by
``init_from`` (`export_network_weights`), with the checksum in config.json and without it."""

import json

import pytest
import torch

from diffusion.errors import InvalidValue
from diffusion.models import UNet
from diffusion.training.export_files import export_network_weights
from diffusion.training.exported import CONFIG, WEIGHTS, write_export
from diffusion.training.loading import load_checkpoint
from diffusion.training.module import DiffusionModule

INIT_ARGS = {"in_channels": 1, "channels": 8, "channel_mult": [1, 2], "num_res_blocks": 1}
NETWORK = {"class_path": "diffusion.models.UNet", "init_args": INIT_ARGS}


@pytest.mark.parametrize("checksum", [True, False], ids=["with-checksum", "without-checksum"])
def test_a_torch_checkpoint_as_an_exports_weights_is_said_as_one_with_the_fix(tmp_path, checksum):
    module = DiffusionModule(UNet(**INIT_ARGS), sample_shape=(1, 8, 8), num_timesteps=10)
    folder = tmp_path / "export"
    folder.mkdir()
    write_export(module, NETWORK, folder, "raw")
    torch.save({"state_dict": module.state_dict()}, folder / WEIGHTS)  # a .ckpt copied over the weights
    if not checksum:
        config = json.loads((folder / CONFIG).read_text())
        del config["weights_sha256"]
        (folder / CONFIG).write_text(json.dumps(config))
    expected = (
        f"{folder / WEIGHTS} is a PyTorch checkpoint (torch.save), not the safetensors weights an export holds — "
        f"pass the .ckpt itself to load_checkpoint (under a .ckpt name), or export it again (python -m "
        f"diffusion.export) into {folder}"
    )
    for read in (load_checkpoint, export_network_weights):
        for path in (folder, folder / CONFIG, folder / WEIGHTS):
            with pytest.raises(InvalidValue) as refused:
                read(path)
            assert str(refused.value) == expected
