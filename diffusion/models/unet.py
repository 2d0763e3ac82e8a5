"""The UNet of Ho et al. 2020 (``diffusion_tf/models/unet.py``, as ported in pesser/pytorch_diffusion).

Layer for layer the same network, so the CIFAR-10 configuration has the paper's 35.7M parameters.
Two generalisations: attention levels are given as indices into ``channel_mult`` instead of
resolutions (the network does not need to know the image size), and attention can be multi-head.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torch.utils.checkpoint import checkpoint

from diffusion.core.noise import check_network_dtype
from diffusion.errors import InvalidValue, OutOfRange
from diffusion.models.checks import (
    CLASSES,
    check_sample_shape,
    check_size_divisible,
    check_weights_fit_memory,
    fraction,
    optional_whole,
    whole,
    whole_numbers,
)
from diffusion.models.embedding import ClassEmbedding, sinusoidal_embedding
from diffusion.models.inputs import check_forward_inputs

MAX_GROUPS = 32


# einops.rearrange as one operation of a compiled graph, as einops itself registers it on torch 2.11 (the lent GPU
# machines'): newer torch has Dynamo trace einops' own Python instead (parsing the pattern, building its recipe) at
# every call, 0.15 s a call on a 2-core CPU, 40 calls in the CIFAR-10 UNet. AOTAutograd and Inductor still see the
# views and permutes inside, and AOTAutograd's compile cache knows einops.rearrange (a wrapper of ours would make
# it bypass the cache, and every warm compile trace the joint graph again). Process-wide, as einops' own
# `allow_ops_in_compiled_graph`.
torch.compiler.allow_in_graph(rearrange)


class GroupNorm(nn.GroupNorm):
    """nn.GroupNorm that keeps half-precision activations in their dtype under autocast.

    CUDA's autocast runs group_norm in float32: each norm would cast its (B, C, H, W) input up and, through the
    SiLU, the next convolution would cast it back down, two full copies of the activations per norm (17% of a
    bf16 training step on an H200) and a float32 copy kept for the backward. The normalization kernels
    accumulate the mean and variance in float32 whatever the input dtype, so a bf16 or fp16 input is normalized
    in its own dtype here, with the affine weights cast (C values each) instead of the activations. A float32
    input (32-bit training, sampling) takes nn.GroupNorm's path unchanged.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.float16, torch.bfloat16):
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            weight, bias = self.weight.to(x.dtype), self.bias.to(x.dtype)
            return F.group_norm(x, self.num_groups, weight, bias, self.eps)


def group_norm(channels: int, groups: int) -> GroupNorm:
    # eps=1e-6 as in the original code (tf.contrib.layers.group_norm).
    return GroupNorm(groups, channels, eps=1e-6)


class ResBlock(nn.Module):
    """Two 3x3 convs with the time embedding added in between; 1x1 skip when widths differ."""

    def __init__(self, in_ch: int, out_ch: int, temb_ch: int, groups: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = group_norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.temb_proj = nn.Linear(temb_ch, out_ch)
        self.norm2 = group_norm(out_ch, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()
        # The original's init_scale=0: each block starts as the identity.
        nn.init.zeros_(self.conv2.weight)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        # x: (B, in_ch, H, W), temb: (B, temb_ch)
        h = self.conv1(F.silu(self.norm1(x)))  # (B, out_ch, H, W)
        h = h + rearrange(self.temb_proj(F.silu(temb)), "b c -> b c 1 1")
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return self.skip(x) + h


class AttnBlock(nn.Module):
    """Self-attention over the H*W positions, with ``num_heads`` heads, and a residual add."""

    def __init__(self, channels: int, groups: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.norm = group_norm(channels, groups)
        # One 1x1 conv for q, k and v: the same parameters as the original's three NIN layers.
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)
        # The original's init_scale=0: the block starts as the identity.
        nn.init.zeros_(self.proj_out.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, _, height, width = x.shape  # (B, C, H, W)
        # The positions as a sequence with the channels last, and the 1x1 conv as the matmul it is (its own
        # weight, flattened to (3C, C)): q, k and v then have their last dimension at stride 1, which the fused
        # attention kernels need (flash, memory-efficient and cuDNN on CUDA, flash on a CPU). Sliced from the
        # conv's (B, 3C, H, W) output, the channels would sit at stride H*W and every call would fall back to
        # the math path, which builds the whole (H*W) x (H*W) score matrix. (The matmul copies its transposed
        # input once: C channels, where making the conv's output contiguous would copy 3C.)
        tokens = rearrange(self.norm(x), "b c h w -> b (h w) c")  # (B, H*W, C)
        qkv = F.linear(tokens, self.qkv.weight.flatten(1), self.qkv.bias)  # (B, H*W, 3C)
        q, k, v = rearrange(qkv, "b n (three g d) -> three b g n d", three=3, g=self.num_heads)
        # Scale 1/sqrt(C / heads); with one head this is the original's C ** -0.5.
        h = F.scaled_dot_product_attention(q, k, v)  # (B, heads, H*W, C/heads)
        # Contiguous: from the heads' layout h would be channels-last in memory, and so would proj_out's weight
        # gradient, against the parameter's own strides (DDP then copies it and warns, "Grad strides do not
        # match bucket view strides"). The copy measured no slower on a CPU.
        h = rearrange(h, "b g (h w) d -> b (g d) h w", h=height, w=width).contiguous()  # (B, C, H, W)
        return x + self.proj_out(h)


class Downsample(nn.Module):
    """3x3 conv with stride 2; padding right/bottom only, like TF's 'SAME' padding on even sizes."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # (B, C, H/2, W/2)


class Upsample(nn.Module):
    """Nearest-neighbour x2 followed by a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))  # (B, C, 2H, 2W)


class UNet(nn.Module):
    """Noise-prediction UNet for images: ``model(x, t)`` with x (B, C, H, W), returns (B, C_out, H, W).

    Level ``i`` of ``channel_mult`` works with ``channels * channel_mult[i]`` channels at resolution
    ``image_size / 2**i``. ``attention_levels`` are indices into ``channel_mult``: for 32x32
    CIFAR-10 with ``channel_mult=(1, 2, 2, 2)``, the paper's attention "at 16x16" is
    ``attention_levels=(1,)``. The middle block always has attention.

    The paper's CIFAR-10 model (35.7M parameters) is ``UNet(in_channels=3, channels=128,
    channel_mult=(1, 2, 2, 2), num_res_blocks=2, attention_levels=(1,), dropout=0.1)``.

    Args:
        in_channels: image channels C (1 for grey, 3 for RGB).
        channels: base width; GroupNorm uses ``min(32, channels)`` groups.
        channel_mult: width multiplier per resolution level; H and W must be divisible by
            ``2 ** (len(channel_mult) - 1)``.
        num_res_blocks: ResBlocks per level on the way down (one more on the way up).
        attention_levels: levels (indices into ``channel_mult``) with self-attention.
        dropout: dropout inside each ResBlock.
        num_heads: attention heads; must divide the width of every attention level.
        out_channels: output channels, ``in_channels`` when None.
        num_classes: classes of a class-conditional network (``model(x, t, y)``, see `ClassEmbedding`); None
            (default) builds the unconditional network, parameter for parameter.
        checkpoint_levels: levels (indices into ``channel_mult``; the middle block counts as the last level)
            whose blocks keep no activations for the backward while training, and recompute them there
            (activation checkpointing): less memory for more compute, the same gradients (dropout's random
            state is replayed). The high-resolution levels hold most of the activations.
    """

    def __init__(
        self,
        in_channels: int = 1,
        channels: int = 64,
        channel_mult: Sequence[int] = (1, 2, 2),
        num_res_blocks: int = 2,
        attention_levels: Sequence[int] = (1,),
        dropout: float = 0.0,
        num_heads: int = 1,
        out_channels: int | None = None,
        num_classes: int | None = None,
        checkpoint_levels: Sequence[int] = (),
    ) -> None:
        super().__init__()
        (in_channels, channels, channel_mult, num_res_blocks, attention_levels, dropout, num_heads,
         checkpoint_levels) = self._checked(
            in_channels, channels, channel_mult, num_res_blocks, attention_levels, dropout, num_heads,
            checkpoint_levels,
        )  # fmt: skip
        self.checkpoint_levels = frozenset(checkpoint_levels)
        self._validate(channels, channel_mult, attention_levels, num_heads)
        owner = type(self)
        # At least its middle's 2 residual blocks: four 3x3 convolutions of the widest level
        check_weights_fit_memory(
            owner, "channels", channels, 36 * (channels * max(channel_mult)) ** 2, "at least"
        )
        out_channels = in_channels if out_channels is None else whole(owner, "out_channels", out_channels, 1)
        num_classes = optional_whole(owner, "num_classes", num_classes, 1, CLASSES)
        self.in_channels = in_channels
        self.channels = channels
        self.num_levels = len(channel_mult)
        self.num_classes = num_classes
        groups = min(MAX_GROUPS, channels)
        temb_ch = 4 * channels

        self.time_embed = nn.Sequential(
            nn.Linear(channels, temb_ch),
            nn.SiLU(),
            nn.Linear(temb_ch, temb_ch),
        )
        self.conv_in = nn.Conv2d(in_channels, channels, 3, padding=1)

        # Down path. skip_chs records the width of every tensor pushed on the skip stack.
        self.down = nn.ModuleList()
        skip_chs = [channels]
        ch = channels
        for level, mult in enumerate(channel_mult):
            stage = nn.Module()
            stage.blocks = nn.ModuleList()
            stage.attns = nn.ModuleList()
            for _ in range(num_res_blocks):
                stage.blocks.append(ResBlock(ch, channels * mult, temb_ch, groups, dropout))
                ch = channels * mult
                stage.attns.append(
                    AttnBlock(ch, groups, num_heads) if level in attention_levels else nn.Identity()
                )
                skip_chs.append(ch)
            stage.downsample = Downsample(ch) if level != self.num_levels - 1 else nn.Identity()
            if level != self.num_levels - 1:
                skip_chs.append(ch)
            self.down.append(stage)

        self.mid_block1 = ResBlock(ch, ch, temb_ch, groups, dropout)
        self.mid_attn = AttnBlock(ch, groups, num_heads)
        self.mid_block2 = ResBlock(ch, ch, temb_ch, groups, dropout)

        # Up path, stored in forward order (deepest level first).
        self.up = nn.ModuleList()
        for level, mult in reversed(list(enumerate(channel_mult))):
            stage = nn.Module()
            stage.blocks = nn.ModuleList()
            stage.attns = nn.ModuleList()
            for _ in range(num_res_blocks + 1):
                stage.blocks.append(ResBlock(ch + skip_chs.pop(), channels * mult, temb_ch, groups, dropout))
                ch = channels * mult
                stage.attns.append(
                    AttnBlock(ch, groups, num_heads) if level in attention_levels else nn.Identity()
                )
            stage.upsample = Upsample(ch) if level != 0 else nn.Identity()
            self.up.append(stage)

        self.norm_out = group_norm(ch, groups)
        self.conv_out = nn.Conv2d(ch, out_channels, 3, padding=1)
        self._init_weights()
        if num_classes is not None:  # created last: an unconditional network draws its init exactly as before
            self.class_embed = ClassEmbedding(num_classes, temb_ch)

    def _checked(
        self,
        in_channels: Any,
        channels: Any,
        channel_mult: Any,
        num_res_blocks: Any,
        attention_levels: Any,
        dropout: Any,
        num_heads: Any,
        checkpoint_levels: Any,
    ) -> tuple[int, int, tuple[int, ...], int, tuple[int, ...], float, int, tuple[int, ...]]:
        """The arguments as the numbers they must be, each refused by its name (WrongType, OutOfRange) otherwise."""
        owner = type(self)
        channel_mult = whole_numbers(
            owner, "channel_mult", channel_mult, 1, "a non-empty list of positive ints", "[1, 2, 2]"
        )
        if not channel_mult:
            raise OutOfRange("channel_mult", [], "a non-empty list of positive ints", owner=owner)
        levels = f"whole numbers in 0..{len(channel_mult) - 1} (indices into channel_mult)"
        return (
            whole(owner, "in_channels", in_channels, 1),
            whole(owner, "channels", channels, 2),  # the time embedding is channels wide: a sine, a cosine
            channel_mult,
            whole(owner, "num_res_blocks", num_res_blocks, 0),
            self._levels("attention_levels", attention_levels, channel_mult, levels),
            fraction(owner, "dropout", dropout),
            whole(owner, "num_heads", num_heads, 1),
            self._levels("checkpoint_levels", checkpoint_levels, channel_mult, levels),
        )

    def _levels(
        self, name: str, levels: Any, channel_mult: tuple[int, ...], requirement: str
    ) -> tuple[int, ...]:
        checked = whole_numbers(type(self), name, levels, 0, requirement, "[1]", distinct=True)
        for level in checked:
            if not 0 <= level < len(channel_mult):
                raise InvalidValue(
                    f"{{--{name}}} {list(checked)}: level {level} is out of range (levels are indices into "
                    f"{{--channel_mult}} {list(channel_mult)})",
                    f"pass {{--{name}}} in 0..{len(channel_mult) - 1}",
                    type(self),
                )
        return checked

    def _validate(
        self, channels: int, channel_mult: tuple[int, ...], attention_levels: tuple[int, ...], num_heads: int
    ) -> None:
        groups = min(MAX_GROUPS, channels)
        for level, mult in enumerate(channel_mult):
            width = channels * mult
            if width % groups != 0:
                raise InvalidValue(
                    f"level {level} has {width} channels (channels={channels} x channel_mult[{level}]={mult}), "
                    f"not divisible by the {groups} GroupNorm groups",
                    f"use channels that is a multiple of {MAX_GROUPS} (or below {MAX_GROUPS})",
                )
        # Attention runs at the listed levels and always in the middle (the last level's width).
        for level in {*attention_levels, len(channel_mult) - 1}:
            width = channels * channel_mult[level]
            if width % num_heads != 0:
                raise InvalidValue(
                    f"{{--num_heads}} {num_heads} does not divide the {width} channels of attention level {level}",
                    f"pick a {{--num_heads}} that divides {{--channels}} ({channels})",
                    type(self),
                )

    def _init_weights(self) -> None:
        # The original initialises every dense/conv layer with variance_scaling(1, 'fan_avg', 'uniform'),
        # which is Xavier-uniform, and biases with zeros; layers with init_scale=0 stay zero.
        zero_init = (
            {self.conv_out}
            | {m.conv2 for m in self.modules() if isinstance(m, ResBlock)}
            | {m.proj_out for m in self.modules() if isinstance(m, AttnBlock)}
        )
        fused_qkv = {m.qkv for m in self.modules() if isinstance(m, AttnBlock)}
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                if module in zero_init:
                    nn.init.zeros_(module.weight)
                elif module in fused_qkv:
                    # The original has three C -> C layers (q, k, v); Xavier on the fused C -> 3C weight would
                    # use fan_out 3C and draw 1/sqrt(2) of their std, so each block of C rows gets its own.
                    for block in module.weight.chunk(3, dim=0):
                        nn.init.xavier_uniform_(block)
                else:
                    nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)  # type: ignore[arg-type]  # every layer here has a bias

    def check_input_shape(self, shape: Sequence[int]) -> None:
        """Raise InvalidValue unless one sample of `shape` (C, H, W) fits: C = in_channels, H and W divisible
        by 2**(levels - 1). Called by the CLI before training, and on every forward."""
        check_sample_shape(type(self), shape, "images", self.in_channels)
        check_size_divisible(type(self), shape, self.num_levels)

    def check_input_dtype(self, x: torch.Tensor, name: str = "x") -> None:
        """WrongDtype unless `x` is of the weights' dtype (or under autocast): `check_network_dtype`."""
        check_network_dtype(name, x, self.conv_in.weight.dtype, "UNet")

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, C, H, W) float, t: (B,) int64, y: (B,) int64 class labels (NO_LABEL or None: none; only
        with num_classes) -> predicted noise (B, C_out, H, W)."""
        check_forward_inputs(self, x, t, y, "images")
        temb = self.time_embed(sinusoidal_embedding(t, self.channels).to(x.dtype))  # (B, 4 * channels)
        if self.num_classes is not None:
            temb = temb + self.class_embed(y, len(x)).to(temb.dtype)

        hs = [self.conv_in(x)]  # skip stack, each (B, C_level, H_level, W_level)
        stage: Any  # a level's nn.Module: its blocks, attns and resampling, attributes set in __init__
        for level, stage in enumerate(self.down):
            for block, attn in zip(stage.blocks, stage.attns, strict=True):
                hs.append(self._run(level, _block_then_attention, block, attn, hs[-1], temb))
            if level != self.num_levels - 1:
                hs.append(stage.downsample(hs[-1]))

        h = self._run(self.num_levels - 1, self._middle, hs[-1], temb)

        for level, stage in zip(reversed(range(self.num_levels)), self.up, strict=True):
            for block, attn in zip(stage.blocks, stage.attns, strict=True):
                skip = torch.cat([h, hs.pop()], dim=1)  # (B, C_h + C_skip, ...) -> (B, C, ...) by the block
                h = self._run(level, _block_then_attention, block, attn, skip, temb)
            h = stage.upsample(h)

        return self.conv_out(F.silu(self.norm_out(h)))  # (B, C_out, H, W)

    def _middle(self, h: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        return self.mid_block2(self.mid_attn(self.mid_block1(h, temb)), temb)

    def _run(self, level: int, function: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
        """`function(*args)`, as a checkpointed segment when `level` is checkpointed and gradients are taken."""
        if level in self.checkpoint_levels and self.training and torch.is_grad_enabled():
            return checkpoint(function, *args, use_reentrant=False)
        return function(*args)


def _block_then_attention(
    block: ResBlock, attn: nn.Module, h: torch.Tensor, temb: torch.Tensor
) -> torch.Tensor:
    return attn(block(h, temb))
