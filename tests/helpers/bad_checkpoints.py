"""Files that are no intact checkpoint, each with the line that refuses it where `flag` names it (`ckpt_path` of a
user's own `trainer.fit`, `checkpoint_path` of `DiffusionModule.load_from_checkpoint`): one maker per kind, each
`(an intact checkpoint, a folder to write into, flag) -> (the file, the line)`."""

import shutil
from pathlib import Path

import numpy as np
import torch

from diffusion.training.exported import write_export
from helpers import tiny_vector_model
from helpers.damage import flip_byte_inside_largest_entry

INTACT = "pass an intact .ckpt, e.g. runs/<name>/version_N/checkpoints/last.ckpt"
MLP_SETTINGS = {"in_channels": 2, "hidden_dim": 8, "num_blocks": 1, "time_embed_dim": 8}


def truncated(checkpoint: Path, folder: Path, flag: str) -> tuple[Path, str]:
    path = folder / "cut.ckpt"
    path.write_bytes(checkpoint.read_bytes()[:20000])  # a copy that died, a full disk
    return path, f"{flag} {path} is truncated or not a PyTorch checkpoint (no intact zip archive) — {INTACT}"


def damaged(checkpoint: Path, folder: Path, flag: str) -> tuple[Path, str]:
    path = folder / "flipped.ckpt"
    shutil.copyfile(checkpoint, path)
    entry = flip_byte_inside_largest_entry(path)  # a network weight: Lightning loaded it changed
    return path, (
        f"{flag} {path} is damaged: its bytes do not match their checksum (a bad copy or a failing disk) "
        f"(in {entry}) — pass an intact checkpoint: an earlier one of the run, or a backup"
    )


def missing(checkpoint: Path, folder: Path, flag: str) -> tuple[Path, str]:
    path = folder / "nope.ckpt"
    return path, f"{flag}: no checkpoint at {path} — {INTACT}"


def export_folder(checkpoint: Path, folder: Path, flag: str) -> tuple[Path, str]:
    path = folder / "export"
    path.mkdir()
    write_export(
        tiny_vector_model(), {"class_path": "diffusion.models.MLP", "init_args": MLP_SETTINGS}, path, "raw"
    )
    return path, (
        f"{flag} {path} is an export (python -m diffusion.export), which holds one set of weights and no "
        "training state — pass a training checkpoint (runs/<name>/version_N/checkpoints/*.ckpt); python -m "
        "diffusion.sample and load_checkpoint take it as it is"
    )


def samples_file(checkpoint: Path, folder: Path, flag: str) -> tuple[Path, str]:
    path = folder / "samples.npz"
    np.savez(path, np.zeros((2, 2), np.float32))
    return path, (
        f"{flag} {path} is a NumPy archive (np.savez, such as sample's samples.npz), not a PyTorch "
        f"checkpoint — {INTACT}"
    )


def bare_state_dict(checkpoint: Path, folder: Path, flag: str) -> tuple[Path, str]:
    path = folder / "weights.ckpt"
    torch.save(tiny_vector_model().network.state_dict(), path)
    return path, (
        f"{flag} {path} holds no model weights (state_dict): it is not a checkpoint of a Lightning run — "
        "pass a checkpoint a Trainer saved, e.g. runs/<name>/version_N/checkpoints/last.ckpt"
    )


def weights_saved_by_hand(checkpoint: Path, folder: Path, flag: str) -> tuple[Path, str]:
    path = folder / "by_hand.ckpt"
    torch.save({"state_dict": torch.load(checkpoint, weights_only=True)["state_dict"]}, path)
    return path, (
        f"{flag} {path} holds model weights but no pytorch-lightning_version: a Trainer did not save it — pass a "
        "checkpoint a Trainer saved (trainer.save_checkpoint(path), runs/<name>/version_N/checkpoints/*.ckpt), or "
        "load these weights into a module yourself: module.load_state_dict(checkpoint['state_dict'])"
    )


BAD_FILES = [truncated, damaged, missing, export_folder, samples_file, bare_state_dict, weights_saved_by_hand]
