"""Shape, initialisation, validation and gradient checks for the noise-prediction networks."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch.nn.attention import SDPBackend, sdpa_kernel

from diffusion.models import MLP, UNet, sinusoidal_embedding
from diffusion.models.embedding import fourier_features
from diffusion.models.unet import AttnBlock

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


def test_fourier_features_values_and_shape() -> None:
    x = torch.tensor([[0.5, -0.25]])
    features = fourier_features(x, 2)  # [x, sin(pi 2^k x), cos(pi 2^k x)], k = 0, 1, per coordinate
    s, c = math.sin, math.cos
    expected = [0.5, -0.25, s(math.pi / 2), s(math.pi), s(-math.pi / 4), s(-math.pi / 2)]
    expected += [c(math.pi / 2), c(math.pi), c(-math.pi / 4), c(-math.pi / 2)]
    torch.testing.assert_close(features, torch.tensor([expected]))
    assert fourier_features(torch.randn(3, 16), 8).shape == (3, 16 * 17)
    assert torch.equal(fourier_features(x, 0), x)


def test_fourier_features_let_the_mlp_fit_fine_detail() -> None:
    """Why the vector recipe uses them: a square wave of period 1/8 on [-1, 1] in 150 Adam steps."""
    x = torch.linspace(-1, 1, 128)[:, None]
    target = torch.sign(torch.sin(16 * math.pi * x))
    t = torch.zeros(128, dtype=torch.long)
    errors = {}
    for frequencies in (0, 6):
        torch.manual_seed(0)
        model = MLP(
            in_channels=1, hidden_dim=32, num_blocks=2, time_embed_dim=8, fourier_frequencies=frequencies
        )
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(150):
            loss = (model(x, t) - target).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        errors[frequencies] = loss.item()
    assert errors[6] < 0.1 < 0.5 < errors[0]  # the raw MLP is still near the variance (1.0)


# --- shapes and initialisation ---------------------------------------------------------------------


@pytest.mark.parametrize("in_channels", [2, 5])
@pytest.mark.parametrize("fourier_frequencies", [0, 4])
def test_mlp_output_shape_and_zero_init(in_channels: int, fourier_frequencies: int) -> None:
    torch.manual_seed(0)
    model = MLP(
        in_channels=in_channels, hidden_dim=32, num_blocks=2, time_embed_dim=16,
        fourier_frequencies=fourier_frequencies,
    )  # fmt: skip
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


@pytest.mark.parametrize("frequencies", [-1, 25])
def test_mlp_rejects_bad_fourier_frequencies(frequencies: int) -> None:
    with pytest.raises(ValueError, match=rf"fourier_frequencies={frequencies} must be in \[0, 24\]"):
        MLP(fourier_frequencies=frequencies)


def test_unet_rejects_attention_level_out_of_range() -> None:
    with pytest.raises(
        ValueError, match=r"attention_levels \[3\]: level 3 is out of range .*attention_levels in 0\.\.2"
    ):
        UNet(channels=32, channel_mult=(1, 2, 2), attention_levels=(3,))


def test_unet_rejects_channels_indivisible_by_groups() -> None:
    with pytest.raises(ValueError, match=r"48 channels.*32 GroupNorm groups"):
        UNet(channels=48)


def test_unet_rejects_heads_that_do_not_divide_channels() -> None:
    with pytest.raises(ValueError, match=r"num_heads 3 does not divide the 64 channels"):
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


def test_unet_gradients_have_their_parameters_strides() -> None:
    # DDP's gradient layout contract: a gradient laid out otherwise is copied into its bucket every step, with a
    # "Grad strides do not match bucket view strides" warning (the attention's proj_out did, from the heads' layout).
    model = UNet(**TINY_UNET)
    model(torch.randn(2, 1, 8, 8), torch.tensor([3, 700])).square().mean().backward()
    mismatched = [name for name, p in model.named_parameters() if p.grad.stride() != p.stride()]
    assert mismatched == []


# --- attention layout ------------------------------------------------------------------------------


def _conv_layout_attention(block: AttnBlock, x: torch.Tensor) -> torch.Tensor:
    """The block computed from the 1x1 conv's (B, 3C, H, W) output, heads sliced from its channels (last
    dimension at stride H*W): the reference the sequence layout must reproduce."""
    _, _, height, width = x.shape
    qkv = block.qkv(block.norm(x))
    q, k, v = rearrange(qkv, "b (three g d) h w -> three b g (h w) d", three=3, g=block.num_heads)
    h = rearrange(F.scaled_dot_product_attention(q, k, v), "b g (h w) d -> b (g d) h w", h=height, w=width)
    return x + block.proj_out(h)


@pytest.mark.parametrize("num_heads", [1, 2])
def test_attention_hands_sdpa_a_contiguous_last_dimension_and_proj_out_a_contiguous_input(
    monkeypatch, num_heads: int
) -> None:
    """The fused kernels (flash, memory-efficient, cuDNN; flash on a CPU) need q, k and v at stride 1 in their
    last dimension; otherwise every call falls back to the math path and its full score matrix."""
    strides, proj_out_inputs = [], []
    sdpa = F.scaled_dot_product_attention

    def recording_sdpa(q, k, v, *args, **kwargs):
        strides.append([tensor.stride(-1) for tensor in (q, k, v)])
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording_sdpa)
    model = UNet(**{**TINY_UNET, "num_heads": num_heads, "attention_levels": (0, 1)})
    blocks = [block for block in model.modules() if isinstance(block, AttnBlock)]
    for block in blocks:
        block.proj_out.register_forward_pre_hook(lambda _, inputs: proj_out_inputs.append(inputs[0]))
    model(torch.randn(2, 1, 8, 8), torch.tensor([3, 700]))
    assert len(strides) == len(proj_out_inputs) == len(blocks) == 7  # 2 down, 1 in the middle, 4 up
    assert all(s == [1, 1, 1] for s in strides), strides
    assert all(h.is_contiguous() for h in proj_out_inputs)


def test_attention_runs_on_the_fused_cpu_kernel_with_the_outputs_of_the_conv_layout() -> None:
    """Restricted to the flash kernel (which refuses a last dimension at stride != 1), the block runs, forward
    and backward, and gives the conv layout's output (the math path's) to float rounding, with the same
    parameters: an older checkpoint's weights load unchanged."""
    torch.manual_seed(0)
    block = AttnBlock(32, groups=8, num_heads=2)
    _randomise_zero_layers(block)
    x = torch.randn(2, 32, 8, 8, requires_grad=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = block(x)
        out.square().mean().backward()
    with sdpa_kernel([SDPBackend.MATH]):
        reference = _conv_layout_attention(block, x)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
    assert (out - x).abs().max() > 0.1  # the attention does change its input
    assert [name for name, _ in block.named_parameters()] == [
        "norm.weight",
        "norm.bias",
        "qkv.weight",
        "qkv.bias",
        "proj_out.weight",
        "proj_out.bias",
    ]
    assert block.qkv.weight.shape == (96, 32, 1, 1) and block.proj_out.weight.shape == (32, 32, 1, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_attention_runs_on_a_fused_cuda_kernel(dtype: torch.dtype) -> None:
    """On CUDA the block runs, forward and backward, with SDPA limited to the flash and memory-efficient
    kernels (float32: memory-efficient; half precision: either), under autocast as --precision *-mixed runs."""
    torch.manual_seed(0)
    model = UNet(**{**TINY_UNET, "channels": 32, "num_heads": 2, "attention_levels": (0, 1)}).cuda()
    x, t = torch.randn(2, 1, 16, 16, device="cuda"), torch.tensor([3, 700], device="cuda")
    with (
        sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]),
        torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32),
    ):
        model(x, t).float().square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_mlp_gradient_reaches_every_parameter() -> None:
    torch.manual_seed(0)
    model = MLP(hidden_dim=16, num_blocks=2, time_embed_dim=8, fourier_frequencies=3)
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
