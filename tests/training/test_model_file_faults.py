"""Round 16's faults of a model's or statistics' file: an export written of weights that are not finite (refused by
`write_export` as the export command refuses them), a network setting of an edited export or checkpoint said as
the file's key (not as a flag sample has not), a folder that refuses a command's lock file, and a statistics file
that refuses to be replaced, said as the file."""

import json

import numpy as np
import pytest
import torch
from helpers.full_disk import immutable

from diffusion.data.folder_lock import writing_alone
from diffusion.errors import CannotReplace, FlaggedFolder, InvalidValue
from diffusion.metrics.reference_stats import FeatureStatistics, check_new_statistics_file, save_statistics
from diffusion.models import UNet
from diffusion.training.exported import CONFIG, check_model_settings, write_export
from diffusion.training.loading import SETTINGS_FIX, load_checkpoint
from diffusion.training.module import DiffusionModule

INIT_ARGS = {"in_channels": 1, "channels": 8, "channel_mult": [1, 2], "num_res_blocks": 1}
NETWORK = {"class_path": "diffusion.models.UNet", "init_args": INIT_ARGS}


def tiny_module() -> DiffusionModule:
    torch.manual_seed(0)
    return DiffusionModule(
        UNet(**INIT_ARGS), sample_shape=(1, 8, 8), num_timesteps=10, beta_schedule="cosine"
    )


def test_write_export_refuses_weights_that_are_not_finite(tmp_path):
    module = tiny_module()
    with torch.no_grad():
        module.network.time_embed[0].weight[0, 0] = float("nan")
    with pytest.raises(InvalidValue) as refused:
        write_export(module, NETWORK, tmp_path, "raw")
    assert str(refused.value).startswith(
        "module holds weights that are not finite (NaN or infinity), first time_embed.0.weight — "
    )
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("channels", "eight", "network.init_args.channels='eight' is a str, not a whole number"),
        ("channel_mult", [1, 0], "network.init_args.channel_mult=[1, 0] must be a non-empty list of positive ints"),
        ("num_res_blocks", -1, "network.init_args.num_res_blocks=-1 must be >= 0"),
    ],
    ids=["channels", "channel_mult", "num_res_blocks"],
)  # fmt: skip
def test_a_network_setting_of_an_edited_export_is_said_as_the_files_key(tmp_path, key, value, said):
    write_export(tiny_module(), NETWORK, tmp_path, "ema")
    config = json.loads((tmp_path / CONFIG).read_text())
    config["hyper_parameters"]["network"]["init_args"][key] = value
    (tmp_path / CONFIG).write_text(json.dumps(config))
    with pytest.raises(InvalidValue) as refused:
        load_checkpoint(tmp_path)
    assert str(refused.value).startswith(f"{tmp_path / CONFIG}: {said} — correct it in config.json's")
    assert "--" not in str(refused.value).split(" — ")[0]  # no flag


def test_a_network_setting_of_a_checkpoint_is_said_as_its_key():
    hparams = {"network": {"class_path": "diffusion.UNet", "init_args": {**INIT_ARGS, "num_res_blocks": -1}}}
    with pytest.raises(InvalidValue) as refused:
        check_model_settings(hparams, "hp.ckpt", SETTINGS_FIX)
    assert str(refused.value) == f"hp.ckpt: network.init_args.num_res_blocks=-1 must be >= 0 — {SETTINGS_FIX}"


@pytest.mark.parametrize(
    ("normalization", "said"),
    [
        ({"scale": [2.0]}, "has no 'shift'"),
        ({}, "has no 'shift' and no 'scale'"),
        ([1.0], "is a list, not a mapping"),
    ],
)
def test_a_normalization_without_its_shift_or_scale_names_what_it_lacks(normalization, said):
    # Round 24a's R2: {"scale": 2.0} was "a dict, not a mapping of 'shift' and 'scale'"
    hparams = {"network": NETWORK, "normalization": normalization}
    with pytest.raises(InvalidValue) as refused:
        check_model_settings(hparams, "ex/config.json", SETTINGS_FIX)
    assert str(refused.value).startswith(f"ex/config.json: normalization={normalization!r} {said}")


def test_a_folder_that_refuses_the_lock_file_is_said_in_one_line(tmp_path):
    folder = tmp_path / "stI"
    folder.mkdir()
    with (
        immutable(folder),
        pytest.raises(FlaggedFolder) as refused,
        writing_alone(str(folder / "st.npz"), "evaluate", folder / ".st.npz.lock", "save_stats"),
    ):
        pass
    assert str(refused.value).startswith(
        f"cannot write the lock file .st.npz.lock of --save_stats {folder / 'st.npz'} into {folder} (it is "
        f"immutable) — check its attributes (lsattr -d {folder}"
    )


def test_a_statistics_file_that_refuses_to_be_replaced_is_said_as_the_file(tmp_path):
    path = tmp_path / "st.npz"
    stats = FeatureStatistics(mu=np.zeros(2), sigma=np.eye(2))
    save_statistics(path, stats)
    with immutable(path):
        with pytest.raises(CannotReplace, match=r"^cannot replace st\.npz in .* \(it is immutable\)"):
            check_new_statistics_file(path, overwrite=True)
        with pytest.raises(CannotReplace, match="itself refuses to be replaced — check its attributes"):
            save_statistics(path, stats)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left
