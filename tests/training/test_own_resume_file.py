"""A user's own `trainer.fit(module, data, ckpt_path=FILE)` of a file that is no intact checkpoint (tester round
18b's M12): one line naming the file and what it is, as load_checkpoint says it, where Lightning's reader ended in
fsspec's `OSError: [Errno 22] Invalid argument` (a truncated file), its own `Checkpoint file not found` (a missing
one), or torch's and Lightning's words (an export folder, an .npz, a bare state_dict). Lightning reads `ckpt_path`
after the module's `setup` (`trainer.ckpt_path` is still unset there): the module installs the project's checkpoint
writer in `setup`, whose `load_checkpoint` checks the file first (`atomic_writes.AtomicCheckpointIO`)."""

import shutil
from pathlib import Path

import pytest
from helpers import fit_with_own_trainer
from helpers.bad_checkpoints import BAD_FILES

from diffusion.errors import UserError


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("own") / "step2.ckpt"
    fit_with_own_trainer(max_steps=2).save_checkpoint(path)
    return path


FILES = BAD_FILES


@pytest.mark.parametrize("given", FILES, ids=[given.__name__ for given in FILES])
def test_a_resume_from_a_file_that_is_no_intact_checkpoint_is_one_line_naming_it(given, checkpoint, tmp_path):
    path, line = given(checkpoint, tmp_path, "ckpt_path")
    with pytest.raises(UserError) as refused:
        fit_with_own_trainer(max_steps=4, ckpt_path=str(path))
    assert str(refused.value) == line


def test_an_intact_checkpoint_and_a_folder_holding_one_resume(checkpoint, tmp_path, capsys):
    assert fit_with_own_trainer(max_steps=4, ckpt_path=str(checkpoint)).global_step == 4
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copyfile(checkpoint, folder / "last.ckpt")
    assert (
        fit_with_own_trainer(max_steps=3, ckpt_path=str(folder)).global_step == 3
    )  # the one checkpoint in it, as --ckpt_path
    assert f"note: ckpt_path {folder} is a folder: using {folder / 'last.ckpt'}" in capsys.readouterr().err
