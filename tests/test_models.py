"""Shape, initialisation, validation and gradient checks for the noise-prediction networks."""

import pytest
import torch

from diffusion.models import MLP, UNet, sinusoidal_embedding

# Small enough that every test here runs in well under a second on a laptop CPU.
TINY_UNET = {"channels": 16, "channel_mult": (1, 2), "num_res_blocks": 1, "attention_levels": (1,)}


def _timesteps(batch: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 1000, (batch,), generator=generator, dtype=torch.int64)


def _randomise_zero_layers(model: torch.nn.Module) -> None:
    """Give the zero-initialised layers random weights so that the output depends on the input."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1 and not p.any():
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))


# --- embedding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [2, 7, 32, 128])
def test_embedding_shape_and_dtype(dim: int) -> None:
    t = torch.tensor([0, 1, 500, 999], dtype=torch.int64)
    emb = sinusoidal_embedding(t, dim)
    assert emb.shape == (4, dim)
    assert emb.dtype == torch.float32
    if dim % 2 == 1:
        assert torch.all(emb[:, -1] == 0)


def test_embedding_t0_is_sin0_cos1() -> None:
    emb = sinusoidal_embedding(torch.zeros(3, dtype=torch.int64), 16)
    torch.testing.assert_close(emb[:, :8], torch.zeros(3, 8))
    torch.testing.assert_close(emb[:, 8:], torch.ones(3, 8))


def test_embedding_golden_values() -> None:
    # First frequency is 1, last is 1/max_period (the original code's log(10000) / (half - 1)).
    emb = sinusoidal_embedding(torch.tensor([1, 10]), 4)
    args = torch.tensor([[1.0, 1e-4], [10.0, 1e-3]])  # t * (1, 1e-4)
    expected = torch.cat([args.sin(), args.cos()], dim=1)
    torch.testing.assert_close(emb, expected)


def test_embedding_distinct_timesteps_give_distinct_rows() -> None:
    emb = sinusoidal_embedding(torch.arange(1000), 64)
    distances = torch.cdist(emb, emb)
    distances.fill_diagonal_(float("inf"))
    assert distances.min() > 1e-3


def test_embedding_is_float32_under_autocast() -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        emb = sinusoidal_embedding(torch.tensor([999]), 32)
    assert emb.dtype == torch.float32


# --- shapes and initialisation ---------------------------------------------------------------------


@pytest.mark.parametrize("in_channels", [2, 5])
def test_mlp_output_shape_and_zero_init(in_channels: int) -> None:
    torch.manual_seed(0)
    model = MLP(in_channels=in_channels, hidden_dim=32, num_blocks=2, time_embed_dim=16)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, in_channels, generator=generator)
    out = model(x, _timesteps(8, generator))
    assert out.shape == x.shape
    assert torch.all(out == 0)


@pytest.mark.parametrize(
    ("in_channels", "size", "config"),
    [
        (1, 16, {"channels": 32, "channel_mult": (1, 2, 2), "num_res_blocks": 1, "attention_levels": (1,)}),
        (1, 8, TINY_UNET),
        (3, 16, {**TINY_UNET, "num_heads": 2, "attention_levels": (0, 1)}),
    ],
)
def test_unet_output_shape_and_zero_init(in_channels: int, size: int, config: dict) -> None:
    torch.manual_seed(0)
    model = UNet(in_channels=in_channels, **config)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, in_channels, size, size, generator=generator)
    out = model(x, _timesteps(2, generator))
    assert out.shape == x.shape
    assert torch.all(out == 0)


def test_unet_fused_qkv_is_initialised_like_three_separate_layers() -> None:
    # The original's q, k and v are three C -> C layers, each Xavier-uniform: bound sqrt(6 / (C + C)).
    # Xavier on the fused C -> 3C weight would use fan_out 3C: bound sqrt(6 / 4C), 1/sqrt(2) too small.
    torch.manual_seed(0)
    model = UNet(channels=64, channel_mult=(1,), num_res_blocks=1, attention_levels=(0,))
    attention = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.out_channels == 192)
    channels = 64
    bound = (6 / (2 * channels)) ** 0.5
    for block in attention.weight.detach().chunk(3, dim=0):  # q, k, v: (C, C, 1, 1) each
        assert block.abs().max() <= bound
        assert block.abs().max() > 0.97 * bound  # 4,096 draws reach the bound's top 3%
        # Uniform(-b, b) has std b / sqrt(3) = sqrt(1 / C); 4,096 draws estimate it to about 1%.
        assert block.std().item() == pytest.approx(bound / 3**0.5, rel=0.05)
    assert not attention.bias.any()


def test_unet_out_channels() -> None:
    model = UNet(in_channels=3, out_channels=6, **TINY_UNET)
    assert model(torch.randn(1, 3, 8, 8), torch.tensor([3])).shape == (1, 6, 8, 8)


def test_unet_cifar10_parameter_count_matches_paper() -> None:
    # Ho et al. 2020 report 35.7M; the original code's CIFAR-10 model has exactly 35,746,307.
    with torch.device("meta"):
        model = UNet(
            in_channels=3,
            channels=128,
            channel_mult=(1, 2, 2, 2),
            num_res_blocks=2,
            attention_levels=(1,),
            dropout=0.1,
        )
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - 35_746_307) / 35_746_307 < 0.01
    assert count == 35_746_307


# --- validation ------------------------------------------------------------------------------------


def test_unet_rejects_attention_level_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"attention level 3 .*allowed 0\.\.2"):
        UNet(channels=32, channel_mult=(1, 2, 2), attention_levels=(3,))


def test_unet_rejects_channels_indivisible_by_groups() -> None:
    with pytest.raises(ValueError, match=r"48 channels.*32 GroupNorm groups"):
        UNet(channels=48)


def test_unet_rejects_heads_that_do_not_divide_channels() -> None:
    with pytest.raises(ValueError, match=r"num_heads=3"):
        UNet(channels=32, num_heads=3)


def test_unet_rejects_indivisible_image_size() -> None:
    model = UNet(channels=16, channel_mult=(1, 2, 2))
    with pytest.raises(ValueError, match=r"image size 10x10 .*divisible by 4"):
        model(torch.randn(1, 1, 10, 10), torch.tensor([0]))


# --- gradients and conditioning --------------------------------------------------------------------


def test_unet_gradient_reaches_every_parameter() -> None:
    torch.manual_seed(0)
    model = UNet(**TINY_UNET)
    _randomise_zero_layers(model)
    generator = torch.Generator().manual_seed(0)
    model(torch.randn(2, 1, 8, 8, generator=generator), _timesteps(2, generator)).square().mean().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert missing == []


def test_mlp_gradient_reaches_every_parameter() -> None:
    torch.manual_seed(0)
    model = MLP(hidden_dim=16, num_blocks=2, time_embed_dim=8)
    _randomise_zero_layers(model)
    generator = torch.Generator().manual_seed(0)
    model(torch.randn(4, 2, generator=generator), _timesteps(4, generator)).square().mean().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert missing == []


@pytest.mark.parametrize("make_model", [lambda: UNet(**TINY_UNET), lambda: MLP(hidden_dim=16, num_blocks=2)])
def test_output_depends_on_timestep(make_model) -> None:
    torch.manual_seed(0)
    model = make_model().eval()
    _randomise_zero_layers(model)
    shape = (1, 1, 8, 8) if isinstance(model, UNet) else (1, 2)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out_early = model(x, torch.tensor([10]))
        out_late = model(x, torch.tensor([900]))
    assert not torch.allclose(out_early, out_late)
