"""The UNet's dtype policy under mixed precision: each parameter is cast once per forward to the compute dtype
(and its gradient once back); activations are cast only at the network's edges, never around a norm.

CUDA's autocast runs group_norm in float32, so a plain nn.GroupNorm would cast every norm's input up and its
output back down (through the SiLU, at the next convolution). A CPU's autocast leaves group_norm alone, so these
tests put CUDA's rule back on the CPU (`CudaGroupNormRule`) and count the casts the dispatcher sees.
"""

import collections

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from diffusion.models import UNet
from diffusion.models.unet import GroupNorm


class CudaGroupNormRule(TorchFunctionMode):
    """group_norm under an active autocast runs in float32, as CUDA's autocast lists it (its input cast up)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.group_norm and torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                x, *rest = args
                return func(x.float(), *rest, **kwargs)
        return func(*args, **kwargs)


class CastCounter(TorchDispatchMode):
    """Counts dtype casts (aten._to_copy) and the elements they copy, forward and backward apart; in the
    forward, casts of parameters apart from casts of anything else (activations)."""

    def __init__(self, parameters) -> None:
        super().__init__()
        self.parameter_storage = {p.data_ptr() for p in parameters}
        self.phase = "forward"
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and args[0].dtype != out.dtype:
            what = "parameter" if args[0].data_ptr() in self.parameter_storage else "activation"
            self.counts[self.phase, what] += 1
            self.counts[self.phase, "elements"] += out.numel()
        return out


def casts_of_one_step(network: nn.Module) -> collections.Counter:
    torch.manual_seed(0)
    x, t = torch.randn(4, 1, 16, 16), torch.randint(0, 1000, (4,))
    with CudaGroupNormRule(), CastCounter(network.parameters()) as counter:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = network(x, t)
        loss = (out.float() - x).square().mean()
        counter.phase = "backward"
        loss.backward()
    return counter.counts


def tiny_unet() -> UNet:
    torch.manual_seed(0)
    return UNet(in_channels=1, channels=8, channel_mult=[1, 2], num_res_blocks=1, attention_levels=[1])


def test_each_parameter_is_cast_once_and_activations_only_at_the_edges():
    network = tiny_unet()
    norms = sum(isinstance(m, nn.GroupNorm) for m in network.modules())
    counts = casts_of_one_step(network)
    parameters = list(network.parameters())
    assert counts["forward", "parameter"] == len(parameters)  # autocast caches each weight's cast
    # The edges: x into the first convolution, the time embedding into its first Linear, t to float, the
    # output back to float32 in the loss. Never one per norm: there are 21 here.
    assert norms == 21 and counts["forward", "activation"] <= 4
    # The backward casts each parameter's gradient back to float32, and the edges' gradients: no more.
    edges = 2 * 4 * 16 * 16
    assert counts["backward", "elements"] <= sum(p.numel() for p in parameters) + edges


def test_a_float32_group_norm_would_cast_around_every_norm():
    # What the policy guards against, shown on the same network with nn.GroupNorm's own forward.
    network = tiny_unet()
    for module in network.modules():
        if isinstance(module, GroupNorm):
            module.forward = nn.GroupNorm.forward.__get__(module)
    counts = casts_of_one_step(network)
    assert counts["forward", "activation"] >= 2 * 21
    parameters = sum(p.numel() for p in network.parameters())
    assert counts["backward", "elements"] > parameters + 10 * 2 * 4 * 16 * 16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_group_norm_in_half_precision_matches_float32(dtype):
    torch.manual_seed(0)
    norm = GroupNorm(4, 16, eps=1e-6)
    nn.init.normal_(norm.weight, 1.0, 0.2)
    nn.init.normal_(norm.bias, 0.0, 0.2)
    x = torch.randn(3, 16, 8, 8) * 5 + 2  # statistics far from (0, 1): the float32 accumulation matters
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x.to(dtype))
    assert y.dtype == dtype
    expected = F.group_norm(x.to(dtype).float(), 4, norm.weight, norm.bias, 1e-6)
    torch.testing.assert_close(y.float(), expected, atol=4e-2, rtol=1e-2)
    # float32 inputs take nn.GroupNorm's path unchanged
    assert torch.equal(norm(x), F.group_norm(x, 4, norm.weight, norm.bias, 1e-6))
