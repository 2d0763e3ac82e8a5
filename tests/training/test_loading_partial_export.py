"""An export folder that lost its config.json (a partial copy) is said as that, by `load_checkpoint` (of `path`),
sample's and export's --ckpt: it was "a folder, and it holds no checkpoint (*.ckpt) — pass the path of a checkpoint
as checkpoint", as if it were empty, naming an argument load_checkpoint does not have (tester round 10b, T6)."""

import re
import shutil
from pathlib import Path

import pytest
from helpers.user_errors import refused_line

from diffusion.cli import export, sample
from diffusion.errors import InvalidValue, MissingFile
from diffusion.training.loading import load_checkpoint

SAID = (
    "is a folder holding an export's model.safetensors without its config.json (the model's settings) — copy the "
    "export's folder again whole, or export the checkpoint again (python -m diffusion.export)"
)


@pytest.fixture(scope="module")
def partial(toy2d_checkpoint, tmp_path_factory) -> Path:
    """An export of the toy 2-D run whose config.json is gone."""
    out = tmp_path_factory.mktemp("partial") / "export"
    export.main(["--ckpt", str(toy2d_checkpoint), "--format", "safetensors", "--out", str(out)])
    (out / "config.json").unlink()
    return out


def test_load_checkpoint_says_the_export_lost_its_config_of_path(partial):
    with pytest.raises(MissingFile) as raised:
        load_checkpoint(partial)
    assert str(raised.value) == f"path {partial} {SAID}"


def test_sample_says_the_export_lost_its_config(partial, tmp_path, capsys):
    argv = ["--ckpt", str(partial), "--num_samples", "4", "--steps", "2", "--out", str(tmp_path / "s")]
    assert refused_line(capsys, sample.main, argv) == f"error: --ckpt {partial} {SAID}"
    assert not (tmp_path / "s").exists()


def test_export_says_it_is_an_export_not_a_checkpoint(partial, tmp_path, capsys):
    argv = ["--ckpt", str(partial), "--format", "safetensors", "--out", str(tmp_path / "x")]
    line = refused_line(capsys, export.main, argv)
    assert line.startswith(
        f"error: --ckpt {partial} is an export's model.safetensors without its config.json (python -m "
        "diffusion.export), which holds one set of weights and no training state — export converts training "
        "checkpoints: pass the checkpoint it was exported from"
    ), line
    assert "take it as it is" not in line  # nothing takes it as it is
    assert not (tmp_path / "x").exists()


def test_a_folder_without_a_checkpoint_names_path_in_the_api(tmp_path):
    with pytest.raises(
        InvalidValue, match=rf"^path {re.escape(str(tmp_path))} is a folder, and it holds no "
    ):
        load_checkpoint(tmp_path)
    with pytest.raises(InvalidValue, match=r" — pass the path of a checkpoint as path; "):
        load_checkpoint(tmp_path)


def test_a_folder_with_the_weights_and_one_checkpoint_still_stands_for_the_checkpoint(
    partial, toy2d_checkpoint, tmp_path
):
    folder = tmp_path / "both"
    shutil.copytree(partial, folder)
    shutil.copy(toy2d_checkpoint, folder / "last.ckpt")
    assert load_checkpoint(folder) is not None
