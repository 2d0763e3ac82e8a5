"""A DiffusionModule fit by a user's own `Trainer` with a data module is held against that data module at setup:
train.py builds the module from the data, a plain `Trainer.fit` takes whatever the module was built with (tester
round 6b, L3). Each refusal comes before the first step; what a data module does not say is not compared."""

import lightning as L
import pytest
from helpers import DigitsSayingNothing

from diffusion import DiffusionModule, ImageDataModule, VectorDataModule
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
