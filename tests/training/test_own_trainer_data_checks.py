"""A DiffusionModule fit by a user's own `Trainer` on a plain DataLoader (no data module to hold it against at setup)
refuses data it would train wrongly on (tester round 15b): samples of another shape than its `sample_shape` (S3),
at the first training or validation batch, and data holding NaN or infinity (S4), found in the fit's first
training batch and said as data, not as divergence, even by a run too short to reach any logging step, validation
or checkpoint save. A run whose weights end up NaN from later data is said to have diverged at its end."""

import lightning as L
import pytest
import torch
from helpers import DigitsSayingNothing, tiny_vector_model
from torch.utils.data import DataLoader

from diffusion import DiffusionModule, IndexedDataset
from diffusion.models import UNet
from diffusion.training.divergence import TrainingDiverged


def fit(module, train, val=None, max_steps: int = 3, **trainer_options) -> L.Trainer:
    options = dict(
        max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0 if val is None else 1,
    )  # fmt: skip
    trainer = L.Trainer(**{**options, **trainer_options})
    loader = DataLoader(IndexedDataset(train), batch_size=4)
    trainer.fit(module, loader, None if val is None else DataLoader(IndexedDataset(val), batch_size=4))
    return trainer


def tiny_images(sample_shape=(1, 8, 8)) -> DiffusionModule:
    network = UNet(channels=8, channel_mult=(1, 2), num_res_blocks=1, attention_levels=())
    return DiffusionModule(network, sample_shape=sample_shape, num_timesteps=100, warmup_steps=0)


def test_training_batches_of_another_size_than_sample_shape_are_refused_naming_both():
    images = [torch.rand(1, 16, 16) for _ in range(8)]
    expected = (
        r"^the training batch's samples have shape \(1, 16, 16\), and this DiffusionModule was built with "
        r"sample_shape \(1, 8, 8\): .* — build the DiffusionModule with sample_shape=\(1, 16, 16\) \(the data's\), "
        r"or resize the data to \(1, 8, 8\)$"
    )
    with pytest.raises(ValueError, match=expected):
        fit(tiny_images(), images)


def test_a_data_module_that_says_nothing_of_its_shape_is_held_to_it_at_the_first_batch():

    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match=r"^the training batch's samples have shape \(1, 8, 8\), and this "):
        trainer.fit(tiny_images((1, 4, 4)), datamodule=DigitsSayingNothing())
    assert trainer.global_step == 0


def test_validation_batches_of_another_size_are_refused_too():
    images = [torch.rand(1, 8, 8) for _ in range(8)]
    with pytest.raises(ValueError, match=r"^the validation batch's samples have shape \(1, 16, 16\)"):
        fit(tiny_images(), images, val=[torch.rand(1, 16, 16) for _ in range(4)])


def test_another_channel_count_is_said_by_the_network_with_its_fix():
    with pytest.raises(ValueError, match=r"^UNet is for images of 1 channel, and the data's samples have 3"):
        fit(tiny_images(), [torch.rand(3, 8, 8) for _ in range(8)])


def test_data_of_the_modules_shape_trains_images_and_vectors():
    fit(tiny_images((1, 8, 16)), [torch.rand(1, 8, 16) for _ in range(8)])
    fit(tiny_vector_model(), [torch.randn(2) for _ in range(8)], val=[torch.randn(2) for _ in range(4)])


def test_a_first_batch_holding_nan_is_refused_as_data_at_the_end_of_a_short_fit():
    data = [torch.randn(2) for _ in range(8)]
    data[1] = torch.tensor([float("nan"), 0.0])
    data[2] = torch.tensor([0.0, float("inf")])
    expected = (
        r"^the training data holds NaN or infinity: 2 of the 4 samples of the fit's first training batch are not "
        r"finite \(dataset positions 1, 2\), .* — clean the data"
    )
    with pytest.raises(ValueError, match=expected):
        fit(tiny_vector_model(), data)  # 3 steps: no logging step, validation or checkpoint save


def test_it_is_said_as_data_at_the_first_logging_step_rather_than_as_divergence():
    data = [torch.full((2,), float("nan"))] * 8
    with pytest.raises(ValueError, match=r"^the training data holds NaN or infinity: 4 of the 4") as refused:
        fit(tiny_vector_model(), data, max_steps=20, log_every_n_steps=1)
    assert not isinstance(refused.value, TrainingDiverged)


def test_weights_made_nan_by_later_data_are_said_at_the_end_of_the_fit():
    data = [torch.randn(2) for _ in range(8)]
    data[5] = torch.tensor([float("nan"), 0.0])  # in the second batch: the first is clean
    with pytest.raises(TrainingDiverged) as diverged:
        fit(tiny_vector_model(), data)
    line = str(diverged.value)
    assert line.startswith(
        "training diverged: the weights are not finite (NaN or infinity) at step 3, first "
    ), line
    assert "; found at the end of training (no checkpoint was written) — " in line
    assert "check the data for extreme values" in line and "holds NaN" not in line  # not found: not claimed


def test_a_clean_fit_ends_normally_with_finite_weights():
    module = tiny_vector_model()
    fit(module, [torch.randn(2) for _ in range(8)])
    assert all(torch.isfinite(p).all() for p in module.parameters())


# Tester round 16b: F5-F7, data that does not fit the model, refused rather than trained on.
def tiny_conditional_images(num_classes: int | None = 3) -> DiffusionModule:
    network = UNet(
        channels=8, channel_mult=(1, 2), num_res_blocks=1, attention_levels=(), num_classes=num_classes
    )
    return DiffusionModule(network, sample_shape=(1, 8, 8), num_timesteps=100, warmup_steps=0)


def fit_labelled(module, items, with_labels: bool) -> None:
    trainer = L.Trainer(
        max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(module, DataLoader(IndexedDataset(items, with_labels=with_labels), batch_size=4))


def test_a_conditional_model_given_unlabelled_data_is_refused_not_trained_as_unconditional():
    expected = (
        r"^every label of the fit's first training batch is NO_LABEL \(-1\), and this model is class-conditional "
        r"\(num_classes=3\): .* — build IndexedDataset\(\.\.\., with_labels=True\)"
    )
    with pytest.raises(ValueError, match=expected):
        fit_labelled(tiny_conditional_images(), [torch.rand(1, 8, 8) for _ in range(8)], with_labels=False)


def test_a_conditional_model_trains_on_labelled_data_some_of_it_unlabelled():
    items = [
        (torch.rand(1, 8, 8), -1 if i % 2 else i % 3) for i in range(8)
    ]  # NO_LABEL for some samples only
    fit_labelled(tiny_conditional_images(), items, with_labels=True)


def test_labels_given_to_an_unconditional_model_are_refused_not_ignored():
    expected = (
        r"^the fit's first training batch holds class labels, and this model is unconditional \(its network has no "
        r"num_classes\): .* — build the network with num_classes"
    )
    items = [(torch.rand(1, 8, 8), 1) for _ in range(8)]
    with pytest.raises(ValueError, match=expected):
        fit_labelled(tiny_conditional_images(None), items, with_labels=True)
    fit_labelled(tiny_conditional_images(None), items, with_labels=False)  # the labels left out: it trains


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool])
def test_integer_samples_are_refused_with_their_conversion_to_model_units(dtype):
    images = [torch.randint(0, 2 if dtype == torch.bool else 255, (1, 8, 8)).to(dtype) for _ in range(8)]
    expected = (
        rf"^batch x is an? {str(dtype).removeprefix('torch.')} tensor, not floating point in model units "
        r"\(floats in \[-1, 1\]\) — convert them in your dataset: x\.float\(\) / 127\.5 - 1 for 0\.\.255 images"
    )
    with pytest.raises(TypeError, match=expected):
        fit(tiny_images(), images)


def test_images_far_outside_model_units_are_refused_as_data():
    # 0..255 pixels made floats without the scaling trained without a word, and every sample came out clipped
    # (tester round 22b, S3); images in model units and a user's standardized ones (a few units) train.
    pixels = [(torch.rand(1, 8, 8) * 255).round() for _ in range(8)]
    peak = max(float(image.max()) for image in pixels[:4])
    with pytest.raises(ValueError) as refused:
        fit(tiny_images(), pixels)
    assert str(refused.value) == (
        f"the fit's first training batch holds images with values up to {peak:g}, far outside model units (-1..1): "
        "the samples are clipped to -1..1, so this model could never draw them — scale the images in your dataset: "
        "x / 127.5 - 1 for 0..255 pixels, x * 2 - 1 for 0..1 (the project's data modules do)"
    )
    fit(tiny_images(), [torch.rand(1, 8, 8) * 8 - 4 for _ in range(8)])  # in -4..4
    fit(tiny_vector_model(), [torch.randn(2) * 100 for _ in range(8)])  # vectors: any scale


def test_validation_images_far_outside_model_units_are_refused_as_data():
    # Training data in -1..1 and validation data of 0..255 floats logged a val/loss without a word (tester round 23,
    # S2): the validation's images are held to the same range, their largest value kept on the device.
    images = [torch.rand(1, 8, 8) * 2 - 1 for _ in range(8)]
    pixels = [(torch.rand(1, 8, 8) * 255).round() for _ in range(8)]
    pixels[5][0, 0, 0] = 300.5  # in the second batch: the peak is kept across batches
    line = (
        "the validation data holds images with values up to 300.5, far outside model units (-1..1): its validation "
        "loss says nothing of the model, whose samples are clipped to -1..1 — scale the images in your dataset: "
        "x / 127.5 - 1 for 0..255 pixels, x * 2 - 1 for 0..1 (the project's data modules do)"
    )
    with pytest.raises(ValueError) as refused:
        fit(tiny_images(), images, val=pixels, limit_val_batches=2, num_sanity_val_steps=0)
    assert str(refused.value) == line
    module = tiny_images()
    trainer = L.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu"
    )
    with pytest.raises(ValueError) as validated:
        trainer.validate(module, DataLoader(IndexedDataset(pixels), batch_size=4))
    assert str(validated.value) == line
    fit(
        tiny_images(), images, val=[torch.rand(1, 8, 8) * 8 - 4 for _ in range(8)], limit_val_batches=2
    )  # -4..4
