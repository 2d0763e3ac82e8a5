"""This project's UNet as diffusers' ``UNet2DModel`` and back: its arguments and its weights under diffusers' names
(export), and a ``UNet2DModel``'s config and weights as this UNet (`unet_arguments_from_diffusers`,
`unet_weights_from_diffusers`: pretrained diffusers models in).

Both are the UNet of Ho et al. 2020 (``diffusion_tf``), so an unconditional network maps layer for layer and
computes the same function: the sinusoidal time embedding with ``flip_sin_to_cos=False, freq_shift=1`` (sines
first, frequencies ``10000 ** (-i / (half - 1))``); ResBlocks norm-act-conv with the time embedding's projection
added after the first conv and a 1x1 shortcut when widths differ; single- or multi-head self-attention with
GroupNorm, 1/sqrt(head width) scale and a residual add; a stride-2 3x3 conv padded right and bottom
(``downsample_padding=0``); nearest x2 + 3x3 conv; ``num_res_blocks + 1`` ResBlocks per level on the way up
(``layers_per_block + 1``); GroupNorm eps 1e-6 everywhere.

What does not map is refused with `InvalidValue` (a UserError and a ValueError): class-conditional networks (a
``DDPMPipeline`` has no labels), outputs wider than the input (learned variances), ``num_res_blocks=0``,
``channel_mult[0] != 1`` (``UNet2DModel`` sizes ``conv_in`` and the time embedding by the first level's width,
this UNet by ``channels``), several attention heads at attention levels of different widths (``UNet2DModel`` has
one head width), and ``channels < 4`` (diffusers' embedding divides by ``half - 1``).

Plain dicts and tensors only: diffusers is not imported here (it is an optional dependency).
"""

import torch
from torch import nn

from diffusion.errors import InvalidValue
from diffusion.models.unet import MAX_GROUPS, AttnBlock, ResBlock, UNet

INSTEAD = "export with {command:--format} safetensors (this project's own format) instead"


def check_maps_to_diffusers(unet: nn.Module) -> None:
    """Raise InvalidValue (one line: why, and what to use instead) unless `unet` maps exactly to UNet2DModel."""
    if not isinstance(unet, UNet):
        raise InvalidValue(
            f"a {type(unet).__name__} network has no diffusers UNet2DModel counterpart (only the UNet has)",
            INSTEAD,
        )
    if unet.num_classes is not None:
        raise InvalidValue(
            "a class-conditional UNet does not map to diffusers' DDPMPipeline, which samples without labels",
            INSTEAD,
        )
    if unet.conv_out.out_channels != unet.in_channels:
        raise InvalidValue(
            f"the UNet outputs {unet.conv_out.out_channels} channels for {unet.in_channels} input channels "
            "(learned variances); diffusers' DDPMPipeline takes a prediction of the sample's shape",
            INSTEAD,
        )
    if unet.channels < 4:
        raise InvalidValue(f"channels={unet.channels} < 4 has no diffusers time embedding", INSTEAD)
    if not unet.down[0].blocks:
        raise InvalidValue(
            "num_res_blocks=0 does not map to UNet2DModel (it needs layers_per_block >= 1)", INSTEAD
        )
    if level_widths(unet)[0] != unet.channels:
        raise InvalidValue(
            "channel_mult[0] != 1 does not map to UNet2DModel (its input conv and time embedding take the "
            "first level's width, this UNet's take `channels`)",
            INSTEAD,
        )
    widths = {attn.proj_out.out_channels for attn in unet.modules() if isinstance(attn, AttnBlock)}
    if unet.mid_attn.num_heads > 1 and len(widths) > 1:
        raise InvalidValue(
            f"num_heads={unet.mid_attn.num_heads} at attention widths {sorted(widths)}: UNet2DModel gives every "
            "attention block the same head width",
            INSTEAD,
        )


def level_widths(unet: UNet) -> list[int]:
    """The width of every level, channels * channel_mult[level] (read off the up path, which always has blocks)."""
    return [stage.blocks[0].conv1.out_channels for stage in reversed(unet.up)]  # type: ignore[index, union-attr]


def diffusers_unet_config(unet: UNet, sample_shape: tuple[int, ...]) -> dict:
    """UNet2DModel's arguments for `unet` (checked with `check_maps_to_diffusers`) and samples of `sample_shape`
    (C, H, W)."""
    check_maps_to_diffusers(unet)
    widths = level_widths(unet)
    attention = [isinstance(stage.attns[0], AttnBlock) for stage in reversed(unet.up)]  # type: ignore[index]
    down = ["AttnDownBlock2D" if attn else "DownBlock2D" for attn in attention]
    heads = unet.mid_attn.num_heads
    height, width = sample_shape[-2:]
    return {
        "sample_size": height if height == width else [height, width],
        "in_channels": unet.in_channels,
        "out_channels": unet.conv_out.out_channels,
        "block_out_channels": widths,
        "layers_per_block": len(unet.down[0].blocks),  # type: ignore[arg-type]
        "down_block_types": down,
        "up_block_types": [block.replace("Down", "Up") for block in reversed(down)],
        "attention_head_dim": None if heads == 1 else unet.mid_attn.proj_out.out_channels // heads,
        "norm_num_groups": unet.norm_out.num_groups,
        "norm_eps": unet.norm_out.eps,
        "dropout": next((m.dropout.p for m in unet.modules() if isinstance(m, ResBlock)), 0.0),
        "flip_sin_to_cos": False,  # [sin, cos], as diffusion_tf's get_timestep_embedding
        "freq_shift": 1,  # frequencies 10000 ** (-i / (half - 1))
        "downsample_padding": 0,  # pad right and bottom, then a stride-2 3x3 conv
        "act_fn": "silu",
        "time_embedding_type": "positional",
    }


def _resblock(ours: str, theirs: str) -> dict[str, str]:
    names = {"norm1": "norm1", "conv1": "conv1", "temb_proj": "time_emb_proj", "norm2": "norm2",
             "conv2": "conv2", "skip": "conv_shortcut"}  # fmt: skip
    return {f"{ours}.{a}": f"{theirs}.{b}" for a, b in names.items()}


def _attention(ours: str, theirs: str) -> dict[str, str]:
    # qkv is split into to_q, to_k, to_v by `diffusers_unet_weights`.
    return {
        f"{ours}.norm": f"{theirs}.group_norm",
        f"{ours}.proj_out": f"{theirs}.to_out.0",
        f"{ours}.qkv": theirs,
    }


def _module_names(unet: UNet) -> dict[str, str]:
    """Each of our layers' name -> its UNet2DModel name."""
    names = {"time_embed.0": "time_embedding.linear_1", "time_embed.2": "time_embedding.linear_2",
             "conv_in": "conv_in", "norm_out": "conv_norm_out", "conv_out": "conv_out"}  # fmt: skip
    names |= _resblock("mid_block1", "mid_block.resnets.0") | _resblock("mid_block2", "mid_block.resnets.1")
    names |= _attention("mid_attn", "mid_block.attentions.0")
    # Both store the up path in forward order, deepest level first.
    for path, theirs in (("down", "down_blocks"), ("up", "up_blocks")):
        for level, stage in enumerate(getattr(unet, path)):
            for i, attn in enumerate(stage.attns):
                names |= _resblock(f"{path}.{level}.blocks.{i}", f"{theirs}.{level}.resnets.{i}")
                if isinstance(attn, AttnBlock):
                    names |= _attention(f"{path}.{level}.attns.{i}", f"{theirs}.{level}.attentions.{i}")
    # Down stage i < L-1 ends in a downsample; up stage i < L-1 (level L-1-i) in an upsample.
    for i in range(unet.num_levels - 1):
        names[f"down.{i}.downsample.conv"] = f"down_blocks.{i}.downsamplers.0.conv"
        names[f"up.{i}.upsample.conv"] = f"up_blocks.{i}.upsamplers.0.conv"
    return names


def diffusers_unet_weights(unet: UNet) -> dict[str, torch.Tensor]:
    """`unet`'s weights as a UNet2DModel state_dict (for `diffusers_unet_config(unet, ...)`): renamed, the fused
    1x1-conv qkv split into the three linear layers to_q, to_k, to_v, and 1x1 conv kernels as linear weights."""
    check_maps_to_diffusers(unet)
    names = _module_names(unet)
    attention = {f"{name}.{layer}" for name, m in unet.named_modules() if isinstance(m, AttnBlock)
                 for layer in ("qkv", "proj_out")}  # fmt: skip
    weights = {}
    for key, value in unet.state_dict().items():
        layer, kind = key.rsplit(".", 1)  # kind: weight or bias
        theirs = names[layer]
        if layer in attention:
            value = value.flatten(1) if kind == "weight" else value  # (C_out, C_in, 1, 1) -> (C_out, C_in)
        if layer.endswith(".qkv"):
            # Channels are [q | k | v], each [head 0 | head 1 | ...]: diffusers' to_q/to_k/to_v split heads the
            # same way.
            for part, chunk in zip(("to_q", "to_k", "to_v"), value.chunk(3, dim=0), strict=True):
                weights[f"{theirs}.{part}.{kind}"] = chunk.clone()
        else:
            weights[f"{theirs}.{kind}"] = value.clone()
    return weights


# ---- the other way: a UNet2DModel's config and weights as this project's UNet ----------------------------------
# UNet2DModel's defaults, for keys an older config.json leaves out.
DIFFUSERS_DEFAULTS = {
    "center_input_sample": False, "time_embedding_type": "positional", "time_embedding_dim": None,
    "freq_shift": 0, "flip_sin_to_cos": True, "mid_block_type": "UNetMidBlock2D", "mid_block_scale_factor": 1,
    "downsample_padding": 1, "downsample_type": "conv", "upsample_type": "conv", "dropout": 0.0, "act_fn": "silu",
    "attention_head_dim": 8, "norm_num_groups": 32, "attn_norm_num_groups": None, "norm_eps": 1e-5,
    "resnet_time_scale_shift": "default", "add_attention": True, "class_embed_type": None,
    "num_class_embeds": None, "layers_per_block": 2, "in_channels": 3, "out_channels": 3,
}  # fmt: skip
# What this UNet computes, as UNet2DModel settings: a config that differs in any of them computes something else.
SAME_FUNCTION = {
    "center_input_sample": False, "time_embedding_type": "positional", "freq_shift": 1, "flip_sin_to_cos": False,
    "mid_block_type": "UNetMidBlock2D", "mid_block_scale_factor": 1, "downsample_padding": 0,
    "downsample_type": "conv", "upsample_type": "conv", "act_fn": "silu", "attn_norm_num_groups": None,
    "norm_eps": 1e-6, "resnet_time_scale_shift": "default", "add_attention": True, "class_embed_type": None,
    "num_class_embeds": None,
}  # fmt: skip
LEVEL_BLOCKS = {"DownBlock2D": False, "AttnDownBlock2D": True}  # down block type -> has attention


def unet_arguments_from_diffusers(config: dict) -> dict:
    """This UNet's arguments for a UNet2DModel config (its config.json), or InvalidValue naming what differs."""
    config = {**DIFFUSERS_DEFAULTS, **{k: v for k, v in config.items() if not k.startswith("_")}}
    for key, ours in SAME_FUNCTION.items():
        if config[key] != ours:
            raise InvalidValue(
                f"a UNet2DModel with {key}={config[key]!r} does not map to this project's UNet (it computes "
                f"{key}={ours!r})", "use a model with Ho et al.'s UNet layout, e.g. google/ddpm-cifar10-32",
            )  # fmt: skip
    widths = list(config["block_out_channels"])
    channels = widths[0]
    down = list(config["down_block_types"])
    if len(down) != len(widths) or any(block not in LEVEL_BLOCKS for block in down):
        raise InvalidValue(f"down_block_types {down} do not map (each must be one of {sorted(LEVEL_BLOCKS)})",
                        "use a model whose levels are DownBlock2D or AttnDownBlock2D")  # fmt: skip
    up = [block.replace("Down", "Up") for block in reversed(down)]
    if list(config["up_block_types"]) != up:
        raise InvalidValue(f"up_block_types {config['up_block_types']} do not mirror down_block_types ({up})",
                        "use a model whose up path mirrors its down path")  # fmt: skip
    if any(width % channels for width in widths):
        raise InvalidValue(f"block_out_channels {widths} are not multiples of the first level's width",
                        "use a model whose level widths are multiples of block_out_channels[0]")  # fmt: skip
    if config["norm_num_groups"] != min(MAX_GROUPS, channels):
        raise InvalidValue(f"norm_num_groups={config['norm_num_groups']} is not min(32, block_out_channels[0])",
                        "use a model with this project's GroupNorm groups")  # fmt: skip
    if config["time_embedding_dim"] not in (None, 4 * channels):
        raise InvalidValue(f"time_embedding_dim={config['time_embedding_dim']} is not 4 x block_out_channels[0]",
                        "use a model with the default time embedding")  # fmt: skip
    attention_levels = [level for level, block in enumerate(down) if LEVEL_BLOCKS[block]]
    head_dim = config["attention_head_dim"]
    attention_widths = {widths[level] for level in [*attention_levels, len(widths) - 1]}
    heads = {1 if head_dim is None else width // head_dim for width in attention_widths}
    if len(heads) > 1 or (head_dim is not None and any(width % head_dim for width in attention_widths)):
        raise InvalidValue(f"attention_head_dim={head_dim} at attention widths {sorted(attention_widths)} gives "
                        "no one head count", "use a model with one head count at every attention level")  # fmt: skip
    return {
        "in_channels": config["in_channels"], "out_channels": config["out_channels"], "channels": channels,
        "channel_mult": [width // channels for width in widths], "num_res_blocks": config["layers_per_block"],
        "attention_levels": attention_levels, "dropout": float(config["dropout"]), "num_heads": heads.pop(),
    }  # fmt: skip


# Names older diffusers versions saved attention layers under (google/ddpm-cifar10-32's), and the current ones.
OLD_ATTENTION_NAMES = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}


def unet_weights_from_diffusers(unet: UNet, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A UNet2DModel state_dict as `unet`'s (built from `unet_arguments_from_diffusers`): renamed, to_q/to_k/to_v
    joined into the fused qkv 1x1 conv, linear attention weights as 1x1 conv kernels. Raises InvalidValue when a
    weight is missing or left over."""
    state = dict(state)
    for key in list(state):
        layer, _, kind = key.rpartition(".")
        prefix, _, last = layer.rpartition(".")
        if last in OLD_ATTENTION_NAMES:
            state[f"{prefix}.{OLD_ATTENTION_NAMES[last]}.{kind}"] = state.pop(key)
    names = _module_names(unet)
    weights = {}
    for key, ours in unet.state_dict().items():
        layer, kind = key.rsplit(".", 1)
        theirs = names[layer]
        try:
            if layer.endswith(".qkv"):
                value = torch.cat([state.pop(f"{theirs}.{part}.{kind}") for part in ("to_q", "to_k", "to_v")])
            else:
                value = state.pop(f"{theirs}.{kind}")
        except KeyError as err:
            raise InvalidValue(f"its UNet2DModel weights have no {err.args[0]}",
                            "pass the weights saved with this config.json") from err  # fmt: skip
        # A linear layer's (C_out, C_in) as a (C_out, C_in, 1, 1) conv kernel; any other change of shape is a weight
        # that does not belong to this config.json.
        if value.shape != ours.shape and tuple(value.shape) + (1,) * (ours.ndim - value.ndim) != ours.shape:
            raise InvalidValue(
                f"its weight {theirs}.{kind} has shape {list(value.shape)}, and its config.json asks for "
                f"{list(ours.shape)}", "pass the weights saved with this config.json (copy the folder again, whole)",
            )  # fmt: skip
        weights[key] = value.reshape(ours.shape)
    if state:
        raise InvalidValue(f"its UNet2DModel weights hold {len(state)} that this UNet has no place for, e.g. "
                        f"{sorted(state)[0]}", "use a model whose config maps (see docs/export.md)")  # fmt: skip
    return weights
