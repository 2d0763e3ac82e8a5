"""Sampling under autocast: `network_precision` runs the network under autocast (`--precision bf16-mixed` in the
sample CLI) while the sampler's arithmetic stays float32."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, cast

import lightning as L
import torch
from torch import nn

from diffusion.errors import WrongType, check_choice

# Lightning's names for the precisions sampling supports. "16-true"/"bf16-true" are not among them: they
# would cast the noise schedule's buffers to half precision (as training refuses them too).
Precision = Literal["32", "32-true", "16-mixed", "bf16-mixed"]


def autocast_dtype(precision: str, device: torch.device | str) -> torch.dtype | None:
    """The dtype the network computes in under `precision` (Lightning's names) on `device`; None for 32-bit.

    On a CPU, 16-mixed runs as bf16, as Lightning does for training (its fp16 AMP needs CUDA).
    """
    check_choice("precision", precision, Precision)
    if precision in ("32", "32-true"):
        return None
    if precision == "16-mixed" and torch.device(device).type == "cuda":
        return torch.float16
    return torch.bfloat16


class AutocastNetwork(nn.Module):
    """`network` with its forward under torch.autocast, handing the sampler float32 outputs."""

    def __init__(self, network: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.network, self.device_type, self.dtype = network, device_type, dtype

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=self.dtype):
            output = self.network(*args, **kwargs)
        return output.float()


def check_module(module: object) -> None:
    """Refuse (naming `module`) anything but a LightningModule holding a network: the network itself (the easy
    mistake: it is the network that runs under autocast), a path, None."""
    if isinstance(module, L.LightningModule) and isinstance(getattr(module, "network", None), nn.Module):
        return
    if isinstance(module, nn.Module):
        expected = "a LightningModule holding a network (a DiffusionModule)"
        fix = (
            "pass the module that holds the network (network_precision(module, ...), not module.network): it "
            "swaps the module's network for the block"
        )
    else:
        expected = "a model (a DiffusionModule)"
        fix = "pass a loaded model: diffusion.load_checkpoint(path)"
    raise WrongType("module", module, expected, fix)


@contextmanager
def network_precision(module: L.LightningModule, precision: str) -> Iterator[None]:
    """Within the block, `module`'s network runs under autocast for `precision` (see `autocast_dtype`).

    Only the network: the schedule's coefficients and the x_t updates of the reverse process stay float32
    (the small betas and the long chain of updates are what half precision would hurt). 32 changes nothing.
    """
    check_module(module)
    dtype = autocast_dtype(precision, module.device)
    if dtype is None:
        yield
        return
    network = cast(
        nn.Module, module.network
    )  # a DiffusionModule's network (nn.Module's __getattr__ says Tensor too)
    module.network = AutocastNetwork(network, module.device.type, dtype)
    try:
        yield
    finally:
        module.network = network
