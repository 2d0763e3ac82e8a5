"""The training objective of a batch, one value per sample (the module reduces and logs), and the random draws it
is taken at: each sample's noise, timestep and dropped label.

The draws come either from the rank's torch.Generator (noise_mode "fast") or, with `generator=None` (noise_mode
"per_sample"), as a function of (noise seed, optimizer step, dataset index) through the counter-based noise of
`diffusion.core.noise`: a sample then gets the same draws whichever rank, batch or accumulation step it lands in,
which is what makes a run on N devices reproduce a run on one with accumulate_grad_batches=N.

Fixed variances: Ho et al.'s simple loss, the MSE between the network's prediction (eps, x0 or v) and its
target, optionally weighted by min(SNR, gamma) (Hang et al. 2023, "Efficient Diffusion Training via Min-SNR
Weighting Strategy").

Learned variances (Nichol & Dhariwal 2021, Sec. 3.1): the hybrid loss L_hybrid = L_simple + lambda L_vlb with
lambda = 0.001, where L_vlb, the variational bound (Ho et al. Eq. 5), is estimated from each sample's uniform
timestep as T L_t (`diffusion.core.variational_bound.bound_term`, in bits/dim, as the authors' code). The
gradient of L_vlb reaches only the variance channels: the mean is detached there, so L_simple alone trains the
mean.

The network's output is checked as sampling checks it (`check_network_output`) where the caller asks: at a fit's
first step (a shape compare, no read), at each validation batch.
"""

from typing import Literal

import torch

from diffusion.core import noise as counter_noise
from diffusion.core.guidance import NO_LABEL, as_float
from diffusion.core.schedule import NoiseSchedule, PredictionType
from diffusion.core.variance import check_output_fits, split_output
from diffusion.core.variational_bound import ReverseProcess, bound_term, model_posterior

LossWeighting = Literal["none", "min_snr"]
ModelVariance = Literal["fixed", "learned_range"]
VLB_WEIGHT = 0.001
"""lambda of L_hybrid (Nichol & Dhariwal 2021, Sec. 3.1)."""


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


def check_network_output(output: object, x_t: torch.Tensor, learned_variance: bool) -> None:
    """The network's output at x_t, refused as sampling refuses it (`as_float`, `check_output_fits`: the same lines):
    a tuple, another size, or another channel count (a fixed variance's 2C trained on a loss broadcast against the
    samples, then could not sample). An odd count with learned variances is said by `split_output`, naming the
    option. Shapes only: no read from the device."""
    if not isinstance(output, torch.Tensor):
        as_float(output)  # its refusal
        return
    size = (
        output.ndim == x_t.ndim > 1 and output.shape[0] == x_t.shape[0] and output.shape[2:] == x_t.shape[2:]
    )
    if not (learned_variance and size and output.shape[1] % 2):
        check_output_fits(output, x_t, learned_variance)


def diffusion_loss(
    schedule: NoiseSchedule,
    output: torch.Tensor,
    x0: torch.Tensor,
    x_t: torch.Tensor,
    t: torch.Tensor,
    noise: torch.Tensor,
    *,
    prediction_type: PredictionType = "eps",
    loss_weighting: LossWeighting = "none",
    min_snr_gamma: float = 5.0,
    variance: ModelVariance = "fixed",
    check_output: bool = False,
) -> torch.Tensor:
    """The loss of each sample, (B,) float32, from the network `output` at x_t = q_sample(x0, t, noise); with
    `check_output`, `output` checked first (`check_network_output`)."""
    learned = variance == "learned_range"
    if check_output:
        check_network_output(output, x_t, learned)
    prediction, _ = split_output(output.float(), learned)
    target = schedule.training_target(prediction_type, x0, t, noise, check_range=False)  # t drawn in range
    loss = (prediction - target).pow(2).flatten(1).mean(dim=1)
    if loss_weighting == "min_snr":
        snr = schedule.snr(t, check_range=False)
        clipped = snr.clamp(max=min_snr_gamma)
        # Hang et al. 2023: weight min(SNR, gamma) on the x0 loss, expressed for each target.
        loss = loss * {"eps": clipped / snr, "x0": clipped, "v": clipped / (snr + 1)}[prediction_type]
    if learned:
        # The model's p(x_{t-1} | x_t) as the DDPM sampler forms it, unclipped (as the authors train it).
        process = ReverseProcess(prediction_type, "learned_range", learned_variance=True, clip_denoised=False)
        mean, log_variance = model_posterior(schedule, process, output.float(), x_t, t, detach_mean=True)
        vlb = schedule.num_timesteps * bound_term(schedule, x0, x_t, t, mean, log_variance)  # T L_t, bits/dim
        loss = loss + VLB_WEIGHT * vlb.float()
    return loss
