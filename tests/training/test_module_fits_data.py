"""A DiffusionModule fit by a user's own `Trainer` with a data module is held against that data module at setup:
train.py builds the module from the data, a plain `Trainer.fit` takes whatever the module was built with (tester
round 6b, L3). Each refusal comes before the first step; what a data module does not say is not compared."""

import lightning as L
import numpy as np
import pytest
import torch
from helpers import DigitsSayingNothing
from torch.utils.data import DataLoader, TensorDataset

from diffusion import DiffusionModule, ImageDataModule, IndexedDataset, VectorDataModule
from diffusion.models import MLP, UNet


def unet(num_classes=None) -> UNet:
    return UNet(
        channels=8, channel_mult=(1, 2), num_res_blocks=1, attention_levels=(), num_classes=num_classes
    )


def fit(module, data, max_steps: int = 1) -> L.Trainer:
    trainer = L.Trainer(
        max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, accelerator="cpu", devices=1,
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    return trainer


CASES = {
    "another sample_shape": (
        lambda: DiffusionModule(unet(), sample_shape=(1, 16, 16)),
        lambda: ImageDataModule(batch_size=8),
        "sample_shape (1, 16, 16) where the data's is (1, 8, 8)",
    ),
    "a conditional network on unlabelled data": (
        lambda: DiffusionModule(unet(num_classes=10), class_names=[str(i) for i in range(10)]),
        lambda: ImageDataModule(batch_size=8),
        "num_classes 10 where the data's is None (unconditional)",
    ),
    "an unconditional network on labelled data": (
        lambda: DiffusionModule(unet()),
        lambda: ImageDataModule(batch_size=8, conditional=True),
        "num_classes None (unconditional) (the data's labels would be dropped) where the data's is 10",
    ),
    "more classes than the data's": (
        lambda: DiffusionModule(unet(num_classes=12)),
        lambda: ImageDataModule(batch_size=8, conditional=True),
        "num_classes 12 where the data's is 10",
    ),
    "another normalization": (
        lambda: DiffusionModule(unet(), normalization={"shift": [0.0], "scale": [1.0]}),
        lambda: ImageDataModule(batch_size=8),
        "normalization shift [0.0] scale [1.0] where the data's is shift [0.5] scale [0.5]",
    ),
    "other class names": (
        lambda: DiffusionModule(unet(num_classes=10), class_names=list("abcdefghij")),
        lambda: ImageDataModule(batch_size=8, conditional=True),
        "class_names ['a', 'b',",
    ),
    # (an MLP left at the default image shape is refused when built: tests/training/test_sample_shape_fits_network)
    "vectors of another width": (
        lambda: DiffusionModule(
            MLP(in_channels=3, hidden_dim=8, num_blocks=1, time_embed_dim=8), sample_shape=(3,)
        ),
        lambda: VectorDataModule("swiss_roll", num_samples=64, batch_size=16),
        "sample_shape (3,) where the data's is (2,)",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_module_built_for_other_data_is_refused_before_the_first_step(case):
    module, data, said = (make() if callable(make) else make for make in CASES[case])
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    with pytest.raises(ValueError, match="built for other data than its trainer's") as refused:
        fit(module, data)
    assert said in str(refused.value)
    assert "DiffusionModule(network, sample_shape=data.sample_shape, normalization=data.normalization" in str(
        refused.value
    )
    assert all((p == before[name]).all() for name, p in module.named_parameters())  # no step was taken


def test_a_module_built_from_the_data_or_without_its_optional_values_trains():
    """Built from the data's values, or without normalization and class names (nothing to compare), or on a
    data module that says none of these (a user's own, its samples of the module's shape): trained, not refused."""
    digits = ImageDataModule(batch_size=8, conditional=True)
    built = DiffusionModule(
        unet(num_classes=10), sample_shape=digits.sample_shape, normalization=digits.normalization,
        class_names=digits.class_names,
    )  # fmt: skip
    assert fit(built, digits).global_step == 1
    assert fit(DiffusionModule(unet()), ImageDataModule(batch_size=8)).global_step == 1

    # its batches are held to the module's sample_shape (tests/training/test_own_trainer_data_checks.py)
    assert fit(DiffusionModule(unet(), sample_shape=(1, 8, 8)), DigitsSayingNothing()).global_step == 1


class OwnVectors(L.LightningDataModule):
    """A user's own data module whose normalization was computed from the data, as tensors (tester 18b, M4)."""

    sample_shape = (2,)

    def __init__(self, normalization) -> None:
        super().__init__()
        self.normalization = normalization
        self.x = torch.randn(32, 2, generator=torch.Generator().manual_seed(0))

    def train_dataloader(self):
        return DataLoader(IndexedDataset(TensorDataset(self.x)), batch_size=8)


def vector_module(normalization) -> DiffusionModule:
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8)
    return DiffusionModule(network, sample_shape=(2,), normalization=normalization, num_timesteps=50)


def test_a_normalization_of_tensors_in_the_module_and_the_data_is_compared_as_numbers():
    # "Boolean value of Tensor with more than one value is ambiguous" at setup, numpy's "truth value of an array"
    x = torch.randn(32, 2) * 3 + 1
    tensors = {"shift": x.mean(0), "scale": x.std(0)}
    assert fit(vector_module(tensors), OwnVectors(tensors)).global_step == 1
    arrays = {"shift": np.zeros(2), "scale": np.ones(2)}
    assert fit(vector_module(arrays), OwnVectors(arrays)).global_step == 1
    assert fit(vector_module({"shift": [0.0, 0.0], "scale": [1.0, 1.0]}), OwnVectors(arrays)).global_step == 1
    with pytest.raises(ValueError, match="built for other data than its trainer's") as refused:
        fit(vector_module(arrays), OwnVectors({"shift": torch.tensor([0.0, 2.0]), "scale": torch.ones(2)}))
    assert (
        "normalization shift [0.0, 0.0] scale [1.0, 1.0] where the data's is shift [0.0, 2.0] scale [1.0, 1.0]"
        in (str(refused.value))
    )


def test_a_data_modules_normalization_that_holds_no_numbers_is_refused_naming_it():
    with pytest.raises(TypeError) as refused:
        fit(
            vector_module({"shift": [0.0, 0.0], "scale": [1.0, 1.0]}),
            OwnVectors({"shift": [0, 0], "scale": "x"}),
        )
    assert str(refused.value).startswith(
        "OwnVectors.normalization['scale']='x' is a str, not a list of numbers, one per channel — give the data "
        "module a normalization dict of a 'shift' and a 'scale' list of numbers"
    )
