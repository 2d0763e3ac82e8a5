"""module.trajectory checks its arguments as reverse_steps does (tester round 19b, Q8), when it is called and before
the first step: x_T a finite floating-point tensor (N, *sample_shape) on the model's device (a count of samples
ended in "object of type 'int' has no len()", a NumPy array in a false claim of devices, NaN noise gave NaN samples
without a word), its generator (an int ended in noise.py's len()) and `progress` (a str drew a bar); a good call
gives the samples it gave before, those of reverse_steps on the bare network."""

import numpy as np
import pytest
import torch

from diffusion.core.noise import WrongDtype
from diffusion.core.sampling import SamplingOptions, final_sample, reverse_steps
from diffusion.errors import InvalidValue, OutOfRange, WrongType
from diffusion.models import MLP, UNet
from diffusion.training.module import DiffusionModule

OPTIONS = SamplingOptions(sampler="ddim", steps=2)
NOISE_FIX = "pass the initial noise, e.g. torch.randn(n, *module.sample_shape)"


def vectors(num_classes: int | None = None) -> DiffusionModule:
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8, num_classes=num_classes)
    # label dropout: a conditional model that learnt the unconditional prediction samples a label -1 too
    dropout = 0.1 if num_classes is not None else 0.0
    return DiffusionModule(
        network, sample_shape=(2,), num_timesteps=20, beta_schedule="cosine", label_dropout=dropout
    )


def images() -> DiffusionModule:
    network = UNet(in_channels=1, channels=8, channel_mult=(1,), num_res_blocks=1, attention_levels=())
    return DiffusionModule(network, sample_shape=(1, 8, 8), num_timesteps=20, beta_schedule="cosine")


def refusal(call, kind: type[Exception]) -> str:
    """The line `call` is refused with, raised by the call itself: no step is taken to find it."""
    with pytest.raises(kind) as error:
        call()
    return str(error.value)


def test_a_count_of_samples_as_x_T_is_said_with_the_noise_of_that_count_and_module_sample():
    # Was "TypeError: object of type 'int' has no len()" from inside trajectory (module.sample(16) takes a count).
    line = refusal(lambda: images().trajectory(16), WrongType)
    assert line == (
        "x_T=16 is an int, not a tensor — pass the initial noise, e.g. torch.randn(16, *module.sample_shape), "
        "or module.sample(16) for samples"
    )


def test_an_array_as_x_T_is_said_as_an_array_not_as_two_devices():
    # Was "t is on cpu and x on cpu — put them on one device", of tensors the user never passed.
    line = refusal(lambda: vectors().trajectory(np.zeros((4, 2), np.float32), options=OPTIONS), WrongType)
    assert line == (
        f"x_T=<ndarray> is a ndarray, not a tensor — {NOISE_FIX}, "
        "or torch.as_tensor(x_T, dtype=torch.float32) for an array"
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_x_T_that_is_not_finite_is_refused_before_it_samples_nan(value):
    # Was: every step ran and every sample came back NaN, without a word.
    x_T = torch.randn(4, 2)
    x_T[1, 0] = value
    line = refusal(lambda: vectors().trajectory(x_T, options=OPTIONS), InvalidValue)
    assert line == (
        "x_T holds values that are not finite (NaN or infinity), and every sample drawn from it would be NaN — "
        + NOISE_FIX
    )


def test_x_T_of_integers_or_float64_is_said_of_x_T_not_of_the_network_x():
    line = refusal(lambda: vectors().trajectory(torch.zeros(4, 2, dtype=torch.long)), WrongDtype)
    assert line == f"x_T is an int64 tensor, not a floating-point tensor — {NOISE_FIX}"
    line = refusal(lambda: vectors().trajectory(torch.zeros(4, 2, dtype=torch.float64)), WrongDtype)
    assert line.startswith(
        "x_T is a float64 tensor, not float32, the dtype of the MLP's weights — pass x_T.float()"
    )


@pytest.mark.parametrize(
    ("make", "x_T", "said"),
    [(vectors, torch.randn(4, 3), "x_T has shape (4, 3), and this model samples (N, 2) (its sample_shape=(2,))"),
     (vectors, torch.tensor(0.5), "x_T has shape (), and this model samples (N, 2) (its sample_shape=(2,))"),
     (images, torch.randn(2, 1, 16, 16),
      "x_T has shape (2, 1, 16, 16), and this model samples (N, 1, 8, 8) (its sample_shape=(1, 8, 8))")],
)  # fmt: skip
def test_x_T_of_another_shape_than_the_model_samples_is_refused(make, x_T, said):
    # Was: a vector model's said "the data's samples have 3", a 0-d tensor torch's len(), an image model sampled 16x16.
    line = refusal(lambda: make().trajectory(x_T, options=OPTIONS), InvalidValue)
    assert line == f"{said} — pass the initial noise of its shape, e.g. torch.randn(n, *module.sample_shape)"


def test_x_T_on_another_device_than_the_model_is_said_with_both():
    line = refusal(
        lambda: vectors().trajectory(torch.empty(4, 2, device="meta"), options=OPTIONS), InvalidValue
    )
    assert line == (
        "x_T is on meta and this model on cpu — pass x_T.to(module.device), or move the model there: "
        "module.to(x_T.device)"
    )


def test_a_generator_that_is_no_generator_is_named_as_reverse_steps_names_it():
    # Was "TypeError: object of type 'int' has no len()" in diffusion/core/noise.py.
    ddpm = SamplingOptions(sampler="ddpm", steps=2)
    line = refusal(lambda: vectors().trajectory(torch.randn(4, 2), generator=3, options=ddpm), WrongType)
    assert line == (
        "generator=3 is an int, not a torch.Generator, a list of them or None — pass a torch.Generator "
        "(torch.Generator().manual_seed(0)), one per sample of x_T, or None"
    )
    two = [torch.Generator(), torch.Generator()]
    line = refusal(lambda: vectors().trajectory(torch.randn(4, 2), generator=two, options=ddpm), OutOfRange)
    assert line == (
        "generator=<2 generators> must be one generator per sample of x_T (4) — pass as many generators as x_T "
        "has samples, or one torch.Generator for all"
    )
    module, x_T = vectors(), torch.randn(4, 2)
    assert refusal(lambda: reverse_steps(module.network, module.schedule, x_T, generator=3), WrongType) == (
        refusal(lambda: module.trajectory(x_T, generator=3), WrongType)
    )


def test_progress_that_is_not_a_bool_is_refused():
    # Was: accepted ("x" is truthy), a progress bar drawn.
    line = refusal(lambda: vectors().trajectory(torch.randn(4, 2), options=OPTIONS, progress="x"), WrongType)
    assert line == "progress='x' is a str, not True or False — pass progress=True or progress=False"


def test_labels_of_the_wrong_kind_or_number_are_refused_at_the_call():
    conditional = vectors(num_classes=3)
    floats = torch.tensor([1.0, 2.0, 0.0, 1.0])
    line = refusal(
        lambda: conditional.trajectory(torch.randn(4, 2), options=OPTIONS, labels=floats), WrongType
    )
    assert line.startswith("labels=tensor([1., 2., 0., 1.]) is a Tensor, not integer class indices")
    two = torch.tensor([1, 2])
    line = refusal(lambda: conditional.trajectory(torch.randn(4, 2), options=OPTIONS, labels=two), OutOfRange)
    assert line.startswith("labels=<2 labels> must be one label per sample, shape (4,) for num_samples=4")


def test_a_good_call_gives_the_samples_of_reverse_steps_and_of_sample():
    torch.manual_seed(0)
    module = vectors(num_classes=3)
    module.train()
    labels = torch.tensor([0, 1, 2, -1])
    for sampler in ("ddpm", "ddim", "heun"):
        options = SamplingOptions(sampler=sampler, steps=3)
        x_T = torch.randn(4, 2, generator=torch.Generator().manual_seed(1))
        ours, modes = [], []
        for step in module.trajectory(x_T, torch.Generator().manual_seed(2), options, labels=labels):
            ours.append(step)
            modes.append(module.training)
        assert modes == [False] * 3 and module.training  # eval mode within the steps only
        theirs = list(
            reverse_steps(module.network.eval(), module.schedule, x_T, generator=torch.Generator().manual_seed(2),
                          labels=labels, **options.as_kwargs())
        )  # fmt: skip
        module.train()
        assert len(ours) == len(theirs) == 3
        for step, reference in zip(ours, theirs, strict=True):
            assert torch.equal(step.x, reference.x) and torch.equal(step.x0, reference.x0)
        x_T, noise = module.initial_noise(4, seed=5)
        assert torch.equal(
            module.sample(4, seed=5, options=options), final_sample(module.trajectory(x_T, noise, options))
        )
