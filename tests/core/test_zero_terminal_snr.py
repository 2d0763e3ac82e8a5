"""Zero terminal SNR (Lin et al. 2024): the rescaled betas of their Algorithm 1, what the schedule gives at
alpha_bar_T = 0 (x_T is the noise itself: v- and x0-predictions are defined there, eps-prediction is not), the
refusals of eps-prediction in one line, and a v-prediction loss that stays finite at t = T - 1. The samplers at
alpha_bar_T = 0 are in tests/core/test_sampler_contract.py."""

import numpy as np
import pytest
import torch

from diffusion.core.sampling import reverse_steps
from diffusion.core.schedule import NoiseSchedule, make_betas
from diffusion.models import MLP
from diffusion.training.loss import diffusion_loss
from diffusion.training.module import DiffusionModule


def lin_et_al_algorithm_1(betas: np.ndarray) -> np.ndarray:
    """Lin et al. 2024, Algorithm 1, as printed (numpy, float64)."""
    alphas_bar_sqrt = np.sqrt(np.cumprod(1 - betas))
    alphas_bar_sqrt_0, alphas_bar_sqrt_T = alphas_bar_sqrt[0].copy(), alphas_bar_sqrt[-1].copy()
    alphas_bar_sqrt -= alphas_bar_sqrt_T
    alphas_bar_sqrt *= alphas_bar_sqrt_0 / (alphas_bar_sqrt_0 - alphas_bar_sqrt_T)
    alphas_bar = alphas_bar_sqrt**2
    alphas = np.concatenate([alphas_bar[:1], alphas_bar[1:] / alphas_bar[:-1]])
    return 1 - alphas


@pytest.mark.parametrize("beta_schedule", ["linear", "cosine", "sigmoid"])
def test_the_rescaled_betas_are_lin_et_al_algorithm_1_and_end_at_alpha_bar_0(beta_schedule):
    plain, rescaled = NoiseSchedule(beta_schedule), NoiseSchedule(beta_schedule, zero_terminal_snr=True)
    expected = lin_et_al_algorithm_1(make_betas(beta_schedule, 1000).numpy())
    np.testing.assert_allclose(rescaled.betas.numpy(), expected, rtol=1e-6)
    assert rescaled.alphas_cumprod[-1].item() == 0 and rescaled.betas[-1].item() == 1
    assert rescaled.alphas_cumprod[0].item() == pytest.approx(plain.alphas_cumprod[0].item(), rel=1e-6)
    assert (rescaled.alphas_cumprod.diff() < 0).all()  # the SNR still falls at every step
    # sqrt(abar) is the plain one's, shifted to end at 0 and scaled to start where it did: an affine map.
    ratio = (rescaled.sqrt_alphas_cumprod[:-1] - 0) / (
        plain.sqrt_alphas_cumprod[:-1] - plain.sqrt_alphas_cumprod[-1]
    )
    torch.testing.assert_close(ratio, ratio[:1].expand_as(ratio))
    assert not NoiseSchedule(beta_schedule).zero_terminal_snr and plain.alphas_cumprod[-1] > 0


@pytest.mark.parametrize("prediction_type", ["v", "x0"])
@pytest.mark.parametrize("clip_denoised", [False, True])
def test_at_alpha_bar_0_x_t_is_the_noise_and_v_or_x0_predictions_give_x0(prediction_type, clip_denoised):
    schedule = NoiseSchedule(zero_terminal_snr=True)
    generator = torch.Generator().manual_seed(0)
    x0, noise = torch.rand(3, 4, generator=generator) * 2 - 1, torch.randn(3, 4, generator=generator)
    t = torch.full((3,), 999)
    x_t = schedule.q_sample(x0, t, noise)
    torch.testing.assert_close(x_t, noise)  # pure noise: no trace of x_0
    target = schedule.training_target(prediction_type, x0, t, noise)
    predicted_x0, eps = schedule.split_prediction(prediction_type, x_t, t, target)
    torch.testing.assert_close(predicted_x0, x0)
    torch.testing.assert_close(eps, noise)
    if clip_denoised:  # the samplers' eps from a clipped x_0: at alpha_bar_T = 0 still x_T itself
        torch.testing.assert_close(schedule.predict_eps_from_x0(x_t, t, x0.clamp(-0.5, 0.5)), noise)


def test_eps_prediction_is_refused_in_one_line_at_zero_terminal_snr():
    schedule = NoiseSchedule("cosine", num_timesteps=10, zero_terminal_snr=True)
    model = MLP(in_channels=4, hidden_dim=8, num_blocks=1, time_embed_dim=8)
    with pytest.raises(ValueError, match=r"^eps-prediction is undefined at alpha_bar_T = 0 .* — train with"):
        reverse_steps(model, schedule, torch.zeros(2, 4), sampler="ddim", steps=2)
    with pytest.raises(ValueError, match=r"^zero_terminal_snr needs v- or x0-prediction: .* — pass"):
        DiffusionModule(model, sample_shape=(4,), zero_terminal_snr=True)
    module = DiffusionModule(model, sample_shape=(4,), zero_terminal_snr=True, prediction_type="v")
    assert module.schedule.alphas_cumprod[-1] == 0 and module.hparams.zero_terminal_snr


@pytest.mark.parametrize("loss_weighting", ["none", "min_snr"])
def test_the_v_loss_is_finite_at_t_T_minus_1(loss_weighting):
    schedule = NoiseSchedule(zero_terminal_snr=True)
    generator = torch.Generator().manual_seed(0)
    x0, noise = (
        torch.rand(4, 1, 4, 4, generator=generator) * 2 - 1,
        torch.randn(4, 1, 4, 4, generator=generator),
    )
    t = torch.tensor([0, 500, 998, 999])
    x_t = schedule.q_sample(x0, t, noise)
    output = torch.randn(4, 2, 4, 4, generator=generator)
    for variance, channels in (("fixed", 1), ("learned_range", 2)):
        loss = diffusion_loss(schedule, output[:, :channels], x0, x_t, t, noise, prediction_type="v",
                              loss_weighting=loss_weighting, variance=variance)  # fmt: skip
        assert loss.isfinite().all(), (variance, loss)
    # The v target at T - 1 is -x_0: the network learns the data's mean from pure noise.
    torch.testing.assert_close(schedule.training_target("v", x0, t, noise)[-1], -x0[-1])
