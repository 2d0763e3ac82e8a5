"""Guidance asked without labels: every sample of a conditional model then has none, so both halves of the guided
forward are the unconditional prediction and the samples were guidance 0's, bit for bit, at twice its cost, without a
word (tester round 22 S1). Refused, before any sampling, by `generate` (a sampler built with guidance), by
`module.sample` and `module.trajectory` (options with guidance), as `reverse_steps` refuses it; guidance 0
(unconditional) and 1 (plain conditional) take no labels, and a model's own guidance (its checkpoint's `sampling`)
samples unconditionally as it always did. And labels out of a network's classes are refused by `reverse_steps` as
`labels`, the caller's word, not as the network's `y` (S9)."""

import dataclasses

import pytest
import torch
from helpers import tiny_vector_model

from diffusion.core.guidance import NO_LABEL
from diffusion.core.sampling import SAMPLERS, SamplingOptions, reverse_steps
from diffusion.core.schedule import NoiseSchedule
from diffusion.data.labels import class_labels
from diffusion.generation.ranks import generate
from diffusion.models import MLP


def guided_model(**arguments):
    return tiny_vector_model(num_classes=3, label_dropout=0.1, **arguments)


def refusal(scale: float, labels: str, unset: str) -> str:
    return (
        f"guidance_scale={scale} guides each sample towards its label, and labels is unset — pass {labels}, "
        f"one class per sample, or {unset} (0 for unconditional samples)"
    )


GENERATE = refusal(3.0, "labels=class_labels(num_samples, 3)", "build the sampler without guidance_scale")


@pytest.mark.parametrize(
    "sampler",
    [
        lambda m: m.sampler(SamplingOptions(sampler="ddim", guidance_scale=3.0, steps=3)),
        lambda m: SAMPLERS["ddim"](steps=3, guidance_scale=3.0),  # built by hand
    ],
    ids=["module.sampler", "by-hand"],
)
def test_generate_refuses_a_guiding_sampler_without_labels_before_sampling(sampler):
    module = guided_model()
    calls = []
    module.network.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError) as refused:
        generate(module, 4, sampler=sampler(module), seed=0)
    assert str(refused.value) == GENERATE
    assert calls == []  # before any network call


def test_generate_refuses_it_by_the_deprecated_options_too():
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError) as refused:
        generate(guided_model(), 4, options=SamplingOptions(sampler="ddim", guidance_scale=3.0, steps=3))
    assert str(refused.value) == GENERATE


def test_generate_guides_with_labels_and_takes_guidance_0_or_1_without():
    module = guided_model()
    guided = generate(module, 4, sampler=module.sampler(SamplingOptions(guidance_scale=3.0)), seed=0,
                      labels=class_labels(4, 3))  # fmt: skip
    unconditional = generate(module, 4, sampler=module.sampler(SamplingOptions(guidance_scale=0.0)), seed=0)
    plain = generate(module, 4, sampler=module.sampler(SamplingOptions(guidance_scale=1.0)), seed=0)
    assert guided.shape == (4, 2)
    torch.testing.assert_close(
        plain, unconditional, rtol=0, atol=0
    )  # no labels: one unconditional pass either way


def test_a_models_own_guidance_samples_unconditionally_without_labels_as_before():
    module = guided_model()
    module.sampling = SamplingOptions(
        sampler="ddim", steps=3, guidance_scale=1.5
    )  # a recipe's, e.g. digits_conditional
    own = generate(module, 4, seed=0)
    also_own = generate(module, 4, sampler=module.sampler(SamplingOptions(steps=3)), seed=0)
    assert own.shape == (4, 2) and torch.equal(own, also_own)
    assert module.sample(4, seed=0).shape == (4, 2)


@pytest.mark.parametrize(
    "sampler",
    [
        lambda m: SAMPLERS["ddim"](steps=3, guidance_scale=1.5),  # by hand, equal to the model's own
        lambda m: m.sampler(SamplingOptions(steps=3, guidance_scale=1.5)),  # the model's scale, given again
        lambda m: dataclasses.replace(m.sampler(), steps=2),  # the model's own, remade by the caller
    ],
    ids=["by-hand", "scale-given", "replaced"],
)
def test_a_callers_sampler_of_the_models_own_scale_still_needs_labels(sampler):
    # Session 25's known gap: a sampler the caller built with exactly the model's default scale was taken for
    # the model's own and sampled unconditionally without a word
    module = guided_model()
    module.sampling = SamplingOptions(sampler="ddim", steps=3, guidance_scale=1.5)
    with pytest.raises(ValueError) as refused:
        generate(module, 4, sampler=sampler(module), seed=0)
    assert str(refused.value) == refusal(
        1.5, "labels=class_labels(num_samples, 3)", "build the sampler without guidance_scale"
    )


def test_module_sample_and_trajectory_refuse_guidance_without_labels_before_sampling():
    module = guided_model()
    calls = []
    module.network.register_forward_pre_hook(lambda *_: calls.append(1))
    options = SamplingOptions(sampler="ddim", guidance_scale=3.0, steps=3)
    with pytest.raises(ValueError) as refused:
        module.sample(4, seed=0, options=options)
    assert str(refused.value) == refusal(
        3.0, "labels=class_labels(num_samples, 3)", "leave guidance_scale unset"
    )
    with pytest.raises(ValueError) as refused:
        module.trajectory(torch.zeros(4, 2), options=options)
    assert str(refused.value) == refusal(
        3.0, "labels=class_labels(len(x_T), 3)", "leave guidance_scale unset"
    )
    assert calls == []
    for scale in (0.0, 1.0):  # unconditional and plain conditional: no labels needed
        assert module.sample(4, seed=0, options=SamplingOptions(guidance_scale=scale)).shape == (4, 2)
    assert module.sample(4, seed=0, options=options, labels=class_labels(4, 3)).shape == (4, 2)


def test_a_model_trained_with_label_dropout_0_is_told_of_that_first():
    module = tiny_vector_model(num_classes=3, label_dropout=0.0)
    with pytest.raises(ValueError, match=r"^guidance_scale 3 asks for the unconditional prediction"):
        module.sample(4, seed=0, options=SamplingOptions(guidance_scale=3.0))
    with pytest.raises(ValueError, match=r"^guidance_scale 3 asks for the unconditional prediction"):
        generate(module, 4, sampler=SAMPLERS["ddim"](steps=3, guidance_scale=3.0))


def test_reverse_steps_takes_guidance_0_without_labels():
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, num_classes=3)
    schedule, x_T = NoiseSchedule(num_timesteps=20), torch.zeros(2, 2)
    steps = list(reverse_steps(network, schedule, x_T, sampler="ddim", steps=2, guidance_scale=0.0))
    assert len(steps) == 2


@pytest.mark.parametrize(("labels", "shown"), [([1, 10], "[10]"), ([-2, 0], "[-2]")])
def test_reverse_steps_refuses_labels_outside_the_networks_classes_as_labels(labels, shown):
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, num_classes=10)
    schedule, x_T = NoiseSchedule(num_timesteps=20), torch.zeros(2, 2)
    with pytest.raises(ValueError) as refused:
        reverse_steps(network, schedule, x_T, labels=torch.tensor(labels), sampler="ddim", steps=2)
    assert str(refused.value) == (
        f"labels={shown} must be classes 0..9 (or {NO_LABEL}: no label) — pass labels of this model's classes, "
        "e.g. class_labels(len(x_T), 10)"
    )
    assert len(list(reverse_steps(network, schedule, x_T, labels=torch.tensor([9, NO_LABEL]), steps=2,
                                  sampler="ddim"))) == 2  # fmt: skip


def test_guidance_without_labels_says_the_labels_of_a_conditional_network_and_the_classes_of_another():
    # A 10-class network was called "an unconditional model (it has no classes to guide towards)" (tester 22b S4)
    schedule, x_T = NoiseSchedule(num_timesteps=20), torch.randn(2, 2)
    conditional = MLP(in_channels=2, hidden_dim=8, num_blocks=1, num_classes=10)
    with pytest.raises(ValueError) as refused:
        reverse_steps(conditional, schedule, x_T, sampler="ddim", steps=2, guidance_scale=2.0)
    assert str(refused.value) == (
        "guidance_scale=2.0 guides each sample towards its label, and labels is unset — pass "
        "labels=class_labels(len(x_T), 10), one class per sample of x_T, or leave guidance_scale unset"
    )
    unconditional = MLP(in_channels=2, hidden_dim=8, num_blocks=1)
    with pytest.raises(
        ValueError, match=r"^guidance_scale=2.0 must be unset \(or 1\) for an unconditional model"
    ):
        reverse_steps(unconditional, schedule, x_T, sampler="ddim", steps=2, guidance_scale=2.0)
