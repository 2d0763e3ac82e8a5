"""`DiffusionModule.load_from_checkpoint(path)`, Lightning's classmethod that troubleshooting.md tells Python users to
call, checks a local file first as `load_checkpoint` and a Trainer's `ckpt_path` do (tester round 19b's Q7): a
checkpoint with a byte changed inside a tensor loaded its changed weights without a word, and a truncated file, an
export folder, a missing file, an .npz and weights alone were said in fsspec's, torch's or Lightning's words
(`OSError: [Errno 22] Invalid argument`, `IsADirectoryError`, `RuntimeError [enforce fail ...]`,
`KeyError: 'pytorch-lightning_version'`). One line each now, naming the file (`checkpoint_files.CheckedLoad`)."""

import inspect
import shutil
from pathlib import Path

import fsspec
import lightning as L
import pytest
import torch
from helpers import fit_with_own_trainer, tiny_vector_model
from helpers.bad_checkpoints import BAD_FILES, MLP_SETTINGS, damaged, missing
from torch.utils.data import DataLoader

from diffusion import MLP, DiffusionModule, IndexedDataset
from diffusion.errors import UserError
from diffusion.training import checkpoint_files
from diffusion.training.loading import load_checkpoint


@pytest.fixture(scope="module")
def own_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint of a module built in Python (its network is not in its hyperparameters: load it with
    network=...), saved by a Trainer of the user's own."""
    path = tmp_path_factory.mktemp("own") / "step2.ckpt"
    fit_with_own_trainer(max_steps=2).save_checkpoint(path)
    return path


FILES = BAD_FILES


@pytest.mark.parametrize("given", FILES, ids=[given.__name__ for given in FILES])
def test_a_file_that_is_no_intact_checkpoint_is_one_line_naming_it(given, toy2d_checkpoint, tmp_path):
    path, line = given(toy2d_checkpoint, tmp_path, "checkpoint_path")
    with pytest.raises(UserError) as refused:
        DiffusionModule.load_from_checkpoint(path)
    assert str(refused.value) == line
    # of the built-in kinds: a missing file is a FileNotFoundError, every other a ValueError
    assert isinstance(refused.value, FileNotFoundError if given is missing else ValueError)
    with pytest.raises(
        UserError
    ) as as_str:  # a str as a Path, and with the keywords of a module built in Python
        DiffusionModule.load_from_checkpoint(str(path), map_location="cpu", network=MLP(**MLP_SETTINGS))
    assert str(as_str.value) == line


def test_a_damaged_checkpoint_of_a_module_built_in_python_is_refused_with_network_given(
    own_checkpoint, tmp_path
):
    path, line = damaged(own_checkpoint, tmp_path, "checkpoint_path")
    with pytest.raises(UserError) as refused:
        DiffusionModule.load_from_checkpoint(
            path, network=MLP(**MLP_SETTINGS), strict=True, weights_only=True
        )
    assert str(refused.value) == line


def test_a_sound_checkpoint_loads_the_weights_load_checkpoint_loads(toy2d_checkpoint, tmp_path, capsys):
    expected = load_checkpoint(toy2d_checkpoint).state_dict()  # EMA weights: the checkpoint's "state_dict"
    for given in (toy2d_checkpoint, str(toy2d_checkpoint)):
        loaded = DiffusionModule.load_from_checkpoint(given, map_location="cpu").state_dict()
        assert loaded.keys() == expected.keys()
        assert all(torch.equal(loaded[key], expected[key]) for key in expected)
    folder = tmp_path / "run"  # a folder holding one checkpoint stands for it, as for load_checkpoint
    folder.mkdir()
    shutil.copyfile(toy2d_checkpoint, folder / "last.ckpt")
    loaded = DiffusionModule.load_from_checkpoint(folder).state_dict()
    assert all(torch.equal(loaded[key], expected[key]) for key in expected)
    assert (
        f"note: checkpoint_path {folder} is a folder: using {folder / 'last.ckpt'}" in capsys.readouterr().err
    )


def test_a_sound_checkpoint_of_a_module_built_in_python_loads_with_network_given(own_checkpoint):
    expected = torch.load(own_checkpoint, weights_only=True)["state_dict"]
    module = DiffusionModule.load_from_checkpoint(
        own_checkpoint, map_location="cpu", hparams_file=None, strict=True, weights_only=True,
        network=MLP(**MLP_SETTINGS),
    )  # fmt: skip
    loaded = module.state_dict()
    assert all(torch.equal(loaded[key], expected[key]) for key in expected)
    assert module.hparams["num_timesteps"] == 20  # the checkpoint's settings, network= the one given


def test_a_path_of_another_filesystem_is_lightnings_to_read(own_checkpoint):
    with fsspec.open("memory://own/step2.ckpt", "wb") as file:
        file.write(own_checkpoint.read_bytes())
    try:
        module = DiffusionModule.load_from_checkpoint("memory://own/step2.ckpt", network=MLP(**MLP_SETTINGS))
    finally:
        fsspec.filesystem("memory").rm("memory://own", recursive=True)
    expected = torch.load(own_checkpoint, weights_only=True)["state_dict"]
    assert all(torch.equal(module.state_dict()[key], expected[key]) for key in expected)


def test_load_checkpoint_checks_the_file_once(toy2d_checkpoint, monkeypatch):
    checked = []
    check = checkpoint_files.checked_checkpoint_file

    def counting(*args, **kwargs):
        checked.append(args[0])
        return check(*args, **kwargs)

    monkeypatch.setattr(checkpoint_files, "checked_checkpoint_file", counting)
    load_checkpoint(toy2d_checkpoint)
    assert len(checked) == 1
    DiffusionModule.load_from_checkpoint(toy2d_checkpoint)
    assert len(checked) == 2


def test_lightnings_signature_and_its_refusal_on_an_instance_are_kept(own_checkpoint):
    ours = inspect.signature(DiffusionModule.load_from_checkpoint).parameters
    lightnings = inspect.signature(L.LightningModule.load_from_checkpoint).parameters
    assert list(ours) == list(lightnings)
    assert all(ours[name].default == lightnings[name].default for name in ours)
    module = tiny_vector_model()
    with pytest.raises(TypeError, match="cannot be called on an instance"):
        module.load_from_checkpoint(own_checkpoint, network=MLP(**MLP_SETTINGS))


def test_a_python_modules_checkpoint_loaded_without_its_network_is_one_line(own_checkpoint):
    # Lightning's words were `__init__() missing 1 required positional argument: 'network'`
    with pytest.raises(ValueError) as refused:
        DiffusionModule.load_from_checkpoint(own_checkpoint, map_location="cpu")
    assert str(refused.value) == (
        f"checkpoint_path {own_checkpoint} does not hold its network's settings (a module built in Python keeps "
        "its network out of its hyperparameters) — pass the network it was trained with, built with the same "
        "settings (a UNet(...), an MLP(...) or your own): DiffusionModule.load_from_checkpoint(path, network=...)"
    )


# Tester round 23: S7, S8. A network given that does not fit the checkpoint is one line naming the file, said before
# Lightning builds the module (it was torch's `size mismatch` lines, or class_names said as given by the user).
def fitted_and_saved(module: DiffusionModule, items, path: Path, with_labels: bool = False) -> Path:
    trainer = L.Trainer(
        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(module, DataLoader(IndexedDataset(items, with_labels=with_labels), batch_size=4))
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def conditional_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint of a class-conditional model of 3 classes built in Python, its class_names kept in it."""
    network = MLP(**MLP_SETTINGS, num_classes=3)
    module = DiffusionModule(network, sample_shape=(2,), num_timesteps=20, class_names=["a", "b", "c"])
    items = [(torch.randn(2), i % 3) for i in range(8)]
    return fitted_and_saved(module, items, tmp_path_factory.mktemp("cond") / "c.ckpt", with_labels=True)


def test_a_network_of_other_settings_is_one_line_naming_the_file(own_checkpoint):
    with pytest.raises(RuntimeError) as refused:
        DiffusionModule.load_from_checkpoint(
            own_checkpoint, network=MLP(**{**MLP_SETTINGS, "hidden_dim": 16})
        )
    line = str(refused.value)
    assert line.startswith(f"checkpoint_path {own_checkpoint}: these weights do not fit MLP ("), line
    assert "of another shape" in line and "size mismatch" not in line, line
    assert line.endswith(
        " — pass the network it was trained with: network=MLP(...) with the settings it was trained with"
    ), line
    assert isinstance(refused.value, UserError)


def test_a_conditional_checkpoint_given_an_unconditional_network_says_its_classes(conditional_checkpoint):
    with pytest.raises(ValueError) as refused:
        DiffusionModule.load_from_checkpoint(conditional_checkpoint, network=MLP(**MLP_SETTINGS))
    assert str(refused.value) == (
        f"checkpoint_path {conditional_checkpoint} is of a class-conditional model of 3 classes, and the network "
        "given has no num_classes — pass the network it was trained with: network=MLP(..., num_classes=3), its "
        "other settings those it was trained with"
    )
    with pytest.raises(ValueError, match=r"of 3 classes, and the network given has num_classes=5 — "):
        DiffusionModule.load_from_checkpoint(
            conditional_checkpoint, network=MLP(**MLP_SETTINGS, num_classes=5)
        )
    module = DiffusionModule.load_from_checkpoint(
        conditional_checkpoint, network=MLP(**MLP_SETTINGS, num_classes=3)
    )
    assert module.hparams["class_names"] == ["a", "b", "c"]


def test_an_unconditional_checkpoint_given_a_conditional_network_says_so(own_checkpoint):
    with pytest.raises(ValueError) as refused:
        DiffusionModule.load_from_checkpoint(own_checkpoint, network=MLP(**MLP_SETTINGS, num_classes=3))
    assert str(refused.value) == (
        f"checkpoint_path {own_checkpoint} is of an unconditional model, and the network given has num_classes=3 "
        "— pass the network it was trained with: network=MLP(...) without num_classes, its other settings those it "
        "was trained with"
    )
