"""The randomness of one training batch: the noise, the timesteps and the dropped labels.

Drawn either from the rank's torch.Generator (noise_mode "fast") or, with `generator=None` (noise_mode
"per_sample"), as a function of (noise seed, optimizer step, dataset index) through the counter-based noise of
`diffusion.core.noise`: a sample then gets the same draws whichever rank, batch or accumulation step it lands in,
which is what makes a run on N devices reproduce a run on one with accumulate_grad_batches=N.
"""

import torch

from diffusion.core import noise as counter_noise
from diffusion.core.guidance import NO_LABEL


def sample_seed(seed: int, step: int, index: int) -> int:
    """A 63-bit seed that depends only on (seed, step, index), for a generator of its own."""
    return ((seed * 1_000_003 + step) * 2_654_435_761 + index) % (2**63 - 1)


def noise_and_timesteps(
    x0: torch.Tensor, indices: torch.Tensor, step: int, num_timesteps: int, seed: int,
    generator: torch.Generator | None, offset_noise: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Noise like x0 and timesteps (B,) in [0, num_timesteps): from `generator`, or per sample without one.

    offset_noise: Guttenberg 2023's offset noise, noise + offset_noise z with one normal z per (sample, channel)
    for every pixel, so that the network also learns to change an image's mean brightness (images only).
    """
    if generator is None:  # drawn for the whole batch on its device
        indices = indices.to(x0.device)
        t_key = counter_noise.noise_key(seed, counter_noise.TRAINING_TIMESTEPS, step)
        t = counter_noise.randint(num_timesteps, t_key, indices)
        key = counter_noise.noise_key(seed, counter_noise.TRAINING_NOISE, step)
        noise = counter_noise.normal(x0.shape, key, indices, dtype=x0.dtype)
    else:
        t = torch.randint(num_timesteps, (x0.shape[0],), device=x0.device, generator=generator)
        noise = counter_noise.randn(x0.shape, generator, x0.device)
    if offset_noise:
        channels = x0.shape[:2]  # (B, C): a draw of its own, so the pixel noise stays what it is without it
        if generator is None:
            key = counter_noise.noise_key(seed, counter_noise.OFFSET_NOISE, step)
            offset = counter_noise.normal(channels, key, indices, dtype=x0.dtype)
        else:
            offset = counter_noise.randn(channels, generator, x0.device)
        noise = noise + offset_noise * offset.view(*channels, *[1] * (x0.ndim - 2))
    return noise, t


def drop_labels(
    labels: torch.Tensor, indices: torch.Tensor, step: int, probability: float, seed: int,
    generator: torch.Generator | None,
) -> torch.Tensor:  # fmt: skip
    """`labels` with each replaced by NO_LABEL with `probability`: from `generator`, or per sample without one."""
    if probability == 0:
        return labels
    if generator is None:
        key = counter_noise.noise_key(seed, counter_noise.LABEL_DROPOUT, step)
        bits = counter_noise.random_bits(key, indices.to(labels.device), 1)[:, 0]  # (B,) in [0, 2**32)
        uniform = (bits >> 8).float() * 2.0**-24  # [0, 1)
    else:
        uniform = torch.rand(labels.shape, device=labels.device, generator=generator)
    return torch.where(uniform < probability, NO_LABEL, labels)
