"""Checkpoints never run code when loaded: every loader refuses a file that carries foreign pickled objects."""

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY_UNET
from helpers.user_errors import error_line

from diffusion.cli import sample
from diffusion.cli.train import main as train
from diffusion.errors import UserError
from diffusion.training.checkpoint_files import read_checkpoint, read_network_weights
from diffusion.training.loading import load_checkpoint


class Payload:
    """Unpickling this calls open(marker, "w"): a file appears if a loader ever runs the checkpoint's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.fixture
def malicious_checkpoint(digits_checkpoint, tmp_path) -> tuple[Path, Path]:
    """A copy of a real checkpoint with one extra pickled object, and the file its code would create."""
    checkpoint = torch.load(digits_checkpoint, map_location="cpu", weights_only=True)
    marker = tmp_path / "code_ran"
    checkpoint["extra"] = Payload(marker)
    path = tmp_path / "malicious.ckpt"
    torch.save(checkpoint, path)
    return path, marker


def test_the_payload_would_run_under_a_plain_load(malicious_checkpoint):
    # Precondition: the fixture really carries code (a weights_only=False load runs it).
    path, marker = malicious_checkpoint
    torch.load(path, map_location="cpu", weights_only=False)
    assert marker.exists()


def test_library_loaders_refuse_it_without_running_it(malicious_checkpoint):
    path, marker = malicious_checkpoint
    with pytest.raises(UserError, match="could run code"):
        read_checkpoint(path)
    with pytest.raises(UserError, match="could run code"):
        load_checkpoint(path)
    with pytest.raises(UserError, match="could run code"):
        read_network_weights(path)  # --model.init_from's reader
    assert not marker.exists()


@pytest.mark.parametrize("command", ["sample", "train --ckpt_path", "train --model.init_from"])
def test_commands_refuse_it_in_one_line_without_running_it(command, malicious_checkpoint, tmp_path, capsys):
    path, marker = malicious_checkpoint
    if command == "sample":
        run = lambda: sample.main(["--ckpt", str(path), "--out", str(tmp_path / "out"), "--steps", "2"])  # noqa: E731
    else:
        flag = command.split()[1]
        args = [*TINY_UNET, flag, str(path), "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]
        run = lambda: train(args)  # noqa: E731
    with pytest.raises(SystemExit) as exit_info:
        run()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.match(r"error: .*could run code", err[0]), err
    assert not marker.exists()


NOT_CHECKPOINTS = {  # a file of another kind given as a checkpoint: named as what it is, never "truncated"
    "pickle_dump": (
        lambda path, marker: path.write_bytes(pickle.dumps({"state_dict": Payload(marker)})),
        r"holds pickled Python objects \(pickle.dump, or torch.save's legacy format\), not a checkpoint",
    ),
    "torch_save_legacy": (
        lambda path, marker: torch.save({"state_dict": {}}, path, _use_new_zipfile_serialization=False),
        r"holds pickled Python objects .* it was not read, as unpickling it could run code",
    ),
    "numpy_array": (
        lambda path, marker: np.save(path, np.zeros(3)) or path.with_suffix(".ckpt.npy").rename(path),
        r"is a NumPy array \(np.save\), not a PyTorch checkpoint",
    ),
}


@pytest.mark.parametrize("case", NOT_CHECKPOINTS)
def test_a_file_of_another_kind_is_named_as_such_without_being_unpickled(case, tmp_path, capsys):
    write, pattern = NOT_CHECKPOINTS[case]
    path, marker = tmp_path / "model.ckpt", tmp_path / "code_ran"
    write(path, marker)
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--ckpt", str(path), "--out", str(tmp_path / "out")])
    line = error_line(capsys.readouterr().err)
    assert exit_info.value.code == 2 and re.search(f"error: --ckpt {re.escape(str(path))} {pattern}", line), (
        line
    )
    assert "truncated" not in line and not marker.exists()
