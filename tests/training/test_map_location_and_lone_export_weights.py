"""Round 24b's loading findings. S6: `DiffusionModule.load_from_checkpoint(path, map_location='cpu:1' or 'gpu')`
ended in torch's `RuntimeError: don't know how to restore data location of torch.storage.UntypedStorage (tagged
with cpu:1)`, where load_checkpoint said the value; it says load_checkpoint's line now, before any file is read. S7:
a safetensors file whose header's length starts with the byte 0x80 (an export's model.safetensors copied without
its config.json) was said to hold pickled Python objects that could run code; it is said as what it is, by every
loader of a checkpoint path alike (load_checkpoint, load_from_checkpoint, init_from, sample's and export's --ckpt)."""

import shutil
from pathlib import Path

import pytest
from helpers.bad_checkpoints import MLP_SETTINGS  # a network the refusals come before
from helpers.user_errors import refused_line
from safetensors.torch import load_file, save_file

from diffusion import MLP, DiffusionModule
from diffusion.cli import export, sample
from diffusion.errors import InvalidValue, MissingFile
from diffusion.training.checkpoint_files import read_network_weights
from diffusion.training.loading import load_checkpoint

AGAIN = "copy the export's folder again whole, or export the checkpoint again (python -m diffusion.export)"


# ---- S6: map_location -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("location", ["cpu:1", "gpu"])
def test_load_from_checkpoint_says_a_map_location_of_no_device_as_load_checkpoint_does(
    location, toy2d_checkpoint
):
    with pytest.raises(InvalidValue) as said:
        load_checkpoint(toy2d_checkpoint, map_location=location)
    with pytest.raises(InvalidValue) as without_network:
        DiffusionModule.load_from_checkpoint(toy2d_checkpoint, map_location=location)
    with pytest.raises(InvalidValue) as with_network:
        DiffusionModule.load_from_checkpoint(
            toy2d_checkpoint, map_location=location, network=MLP(**MLP_SETTINGS)
        )
    assert str(without_network.value) == str(with_network.value) == str(said.value)
    assert str(said.value).startswith(f"map_location={location!r}")
    assert str(said.value).endswith(" — pass map_location='cpu' (or a device this machine has), and move the model later with .to(device)")  # fmt: skip


def test_the_cpu_with_an_index_is_refused_by_name_before_the_file_is_read(tmp_path):
    with pytest.raises(InvalidValue) as said:
        DiffusionModule.load_from_checkpoint(tmp_path / "no such.ckpt", map_location="cpu:1")
    assert str(said.value).startswith(
        "map_location='cpu:1': the CPU takes no index (torch loads a checkpoint onto 'cpu', not onto cpu:1) — pass "
        "map_location='cpu'"
    )


# ---- S7: a safetensors file led by a pickle's first byte ---------------------------------------------------------
def led_by_a_pickle_byte(weights: dict, path: Path) -> Path:
    """`weights` saved as safetensors at `path`, its header's length padded to 128 more than a multiple of 256: the
    file's first byte is 0x80, a pickle's (about one export in 32 is so by chance)."""
    for pad in range(0, 512, 8):
        save_file(weights, path, metadata={"format": "pt", "pad": "x" * pad})
        if path.read_bytes()[:1] == b"\x80":
            return path
    raise AssertionError("no padding gave a header length of 128 + 256k")


@pytest.fixture(scope="module")
def alone(toy2d_checkpoint, tmp_path_factory) -> Path:
    """An export's model.safetensors copied alone into a folder (no config.json), its first byte 0x80."""
    out = tmp_path_factory.mktemp("export") / "export"
    export.main(["--ckpt", str(toy2d_checkpoint), "--format", "safetensors", "--out", str(out)])
    folder = tmp_path_factory.mktemp("dfs")
    return led_by_a_pickle_byte(load_file(out / "model.safetensors"), folder / "model.safetensors")


def test_load_checkpoint_says_an_exports_weights_without_config_as_that(alone):
    with pytest.raises(MissingFile) as said:
        load_checkpoint(alone)
    assert str(said.value) == (
        f"path {alone} is an export's model.safetensors without its config.json beside it (the model's settings) — "
        f"{AGAIN}"
    )


def test_load_from_checkpoint_and_init_from_say_it_alike(alone):
    line = (
        f"is an export's model.safetensors without its config.json beside it (the model's settings) — {AGAIN}"
    )
    with pytest.raises(MissingFile) as said:
        DiffusionModule.load_from_checkpoint(alone, network=MLP(**MLP_SETTINGS))
    assert str(said.value) == f"checkpoint_path {alone} {line}"
    with pytest.raises(MissingFile) as said:
        read_network_weights(alone)
    assert str(said.value) == f"init_from {alone} {line}"
    with pytest.raises(MissingFile) as said:
        DiffusionModule(MLP(**MLP_SETTINGS), sample_shape=(2,), init_from=str(alone))
    assert "pickled" not in str(said.value) and f"{alone} {line}" in str(said.value)


def test_its_folder_is_said_as_one_by_load_from_checkpoint_and_init_from(alone):
    line = f"{alone.parent} is a folder holding an export's model.safetensors without its config.json (the model's settings) — {AGAIN}"  # fmt: skip
    with pytest.raises(MissingFile) as said:
        DiffusionModule.load_from_checkpoint(alone.parent, network=MLP(**MLP_SETTINGS))
    assert str(said.value) == f"checkpoint_path {line}"
    with pytest.raises(MissingFile) as said:
        read_network_weights(alone.parent)
    assert str(said.value) == f"init_from {line}"


def test_sample_and_export_say_it_in_their_flag(alone, tmp_path, capsys):
    argv = ["--ckpt", str(alone), "--num_samples", "4", "--steps", "2", "--out", str(tmp_path / "s")]
    assert refused_line(capsys, sample.main, argv) == (
        f"error: --ckpt {alone} is an export's model.safetensors without its config.json beside it (the model's "
        f"settings) — {AGAIN}"
    )
    argv = ["--ckpt", str(alone), "--format", "safetensors", "--out", str(tmp_path / "x")]
    assert refused_line(capsys, export.main, argv).startswith(
        f"error: --ckpt {alone} is an export's model.safetensors without its config.json (python -m "
        "diffusion.export), which holds one set of weights and no training state — export converts training "
        "checkpoints"
    )


@pytest.mark.parametrize("name", ["weights.safetensors", "weights.ckpt"])
def test_another_safetensors_file_led_by_a_pickle_byte_is_said_to_be_safetensors(name, alone, tmp_path):
    path = tmp_path / name
    shutil.copy(alone, path)
    for load in (load_checkpoint, DiffusionModule.load_from_checkpoint):
        with pytest.raises(ValueError) as said:
            load(path)
        assert (
            "is a safetensors file: weights alone, without the model's settings, not a PyTorch checkpoint — "
            in (str(said.value))
        )
        assert "pickled" not in str(said.value)
