"""A bare network whose output does not fit x_T, sampled with `reverse_steps`: said of the network (its features
or channels, and the out_channels to build it with) at the first evaluation, never as the `output=` argument of an
inner formula the caller never passed; and reverse_steps' switches refused unless True or False."""

import pytest
import torch

from diffusion.core.sampling import final_sample, reverse_steps
from diffusion.core.schedule import NoiseSchedule
from diffusion.errors import InvalidValue, WrongType
from diffusion.models import MLP, UNet

SCHEDULE = NoiseSchedule(num_timesteps=50)


def mlp(**arguments) -> MLP:
    return MLP(in_channels=2, hidden_dim=16, num_blocks=1, time_embed_dim=8, **arguments)


def sample(network, x_T: torch.Tensor, **arguments) -> torch.Tensor:
    return final_sample(reverse_steps(network, SCHEDULE, x_T, steps=2, **arguments))


@pytest.mark.parametrize(
    ("network", "learned_variance", "line"),
    [
        (mlp(), True, "the network outputs 2 features and x_T has 2: a network with learned variances outputs "
         "2 x 2 (the prediction, then v) — build it with out_channels 4 (or pass learned_variance=False: it "
         "outputs the prediction alone; a DiffusionModule: variance fixed)"),
        (mlp(out_channels=4), False,
         "the network outputs 4 features and x_T has 2 — build it with out_channels 2 (or pass "
         "learned_variance=True for 2 x 2; a DiffusionModule: variance learned_range)"),
        (mlp(out_channels=3), False, "the network outputs 3 features and x_T has 2 — build it with out_channels 2"),
        (mlp(out_channels=3), True, "the network outputs 3 features and x_T has 2: a network with learned "
         "variances outputs 2 x 2 (the prediction, then v) — build it with out_channels 4"),
    ],
    ids=["plain_mlp_learned", "mlp_4_plain", "mlp_3_plain", "mlp_3_learned"],
)  # fmt: skip
def test_a_vector_network_whose_outputs_do_not_fit_is_said_of_its_features(network, learned_variance, line):
    with pytest.raises(InvalidValue) as caught:
        sample(network, torch.randn(4, 2), learned_variance=learned_variance)
    assert str(caught.value) == line
    assert "output=" not in str(caught.value)


def test_an_image_network_whose_outputs_do_not_fit_is_said_of_its_channels():
    unet = UNet(in_channels=1, channels=8, channel_mult=(1,), attention_levels=(), num_res_blocks=1)
    with pytest.raises(InvalidValue, match=r"^the network outputs 1 channel and x_T has 1: a network with learned "
                       r"variances outputs 2 x 1 \(the prediction, then v\) — build it with out_channels 2"):  # fmt: skip
        sample(unet, torch.randn(2, 1, 8, 8), learned_variance=True)
    with pytest.raises(InvalidValue, match=r"^the network outputs 3 channels and x_T has 1 — build it with "
                       r"out_channels 1$"):  # fmt: skip
        sample(lambda x, t: x.repeat(1, 3, 1, 1), torch.randn(2, 1, 8, 8))


def test_any_network_returning_another_shape_or_no_tensor_is_said_so():
    with pytest.raises(InvalidValue, match=r"^the network outputs shape \(2, 1, 4, 8\) for x_t of shape "
                       r"\(2, 1, 8, 8\) — make model\(x_t, t\) return one prediction of x_t's shape per sample$"):  # fmt: skip
        sample(lambda x, t: x[:, :, :4], torch.randn(2, 1, 8, 8))
    with pytest.raises(InvalidValue, match=r"^the network returned a tuple, not a tensor of x_t's shape — make "
                       r"model\(x_t, t\) return the prediction itself"):  # fmt: skip
        sample(lambda x, t: (x,), torch.randn(2, 1, 8, 8))


def test_a_network_that_fits_samples_as_before():
    assert sample(mlp(out_channels=4), torch.randn(4, 2), learned_variance=True).shape == (4, 2)
    assert sample(mlp(), torch.randn(4, 2)).shape == (4, 2)


@pytest.mark.parametrize("name", ["learned_variance", "progress"])
@pytest.mark.parametrize("value", ["yes", 1, None])
def test_reverse_steps_switches_are_true_or_false(name, value):
    with pytest.raises(
        WrongType, match=rf"^{name}={value!r} is an? \w+, not True or False — pass {name}=True or "
    ):
        sample(mlp(), torch.randn(4, 2), **{name: value})
