"""Embeddings the networks share: sinusoidal timesteps (Vaswani et al. 2017, as used by Ho et al. 2020), class
labels with a "no label" row (classifier-free guidance), and Fourier features of vector coordinates."""

import math

import torch

from diffusion.core.guidance import NO_LABEL
from diffusion.errors import InvalidValue, OutOfRange


def sinusoidal_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Embed integer timesteps as ``[sin(t * f_0), ..., sin(t * f_{k-1}), cos(t * f_0), ..., cos(t * f_{k-1})]``.

    The frequencies ``f_i = max_period ** (-i / (k - 1))`` with ``k = dim // 2`` follow
    ``get_timestep_embedding`` in the original DDPM code (``diffusion_tf/nn.py``), so the
    first column has period 2*pi and the last has period ``2 * pi * max_period``.

    Args:
        t: timesteps, shape (B,), usually int64.
        dim: embedding width; an odd ``dim`` gets one zero column appended.
        max_period: the longest period, controls the lowest frequency.

    Returns:
        float32 tensor of shape (B, dim), whatever the autocast state: ``t`` can be as large as
        ~1000, and ``t * f`` in half precision would lose the fine frequencies.
    """
    if t.ndim != 1:
        raise ValueError(f"t must have shape (B,), got shape {tuple(t.shape)}")
    if dim < 2:
        raise OutOfRange("dim", dim, ">= 2")
    half = dim // 2
    # max(half - 1, 1) keeps dim in {2, 3} finite (the original divides by half - 1).
    exponent = -math.log(max_period) / max(half - 1, 1)
    freqs = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * exponent)  # (half,)
    args = t.to(torch.float32)[:, None] * freqs[None, :]  # (B, half)
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=1)  # (B, 2 * half)
    if dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1))  # (B, dim)
    return emb


class ClassEmbedding(torch.nn.Embedding):
    """A learned embedding of class labels 0..num_classes-1 plus one extra row for `NO_LABEL` (the last), added to
    the time embedding as in improved-diffusion (Nichol & Dhariwal 2021); the extra row is what classifier-free
    guidance (Ho & Salimans 2022) trains with dropped labels and samples as the unconditional model."""

    def __init__(self, num_classes: int, dim: int) -> None:
        if num_classes < 1:
            raise OutOfRange("num_classes", num_classes, ">= 1 (or None for an unconditional network)")
        super().__init__(num_classes + 1, dim)
        self.num_classes = num_classes

    def forward(self, y: torch.Tensor | None, batch_size: int | None = None) -> torch.Tensor:
        """y: (B,) int64 labels in 0..num_classes-1 or NO_LABEL (None: all NO_LABEL, B = batch_size) -> (B, dim)."""
        if y is None:
            # batch_size is given with y None.
            y = torch.full((batch_size,), NO_LABEL, dtype=torch.long, device=self.weight.device)  # type: ignore[arg-type]
        if y.ndim != 1 or y.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"class labels must be integers of shape (B,), got {y.dtype} {tuple(y.shape)}")
        # Values are checked where labels enter (check_batch, class_labels) and, on the CPU, by the networks'
        # forward (check_class_labels): here on a GPU it would cost a device sync per step.
        return super().forward(torch.where(y == NO_LABEL, self.num_classes, y))


def check_unconditional(y: torch.Tensor | None, network: str) -> None:
    if y is not None:
        raise InvalidValue(
            f"{network} got class labels but was built without num_classes: it is unconditional",
            "train with {LightningDataModule:--conditional} true for a class-conditional network",
        )


def fourier_features(x: torch.Tensor, num_frequencies: int) -> torch.Tensor:
    """Each coordinate with its sines and cosines at octave frequencies: (B, D) -> (B, D * (1 + 2K)).

    ``[x, sin(pi 2^k x), cos(pi 2^k x) for k = 0..K-1]``, the positional encoding of NeRF (Mildenhall et al.
    2020; Tancik et al. 2020 on why it helps): an MLP fed raw low-dimensional coordinates learns fine detail
    slowly (spectral bias), and the octaves give it periods from 2 down to 2^(2-K) data units.
    """
    if x.ndim != 2:
        raise ValueError(f"x must have shape (B, D), got shape {tuple(x.shape)}")
    if num_frequencies < 0:
        raise OutOfRange("num_frequencies", num_frequencies, ">= 0")
    if num_frequencies == 0:
        return x
    freqs = math.pi * 2.0 ** torch.arange(num_frequencies, device=x.device, dtype=torch.float32)  # (K,)
    args = (x.float()[:, :, None] * freqs).flatten(1)  # (B, D * K)
    return torch.cat([x.float(), torch.sin(args), torch.cos(args)], dim=1).to(x.dtype)
