"""A batch of another dtype than the network's weights is refused naming both (tester 9b, R2): float64 (what
torch.from_numpy makes) or float16 into a float32 network failed in torch's words, "mat1 and mat2 must have the same
dtype". Autocast (16-mixed and bf16-mixed training and sampling) still runs."""

import pytest
import torch

from diffusion import MLP, NoiseSchedule, UNet, reverse_steps

UNET = dict(channels=8, channel_mult=[1, 2], num_res_blocks=1, attention_levels=[1])


def networks():
    torch.manual_seed(0)
    return [
        (UNet(**UNET), (2, 1, 8, 8)),
        (MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8), (2, 2)),
    ]


@pytest.mark.parametrize(
    ("dtype", "words"),
    [
        (
            torch.float64,
            "is a float64 tensor, not float32, the dtype of the {}'s weights — pass x.float() (torch.",
        ),
        (
            torch.float16,
            "is a float16 tensor, not float32, the dtype of the {}'s weights — pass x.float(), or ",
        ),
    ],
)
def test_a_batch_of_another_dtype_is_refused_naming_both(dtype, words):
    for network, shape in networks():
        with pytest.raises(TypeError) as refused:
            network(torch.randn(shape, dtype=dtype), torch.zeros(shape[0], dtype=torch.long))
        assert str(refused.value).startswith("x " + words.format(type(network).__name__))


def test_reverse_steps_names_float64_noise():
    unet = networks()[0][0]
    with pytest.raises(TypeError, match=r"^x_T is a float64 tensor, not float32, .* pass x_T.float\(\)"):
        reverse_steps(
            unet, NoiseSchedule(num_timesteps=10), torch.randn(2, 1, 8, 8, dtype=torch.float64), steps=2
        )


def test_a_network_of_the_batch_dtype_runs():
    for network, shape in networks():
        out = network.double()(
            torch.randn(shape, dtype=torch.float64), torch.zeros(shape[0], dtype=torch.long)
        )
        assert out.dtype == torch.float64


@pytest.mark.parametrize("batch_dtype", [torch.float32, torch.bfloat16])
def test_autocast_is_not_refused(batch_dtype):
    for network, shape in networks():
        x = torch.randn(shape).to(batch_dtype).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = network(x, torch.zeros(shape[0], dtype=torch.long))
        out.float().square().mean().backward()
        assert out.shape == shape and x.grad is not None
