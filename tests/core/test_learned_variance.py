"""Learned variances in the samplers (Nichol & Dhariwal 2021): DDPM over all T and respaced follows the paper's
rule for the respaced betas, checked against a float64 reference loop written here; DDIM and DPM-Solver ignore
the variance channels; guidance guides the prediction and keeps the conditional variance."""

import numpy as np
import pytest
import torch

from diffusion.core.guidance import NO_LABEL, guided_output
from diffusion.core.noise import PerSampleNoise, randn
from diffusion.core.samplers.spacing import uniform_timesteps
from diffusion.core.sampling import final_sample, reverse_steps
from diffusion.core.schedule import NoiseSchedule
from diffusion.core.variance import split_output


class Learned(torch.nn.Module):
    """An eps-prediction with a learned variance's v in [-1, 1], both depending on x and t."""

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        t = t.float().view(-1, *[1] * (x.ndim - 1))
        shift = 0 if y is None else 0.05 * (y.float() + 2).view(-1, *[1] * (x.ndim - 1))
        return torch.cat([0.1 * x + 0.001 * t + shift, torch.tanh(2 * x + t / 300 - 1 + shift)], dim=1)


class PredictionOnly(Learned):
    """The same network's first C channels: what a fixed-variance network with that prediction outputs."""

    def forward(self, x, t, y=None):
        return super().forward(x, t, y)[:, : x.shape[1]]


def reference_respaced_ddpm(
    x_T: np.ndarray, steps: int, noises: list[np.ndarray], T: int = 1000
) -> np.ndarray:
    """improved-diffusion's respacing rule in float64: the kept timesteps' abar define a new process with
    betas 1 - abar_i / abar_{i-1} and posterior variances from them; the network's v interpolates between
    the new log beta and log beta~ (Eq. 15); the last step adds no noise. x_0 is clipped to [-1, 1]."""
    betas = NoiseSchedule(num_timesteps=T).betas.double().numpy()
    abar_all = np.cumprod(1 - betas)
    kept = uniform_timesteps(T, steps).numpy()
    abar = abar_all[kept]
    abar_prev = np.append(1.0, abar[:-1])
    new_betas = 1 - abar / abar_prev
    posterior = new_betas * (1 - abar_prev) / (1 - abar)
    x, model = x_T, Learned()
    for i in reversed(range(len(kept))):
        t = torch.full((len(x),), int(kept[i]))
        output = model(torch.from_numpy(x).float(), t).double().numpy()
        eps, v = output[:, :1], output[:, 1:]
        x0 = np.clip((x - np.sqrt(1 - abar[i]) * eps) / np.sqrt(abar[i]), -1, 1)
        mean = (
            new_betas[i] * np.sqrt(abar_prev[i]) * x0 + (1 - abar_prev[i]) * np.sqrt(1 - new_betas[i]) * x
        ) / (1 - abar[i])
        if i == 0:
            return mean
        frac = (v + 1) / 2
        log_variance = frac * np.log(new_betas[i]) + (1 - frac) * np.log(posterior[i])
        x = mean + np.exp(0.5 * log_variance) * noises[len(kept) - 1 - i]
    raise AssertionError("unreachable")


@pytest.mark.parametrize("steps", [7, 1000])
def test_ddpm_with_learned_variance_follows_the_papers_rule_for_the_respaced_betas(steps):
    schedule = NoiseSchedule()
    shape = (3, 1, 4, 4)
    x_T = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    generator = PerSampleNoise(5, torch.arange(3))
    ours = final_sample(
        reverse_steps(Learned(), schedule, x_T, steps=steps, variance="learned_range", learned_variance=True,
                      generator=generator)
    )  # fmt: skip
    replay = PerSampleNoise(5, torch.arange(3))
    noises = [replay.randn(shape).double().numpy() for _ in range(steps - 1)]
    expected = reference_respaced_ddpm(x_T.double().numpy(), steps, noises)
    np.testing.assert_allclose(ours.double().numpy(), expected, rtol=0, atol=1e-5)
    if steps < 1000:  # the rule matters: the full process's beta_t at the kept t would sample elsewhere
        fixed = final_sample(
            reverse_steps(PredictionOnly(), schedule, x_T, steps=steps, variance="fixedlarge",
                          generator=PerSampleNoise(5, torch.arange(3)))
        )  # fmt: skip
        assert (fixed - ours).abs().max() > 0.05


@pytest.mark.parametrize(
    "options",
    [
        {"sampler": "ddim", "steps": 5, "eta": 0.5},
        {"sampler": "dpmpp_2m", "steps": 5},
        {"sampler": "dpmpp_2m_sde", "steps": 5},
        {"sampler": "ddpm", "steps": 5, "variance": "fixedlarge"},
        {"sampler": "ddpm", "steps": 5, "variance": "fixedsmall", "guidance_scale": 3.0},
    ],
)
def test_samplers_without_the_learned_variance_use_only_the_prediction(options):
    schedule = NoiseSchedule()
    x_T = torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, NO_LABEL, 2])

    def run(model, learned):
        return final_sample(reverse_steps(model, schedule, x_T, learned_variance=learned, labels=labels,
                                          generator=PerSampleNoise(2, torch.arange(4)), **options))  # fmt: skip

    torch.testing.assert_close(run(Learned(), True), run(PredictionOnly(), False), rtol=0, atol=0)


def test_guidance_guides_the_prediction_and_keeps_the_conditional_variance():
    model, x, t = Learned(), torch.randn(3, 1, 4, 4), torch.tensor([10, 500, 900])
    labels = torch.tensor([1, 2, 3])
    guided = guided_output(model, x, t, labels, 2.5, learned_variance=True)
    conditional, unconditional = model(x, t, labels), model(x, t, torch.full_like(labels, NO_LABEL))
    prediction, v = split_output(guided, True)
    torch.testing.assert_close(
        prediction, unconditional[:, :1] + 2.5 * (conditional[:, :1] - unconditional[:, :1])
    )
    torch.testing.assert_close(v, conditional[:, 1:])


def test_the_learned_variance_needs_a_network_that_learned_it():
    with pytest.raises(
        ValueError, match="variance='learned_range' needs a network that learned its variance"
    ):
        final_sample(reverse_steps(PredictionOnly(), NoiseSchedule(), torch.zeros(1, 1, 4, 4), steps=2,
                                   variance="learned_range"))  # fmt: skip
    with pytest.raises(ValueError, match="outputs 2C channels"):
        split_output(torch.zeros(2, 3, 4, 4), learned_variance=True)


def test_learned_noise_is_per_element_and_between_the_two_fixed_variances():
    """One respaced step from the same x_t and noise: v = -1 gives beta~'s step, v = +1 beta's, elementwise."""
    schedule = NoiseSchedule()
    x_t = randn((2, 1, 4, 4), PerSampleNoise(0, torch.arange(2)), torch.device("cpu"))

    class Constant(torch.nn.Module):
        def __init__(self, v: float) -> None:
            super().__init__()
            self.v = v

        def forward(self, x, t):
            return torch.cat([0.1 * x, torch.full_like(x, self.v)], dim=1)

    def first_step(model, learned, variance):
        steps = reverse_steps(model, schedule, x_t, steps=4, variance=variance, learned_variance=learned,
                              generator=PerSampleNoise(9, torch.arange(2)))  # fmt: skip
        return next(steps)[1]

    for v, variance in ((-1.0, "fixedsmall"), (1.0, "fixedlarge")):
        torch.testing.assert_close(
            first_step(Constant(v), True, "learned_range"),
            first_step(Constant(v), True, variance),
            atol=1e-6,
            rtol=0,
        )
