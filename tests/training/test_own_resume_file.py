"""A user's own `trainer.fit(module, data, ckpt_path=FILE)` of a file that is no intact checkpoint (tester round
18b's M12): one line naming the file and what it is, as load_checkpoint says it, where Lightning's reader ended in
fsspec's `OSError: [Errno 22] Invalid argument` (a truncated file), its own `Checkpoint file not found` (a missing
one), or torch's and Lightning's words (an export folder, an .npz, a bare state_dict). Lightning reads `ckpt_path`
after the module's `setup` (`trainer.ckpt_path` is still unset there): the module installs the project's checkpoint
writer in `setup`, whose `load_checkpoint` checks the file first (`atomic_writes.AtomicCheckpointIO`)."""

import shutil
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from helpers import tiny_vector_model
from helpers.damage import flip_byte_inside_largest_entry
from torch.utils.data import DataLoader, TensorDataset

from diffusion import IndexedDataset
from diffusion.errors import UserError
from diffusion.training.exported import write_export

INTACT = "pass an intact .ckpt, e.g. runs/<name>/version_N/checkpoints/last.ckpt"
MLP_SETTINGS = {"in_channels": 2, "hidden_dim": 8, "num_blocks": 1, "time_embed_dim": 8}


def _fit(max_steps: int, ckpt_path=None) -> L.Trainer:
    trainer = L.Trainer(
        max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0,
    )  # fmt: skip
    data = DataLoader(IndexedDataset(TensorDataset(torch.randn(16, 2))), batch_size=4)
    trainer.fit(tiny_vector_model(), data, ckpt_path=ckpt_path)
    return trainer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("own") / "step2.ckpt"
    _fit(max_steps=2).save_checkpoint(path)
    return path


def truncated(checkpoint: Path, folder: Path) -> tuple[Path, str]:
    path = folder / "cut.ckpt"
    path.write_bytes(checkpoint.read_bytes()[:20000])  # a copy that died, a full disk
    return (
        path,
        f"ckpt_path {path} is truncated or not a PyTorch checkpoint (no intact zip archive) — {INTACT}",
    )


def damaged(checkpoint: Path, folder: Path) -> tuple[Path, str]:
    path = folder / "flipped.ckpt"
    shutil.copyfile(checkpoint, path)
    entry = flip_byte_inside_largest_entry(path)
    return path, (
        f"ckpt_path {path} is damaged: its bytes do not match their checksum (a bad copy or a failing disk) (in "
        f"{entry}) — pass an intact checkpoint: an earlier one of the run, or a backup"
    )


def missing(checkpoint: Path, folder: Path) -> tuple[Path, str]:
    path = folder / "nope.ckpt"
    return path, f"ckpt_path: no checkpoint at {path} — {INTACT}"


def export_folder(checkpoint: Path, folder: Path) -> tuple[Path, str]:
    path = folder / "export"
    path.mkdir()
    write_export(
        tiny_vector_model(), {"class_path": "diffusion.models.MLP", "init_args": MLP_SETTINGS}, path, "raw"
    )
    return path, (
        f"ckpt_path {path} is an export (python -m diffusion.export), which holds one set of weights and no training "
        "state — pass a training checkpoint (runs/<name>/version_N/checkpoints/*.ckpt); python -m diffusion.sample "
        "and load_checkpoint take it as it is"
    )


def samples_file(checkpoint: Path, folder: Path) -> tuple[Path, str]:
    path = folder / "samples.npz"
    np.savez(path, np.zeros((2, 2), np.float32))
    return path, (
        f"ckpt_path {path} is a NumPy archive (np.savez, such as sample's samples.npz), not a PyTorch checkpoint — "
        + INTACT
    )


def bare_state_dict(checkpoint: Path, folder: Path) -> tuple[Path, str]:
    path = folder / "weights.ckpt"
    torch.save(tiny_vector_model().network.state_dict(), path)
    return path, (
        f"ckpt_path {path} holds no model weights (state_dict): it is not a checkpoint of a Lightning run — pass a "
        "checkpoint a Trainer saved, e.g. runs/<name>/version_N/checkpoints/last.ckpt"
    )


FILES = [truncated, damaged, missing, export_folder, samples_file, bare_state_dict]


@pytest.mark.parametrize("given", FILES, ids=[given.__name__ for given in FILES])
def test_a_resume_from_a_file_that_is_no_intact_checkpoint_is_one_line_naming_it(given, checkpoint, tmp_path):
    path, line = given(checkpoint, tmp_path)
    with pytest.raises(UserError) as refused:
        _fit(max_steps=4, ckpt_path=str(path))
    assert str(refused.value) == line


def test_an_intact_checkpoint_and_a_folder_holding_one_resume(checkpoint, tmp_path, capsys):
    assert _fit(max_steps=4, ckpt_path=str(checkpoint)).global_step == 4
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copyfile(checkpoint, folder / "last.ckpt")
    assert (
        _fit(max_steps=3, ckpt_path=str(folder)).global_step == 3
    )  # the one checkpoint in it, as --ckpt_path
    assert f"note: ckpt_path {folder} is a folder: using {folder / 'last.ckpt'}" in capsys.readouterr().err
