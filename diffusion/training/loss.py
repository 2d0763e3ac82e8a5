"""The training objective, one value per sample (the module reduces and logs).

Fixed variances: Ho et al.'s simple loss, the MSE between the network's prediction (eps, x0 or v) and its
target, optionally weighted by min(SNR, gamma) (Hang et al. 2023, "Efficient Diffusion Training via Min-SNR
Weighting Strategy").

Learned variances (Nichol & Dhariwal 2021, Sec. 3.1): the hybrid loss L_hybrid = L_simple + lambda L_vlb with
lambda = 0.001, where L_vlb, the variational bound (Ho et al. Eq. 5), is estimated from each sample's uniform
timestep as T L_t (`diffusion.core.likelihood.bound_term`, in bits/dim, as the authors' code). The gradient of
L_vlb reaches only the variance channels: the mean is detached there, so L_simple alone trains the mean.
"""

from typing import Literal

import torch

from diffusion.core.likelihood import ReverseProcess, bound_term, model_posterior
from diffusion.core.schedule import NoiseSchedule, PredictionType
from diffusion.core.variance import split_output

LossWeighting = Literal["none", "min_snr"]
ModelVariance = Literal["fixed", "learned_range"]
VLB_WEIGHT = 0.001
"""lambda of L_hybrid (Nichol & Dhariwal 2021, Sec. 3.1)."""


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
) -> torch.Tensor:
    """The loss of each sample, (B,) float32, from the network `output` at x_t = q_sample(x0, t, noise)."""
    learned = variance == "learned_range"
    prediction, _ = split_output(output.float(), learned)
    target = schedule.training_target(prediction_type, x0, t, noise)
    loss = (prediction - target).pow(2).flatten(1).mean(dim=1)
    if loss_weighting == "min_snr":
        snr = schedule.snr(t)
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
