"""A fit checks a user's own network's output at its first step as sampling checks it, in the same line (tester
round 24b, S8): a fixed variance's 2C channels (trained on a loss broadcast over them, then refused by generate),
another size, a tuple. A validation refuses labelled data for an unconditional model, as the fit's first training
batch does (S2)."""

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from diffusion import DiffusionModule, IndexedDataset, SamplingOptions, generate
from diffusion.core.guidance import NO_LABEL
from diffusion.errors import InvalidValue
from diffusion.models import UNet
from diffusion.training import loss as objective

X = torch.rand(16, 1, 8, 8) * 2 - 1
Y = torch.arange(16) % 10
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


class OwnNet(nn.Module):
    """A user's own network, forward(x, t, y=None), whose output `out` makes of its `channels` channels."""

    def __init__(self, channels: int, out=lambda h: h) -> None:
        super().__init__()
        self.conv, self.out = nn.Conv2d(1, channels, 3, padding=1), out

    def forward(self, x, t, y=None):
        return self.out(self.conv(x))


class OwnVectorNet(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2, features)

    def forward(self, x, t, y=None):
        return self.linear(x)


def fit(module, data=X, val=None, max_steps=2) -> L.Trainer:
    trainer = L.Trainer(max_steps=max_steps, limit_val_batches=0 if val is None else 1.0, **QUIET)
    loader = DataLoader(IndexedDataset(TensorDataset(data)), batch_size=4)
    trainer.fit(module, loader, None if val is None else DataLoader(val, batch_size=4))
    return trainer


def own(network, sample_shape=(1, 8, 8), **options) -> DiffusionModule:
    return DiffusionModule(network, sample_shape=sample_shape, num_timesteps=50, warmup_steps=1, **options)


TWO_FOR_ONE = (
    "the network outputs 2 channels and x_T has 1 — build it with out_channels 1 (or pass learned_variance=True for "
    "2 x 1; a DiffusionModule: variance learned_range)"
)


@pytest.mark.parametrize(
    ("network", "options", "line"),
    [
        (OwnNet(2), {}, TWO_FOR_ONE),
        (OwnNet(2), {"prediction_type": "v"}, TWO_FOR_ONE),
        (
            OwnNet(1, lambda h: h[:, :, :4, :4]), {},
            "the network outputs shape (4, 1, 4, 4) for x_t of shape (4, 1, 8, 8) — make model(x_t, t) return one "
            "prediction of x_t's shape per sample",
        ),
        (
            OwnNet(1, lambda h: (h,)), {},
            "the network returned a tuple, not a tensor of x_t's shape — make model(x_t, t) return the prediction "
            "itself, one tensor of x_t's shape",
        ),
        (  # an even count: split_output took its first 2 channels, broadcast against the 1 of the samples
            OwnNet(4), {"variance": "learned_range"},
            "the network outputs 4 channels and x_T has 1: a network with learned variances outputs 2 x 1 (the "
            "prediction, then v) — build it with out_channels 2",
        ),
    ],
)  # fmt: skip
def test_a_fit_refuses_its_own_networks_output_at_the_first_step_as_sampling_does(network, options, line):
    module = own(network, **options)
    with pytest.raises(InvalidValue) as refused:
        fit(module)
    assert str(refused.value) == line
    assert module.trainer.global_step == 0  # at the first step: no optimizer step taken


def test_the_fit_and_generate_say_the_same_line_one_check_for_both():
    module = own(OwnNet(2))
    with pytest.raises(InvalidValue) as fitting:
        fit(module)
    with pytest.raises(InvalidValue) as sampling:
        generate(module, 2, sampler=module.sampler(SamplingOptions(sampler="ddim", steps=2)))
    assert str(fitting.value) == str(sampling.value) == TWO_FOR_ONE


def test_vectors_are_said_in_features():
    with pytest.raises(InvalidValue, match=r"^the network outputs 4 features and x_T has 2 — build it with "):
        fit(own(OwnVectorNet(4), sample_shape=(2,)), torch.randn(16, 2))


def test_an_odd_count_with_learned_variances_keeps_its_line_naming_the_option():
    with pytest.raises(
        InvalidValue, match=r"^a network with learned variances outputs 2C channels .*, got 3 — "
    ):
        fit(own(OwnNet(3), variance="learned_range"))


def test_the_output_is_checked_at_the_first_step_only_and_fitting_networks_train(monkeypatch):
    calls = []
    check = objective.check_network_output
    monkeypatch.setattr(objective, "check_network_output", lambda *args: calls.append(args) or check(*args))
    trainer = fit(own(OwnNet(1)), max_steps=3)
    assert trainer.global_step == 3 and len(calls) == 1
    calls.clear()
    fit(own(OwnNet(2), variance="learned_range"), max_steps=3)
    assert len(calls) == 1


def test_a_validation_checks_the_output_too():
    trainer = L.Trainer(**QUIET)
    with pytest.raises(InvalidValue) as refused:
        trainer.validate(own(OwnNet(2)), DataLoader(IndexedDataset(TensorDataset(X)), batch_size=4))
    assert str(refused.value) == TWO_FOR_ONE


def unconditional() -> DiffusionModule:
    network = UNet(in_channels=1, channels=8, channel_mult=(1,), num_res_blocks=1, attention_levels=())
    return DiffusionModule(network, num_timesteps=100, warmup_steps=1)


def labelled(labels=Y) -> IndexedDataset:
    return IndexedDataset(TensorDataset(X, labels), with_labels=True)


VALIDATION_LABELS = (
    "the validation data holds class labels ({} of the 16 samples validated), and this model is unconditional "
    "(its network has no num_classes): it would validate without them, as unconditional — leave with_labels out "
    "of IndexedDataset to validate an unconditional model, or build the network with num_classes (the number of "
    "classes) to train a class-conditional one"
)


def test_validating_an_unconditional_model_on_labelled_data_is_refused():
    with pytest.raises(InvalidValue) as refused:
        L.Trainer(**QUIET).validate(unconditional(), DataLoader(labelled(), batch_size=4))
    assert str(refused.value) == VALIDATION_LABELS.format(16)
    some = torch.where(torch.arange(16) < 13, NO_LABEL, Y)  # labels on 3 samples only: still labelled data
    with pytest.raises(InvalidValue) as refused:
        L.Trainer(**QUIET).validate(unconditional(), DataLoader(labelled(some), batch_size=4))
    assert str(refused.value) == VALIDATION_LABELS.format(3)


def test_a_fit_on_unlabelled_training_data_refuses_labelled_validation_data():
    with pytest.raises(InvalidValue, match=r"^the validation data holds class labels \(8 of the 8 samples "):
        fit(unconditional(), val=labelled())  # at the sanity check's two batches, before any step


def test_unlabelled_validation_data_and_no_label_at_all_validate_an_unconditional_model():
    none = torch.full((16,), NO_LABEL)
    for data in (IndexedDataset(TensorDataset(X)), labelled(none)):
        (result,) = L.Trainer(**QUIET).validate(unconditional(), DataLoader(data, batch_size=4))
        assert set(result) == {"val/loss"}
