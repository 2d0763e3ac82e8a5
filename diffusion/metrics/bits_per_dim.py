"""Bits per dimension of a set of 8-bit images under a diffusion model: every term of the variational bound
(`diffusion.core.variational_bound.bound_terms`, T network evaluations per image) on one or many ranks.

Ranks split the images by the generation rule (`diffusion.generation.ranks.rank_indices`: rank r takes images
r, r + W, ...), and the noise of each image's x_t is a function of (seed, t, its position in the set), so any
number of ranks and any batch size give the same per-image bounds, gathered back in order (`gather_in_order`).
"""

import math
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from diffusion.core.guidance import guided_output
from diffusion.core.noise import WrongDtype
from diffusion.core.schedule import NoiseSchedule
from diffusion.core.variational_bound import ReverseProcess, bound_terms
from diffusion.errors import InvalidValue, OutOfRange, WrongType
from diffusion.generation.ranks import rank_indices

COLUMNS = ("prior", "decoder", "kl", "total")
"""What `image_bounds` returns per image, in bits/dim: L_T, L_0, L_1 + ... + L_{T-1}, and their sum."""


NEGATIVE_ROUNDING = 1e-6  # bits/dim: a term below 0 by more is no rounding of a term >= 0
BOUND_BATCH = 256  # images whose bound terms are evaluated at once (`python -m diffusion.evaluate --nll`)


def quantize_to_8_bits(images: torch.Tensor) -> torch.Tensor:
    """Images in model units [-1, 1] moved to the nearest of the 256 levels of 8-bit data, the values the
    discretized decoder gives probabilities to (data that is not 8-bit, such as the digits' 17 grey levels, is
    then evaluated as the 8-bit images it would be saved as)."""
    return ((images.clamp(-1, 1) + 1) * 127.5).round() / 127.5 - 1


@torch.no_grad()
def image_bounds(
    network: nn.Module,
    schedule: NoiseSchedule,
    process: ReverseProcess,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    seed: int = 0,
    batch_size: int = BOUND_BATCH,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = False,
) -> torch.Tensor:
    """This rank's equal share of the bounds of `images` (N, C, H, W) in model units on the 8-bit grid: a
    (ceil(N / W), 4) float64 tensor on the CPU, columns `COLUMNS`; pad rows beyond N repeat image i % N.

    labels: (N,) classes for a class-conditional network (the bound of p(x | y)); None: unconditional.
    """
    device = next(network.parameters()).device
    indices = rank_indices(len(images), rank, world_size, equal_shares=True)
    rows = []
    starts = range(0, len(indices), batch_size)
    for start in tqdm(starts, desc="batches", disable=not progress or len(starts) == 1):
        batch = indices[start : start + batch_size]
        x0 = images[batch % len(images)].to(device)
        batch_labels = None if labels is None else labels[batch % len(labels)].to(device)

        def model(
            x_t: torch.Tensor, t: torch.Tensor, batch_labels: torch.Tensor | None = batch_labels
        ) -> torch.Tensor:
            return guided_output(network, x_t, t, batch_labels)  # conditional, unguided: p(x | y)

        terms = bound_terms(model, schedule, process, x0, batch, seed=seed, progress=progress)
        prior, decoder, kl = terms.prior, terms.terms[:, 0], terms.terms[:, 1:].sum(1)
        rows.append(torch.stack([prior, decoder, kl, terms.total], dim=1).cpu())
    return torch.cat(rows)


@dataclass(frozen=True)
class BitsPerDim:
    """The mean bound over a set of images, in bits/dim, with its standard error over the images (NaN for one
    image: no spread to estimate it from)."""

    bits_per_dim: float
    standard_error: float
    prior: float
    decoder: float
    kl: float
    num_images: int

    @classmethod
    def of(cls, bounds: torch.Tensor) -> "BitsPerDim":
        """From every image's row of `image_bounds` (N, 4) of floats, N >= 1: refused (WrongType, OutOfRange) for
        anything else, which gave torch's IndexError or RuntimeError, or NaN for no images; rows holding NaN, a
        bound of no number (a network whose outputs were not finite), or infinity are refused too (InvalidValue),
        not averaged into a NaN or infinite bits/dim without a word, and so are negative values (each term is >= 0:
        rows of something else)."""
        fix = "pass the (N, 4) rows image_bounds returns, one per image, N >= 1"
        if not isinstance(bounds, torch.Tensor):
            raise WrongType("bounds", bounds, f"a tensor of shape (N, {len(COLUMNS)})", fix)
        if not bounds.is_floating_point():  # torch's mean() of integers failed naming no argument
            raise WrongDtype("bounds", bounds, "floating point (bits/dim)", f"{fix}, or bounds.double()")
        if bounds.ndim != 2 or bounds.shape[1] != len(COLUMNS) or len(bounds) == 0:
            requirement = f"of shape (N, {len(COLUMNS)}) with N >= 1, a row ({', '.join(COLUMNS)}) per image"
            raise OutOfRange("bounds", f"<shape {tuple(bounds.shape)}>", requirement, fix)
        rows = torch.isnan(bounds).any(1).nonzero().flatten().tolist()
        if rows:
            raise InvalidValue(
                f"bounds holds NaN in {len(rows)} of its {len(bounds)} rows (first row {rows[0]}), and a mean of "
                "NaN is no bits/dim: the network's outputs were not finite for those images",
                "evaluate finite weights: the checkpoint's other weights (ema or raw), or an earlier checkpoint",
            )
        rows = torch.isinf(bounds).any(1).nonzero().flatten().tolist()
        if rows:
            raise InvalidValue(
                f"bounds holds infinity in {len(rows)} of its {len(bounds)} rows (first row {rows[0]}),"
                " and their mean would be an infinite bits/dim:"
                " the model gave those images a probability of 0 (network outputs not finite, or extreme)",
                "evaluate finite weights: the checkpoint's other weights (ema or raw), or an earlier checkpoint",
            )
        # Every term is a KL divergence or -log of a probability: >= 0, but for float64 rounding
        low = float(bounds.min())
        if low < -NEGATIVE_ROUNDING:
            rows = (bounds < -NEGATIVE_ROUNDING).any(1).nonzero().flatten().tolist()
            raise InvalidValue(
                f"bounds holds negative values in {len(rows)} of its {len(bounds)} rows (first row {rows[0]},"
                f" lowest {low:.4g}), and every term of the bound is >= 0"
                " (a KL divergence, or -log of a probability)",
                fix,
            )
        mean = bounds.mean(0)
        error = bounds[:, 3].std().item() / math.sqrt(len(bounds)) if len(bounds) > 1 else math.nan
        return cls(mean[3].item(), error, mean[0].item(), mean[1].item(), mean[2].item(), len(bounds))
