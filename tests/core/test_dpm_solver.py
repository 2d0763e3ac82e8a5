"""DPM-Solver++(2M): its timestep grid, its update against an independent reference, its order of convergence
to the probability-flow ODE, and its selection wherever a sampler is chosen.

The toy problem has Gaussian data x_0 ~ N(mu, diag(s^2)), where everything is known in closed form: the
optimal eps / x0 / v predictions, and the probability-flow ODE's solution (the marginal at every t is
N(alpha mu, alpha^2 s^2 + sigma^2), and the ODE maps x_t to the point with the same z-score).
"""

import math

import numpy as np
import pytest
import torch

from diffusion.cli.sample import main as sample_main
from diffusion.core.noise import randn
from diffusion.core.samplers.spacing import half_log_snr, log_snr_timesteps, spaced_timesteps
from diffusion.core.sampling import SamplingOptions, final_sample, reverse_steps
from diffusion.core.schedule import NoiseSchedule
from diffusion.training.loading import load_checkpoint

MU = torch.tensor([0.5, -0.3, 0.0, 0.2], dtype=torch.float64)
STD = torch.tensor([0.3, 0.5, 0.1, 0.7], dtype=torch.float64)


def gaussian_x0(x: torch.Tensor, abar: torch.Tensor) -> torch.Tensor:
    """E[x_0 | x_t] for the Gaussian data, abar broadcastable against x (float64)."""
    variance = abar * STD**2 + (1 - abar)
    return MU + abar.sqrt() * STD**2 * (x - abar.sqrt() * MU) / variance


class GaussianOracle(torch.nn.Module):
    """The optimal network for the Gaussian data, in any parameterization."""

    def __init__(self, schedule: NoiseSchedule, prediction_type: str = "eps") -> None:
        super().__init__()
        self.alphas_cumprod = schedule.alphas_cumprod.double()
        self.prediction_type = prediction_type

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        abar = self.alphas_cumprod[t].view(-1, 1)
        x0 = gaussian_x0(x.double(), abar)
        eps = (x.double() - abar.sqrt() * x0) / (1 - abar).sqrt()
        v = abar.sqrt() * eps - (1 - abar).sqrt() * x0
        return {"eps": eps, "x0": x0, "v": v}[self.prediction_type]


def reference_dpmpp_2m(
    alphas_cumprod: np.ndarray, timesteps: list[int], x_T: np.ndarray, noises: list[np.ndarray] | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Lu et al. 2022 (DPM-Solver++), Algorithm 2, in numpy: (x, x0 used) after every step, from t_0 = timesteps[0]
    (the largest) to the last listed timestep, then one first-order step to sigma = 0 (which returns x0).

    x~_{t_i} = sigma_{t_i} / sigma_{t_{i-1}} x~_{t_{i-1}} - alpha_{t_i} (e^{-h_i} - 1) D_i, with
    D_1 = x0_{t_0} and D_i = (1 + 1/(2 r_i)) x0_{t_{i-1}} - 1/(2 r_i) x0_{t_{i-2}}, r_i = h_{i-1} / h_i.
    With `noises` (one per step but the last), the SDE variant with the same D:
    x~_{t_i} = sigma_{t_i} / sigma_{t_{i-1}} e^{-h_i} x~_{t_{i-1}} + alpha_{t_i} (1 - e^{-2 h_i}) D_i
               + sigma_{t_i} sqrt(1 - e^{-2 h_i}) z_i.
    """
    alpha = np.sqrt(alphas_cumprod)
    sigma = np.sqrt(1 - alphas_cumprod)
    lam = np.log(alpha) - np.log(sigma)
    x, history, h, out = x_T, [], [None], []
    for i in range(1, len(timesteps) + 1):
        s = timesteps[i - 1]
        history.append(gaussian_x0(torch.from_numpy(x), torch.tensor(alphas_cumprod[s])).numpy())
        if i == len(timesteps):  # to sigma = 0: e^{-h} = 0, alpha = 1
            x = history[-1]
        else:
            t = timesteps[i]
            h.append(lam[t] - lam[s])
            if i == 1:
                d = history[-1]
            else:
                r = h[i - 1] / h[i]
                d = (1 + 1 / (2 * r)) * history[-1] - 1 / (2 * r) * history[-2]
            if noises is None:
                x = sigma[t] / sigma[s] * x - alpha[t] * (np.exp(-h[i]) - 1) * d
            else:
                x = (
                    sigma[t] / sigma[s] * np.exp(-h[i]) * x
                    + alpha[t] * (1 - np.exp(-2 * h[i])) * d
                    + sigma[t] * np.sqrt(1 - np.exp(-2 * h[i])) * noises[i - 1]
                )
        out.append((x, history[-1]))
    return out


def ode_solution(schedule: NoiseSchedule, x_T: torch.Tensor) -> torch.Tensor:
    """The sampler's limit: the exact probability-flow ODE from t = T - 1 to t = 0, then E[x_0 | x_{t=0}]."""
    abar = schedule.alphas_cumprod.double()
    std = lambda t: (abar[t] * STD**2 + 1 - abar[t]).sqrt()  # noqa: E731
    x_at_0 = abar[0].sqrt() * MU + std(0) * (x_T - abar[-1].sqrt() * MU) / std(-1)
    return gaussian_x0(x_at_0, abar[0])


def x_T(n: int = 64) -> torch.Tensor:
    return torch.randn(n, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("beta_schedule", ["linear", "cosine"])
def test_log_snr_timesteps_are_distinct_even_in_lambda_and_cover_both_ends(beta_schedule):
    schedule = NoiseSchedule(beta_schedule)
    lambdas = half_log_snr(schedule.alphas_cumprod)
    timesteps = log_snr_timesteps(schedule.alphas_cumprod, 20)
    assert timesteps.dtype == torch.int64 and len(timesteps) == 20
    assert timesteps[0] == 0 and timesteps[-1] == 999 and (timesteps.diff() > 0).all()
    # Even in lambda from lambda(0) down to max(lambda(T-1), -5.1): every grid point but the last (always
    # T - 1) is the timestep nearest in lambda to its even target, so no neighbour is closer.
    targets = torch.linspace(lambdas[0].item(), max(lambdas[-1].item(), -5.1), 20, dtype=torch.float64)
    for t, target in zip(timesteps[:-1].tolist(), targets[:-1].tolist(), strict=True):
        neighbours = [n for n in (t - 1, t + 1) if 0 <= n < 1000]
        assert all(abs(lambdas[t] - target) <= abs(lambdas[n] - target) for n in neighbours)
    # Many steps: lambda moves faster near t = 0 than the grid, and the timesteps are pushed apart.
    for steps in (50, 200, 1000):
        many = log_snr_timesteps(schedule.alphas_cumprod, steps)
        assert len(many.unique()) == steps and many[0] == 0 and many[-1] == 999
    assert log_snr_timesteps(schedule.alphas_cumprod, 1).tolist() == [999]
    with pytest.raises(ValueError, match="steps=1001"):
        log_snr_timesteps(schedule.alphas_cumprod, 1001)


@pytest.mark.parametrize("prediction_type, spacing", [("eps", "log_snr"), ("x0", "log_snr"), ("v", "log_snr"),
                                                      ("eps", "karras")])  # fmt: skip
def test_dpmpp_2m_matches_a_reference_implementation_of_algorithm_2(prediction_type, spacing):
    schedule = NoiseSchedule()
    steps = 12
    timesteps = spaced_timesteps(spacing, schedule.alphas_cumprod, steps).flip(0).tolist()  # T-1 ... 0
    noise = x_T()
    expected = reference_dpmpp_2m(schedule.alphas_cumprod.double().numpy(), timesteps, noise.numpy())
    model = GaussianOracle(schedule, prediction_type)
    trajectory = list(
        reverse_steps(
            model, schedule, noise, sampler="dpmpp_2m", steps=steps, prediction_type=prediction_type,
            clip_denoised=False, spacing=spacing,
        )
    )  # fmt: skip
    assert [t for t, _, _ in trajectory] == timesteps
    for (t, x, x0), (reference_x, reference_x0) in zip(trajectory, expected, strict=True):
        # float32 network outputs: agreement to float32 precision, on values of order 1.
        np.testing.assert_allclose(x.numpy(), reference_x, atol=2e-5, err_msg=f"after the step from t={t}")
        # x0 from eps or v multiplies float32 rounding by up to 1 / sqrt(abar_t) (157 at t = T - 1).
        x0_tolerance = max(2e-5, 1e-6 / schedule.alphas_cumprod[t].item() ** 0.5)
        np.testing.assert_allclose(x0.numpy(), reference_x0, atol=x0_tolerance, err_msg=f"x0 at t={t}")
    # The last step returns the predicted x0 itself.
    torch.testing.assert_close(trajectory[-1][1], trajectory[-1][2])


@pytest.mark.parametrize("spacing", ["log_snr", "karras"])
def test_dpmpp_2m_sde_matches_the_reference_with_the_same_noise(spacing):
    schedule = NoiseSchedule()
    steps, noise = 12, x_T()
    timesteps = spaced_timesteps(spacing, schedule.alphas_cumprod, steps).flip(0).tolist()
    replay = torch.Generator().manual_seed(5)  # the draws the sampler will make, one per step but the last
    noises = [torch.randn(noise.shape, generator=replay).double().numpy() for _ in range(steps - 1)]
    expected = reference_dpmpp_2m(schedule.alphas_cumprod.double().numpy(), timesteps, noise.numpy(), noises)
    trajectory = reverse_steps(
        GaussianOracle(schedule), schedule, noise, sampler="dpmpp_2m_sde", steps=steps, clip_denoised=False,
        generator=torch.Generator().manual_seed(5), spacing=spacing,
    )  # fmt: skip
    for (t, x, _), (reference_x, _) in zip(trajectory, expected, strict=True):
        np.testing.assert_allclose(x.numpy(), reference_x, atol=2e-5, err_msg=f"after the step from t={t}")


def test_dpmpp_2m_sde_with_two_steps_is_ddim_with_eta_1_and_samples_the_data_distribution():
    schedule = NoiseSchedule()
    noise = x_T()
    runs = {
        sampler: list(reverse_steps(GaussianOracle(schedule), schedule, noise, sampler=sampler, steps=2, eta=1.0,
                                    generator=torch.Generator().manual_seed(3)))
        for sampler in ("ddim", "dpmpp_2m_sde")
    }  # fmt: skip
    for (t_a, x_a, _), (t_b, x_b, _) in zip(runs["ddim"], runs["dpmpp_2m_sde"], strict=True):
        assert t_a == t_b
        # Equal up to float32 rounding: DDIM's coefficients come from float64 cumulative log(1 - beta),
        # DPM-Solver's from the float32 alphas_cumprod (a wrong update is off by orders more).
        torch.testing.assert_close(x_a, x_b, rtol=1e-5, atol=1e-5)
    # With the optimal network, 50 steps of the SDE sampler draw the Gaussian data: mean and std per feature
    # within a few standard errors of 20,000 samples (0.5% for the std) plus the discretization error.
    draws = [
        final_sample(reverse_steps(GaussianOracle(schedule), schedule, x_T(20_000), sampler="dpmpp_2m_sde",
                                   steps=50, clip_denoised=False, generator=torch.Generator().manual_seed(seed)))
        for seed in (0, 1)
    ]  # fmt: skip
    samples = draws[0]
    assert (samples.mean(0) - MU).abs().max() < 4 * STD.max() / 20_000**0.5
    torch.testing.assert_close(samples.std(0), STD, rtol=0.03, atol=0)
    assert not torch.allclose(draws[0], draws[1])  # the same x_T, different noise: different samples


def test_dpmpp_2m_converges_to_the_probability_flow_ode_solution_at_second_order():
    schedule = NoiseSchedule()
    noise = x_T(256)
    target = ode_solution(schedule, noise)
    errors = {}
    for sampler in ("dpmpp_2m", "ddim"):
        for steps in (20, 40, 80):
            sample = final_sample(
                reverse_steps(GaussianOracle(schedule), schedule, noise, sampler=sampler, steps=steps,
                              clip_denoised=False)
            )  # fmt: skip
            errors[sampler, steps] = (sample - target).abs().max().item()
    # Doubling the steps divides a second-order method's error by about 4 (DDIM, first order: by 2).
    for steps in (20, 40):
        assert errors["dpmpp_2m", steps] / errors["dpmpp_2m", 2 * steps] > 3
        assert errors["ddim", steps] / errors["ddim", 2 * steps] < 2.5
    assert errors["dpmpp_2m", 80] < 5e-3
    assert errors["dpmpp_2m", 20] < errors["ddim", 80]  # 20 steps beat DDIM's 80 here


def test_dpmpp_2m_with_two_steps_is_ddim_with_two_steps():
    # Both visit t = T-1 and t = 0; DPM-Solver++'s first (warm-up) step is first order, i.e. a DDIM step.
    schedule = NoiseSchedule()
    noise = x_T()
    ddim = list(reverse_steps(GaussianOracle(schedule), schedule, noise, sampler="ddim", steps=2))
    dpm = list(reverse_steps(GaussianOracle(schedule), schedule, noise, sampler="dpmpp_2m", steps=2))
    for (t_a, x_a, _), (t_b, x_b, _) in zip(ddim, dpm, strict=True):
        assert t_a == t_b
        # DDIM's coefficients come from float64 log(1 - beta) sums, the solver's from the float32 abar
        # buffer: equal to float32 rounding.
        torch.testing.assert_close(x_a, x_b, rtol=1e-5, atol=1e-5)


def test_dpmpp_2m_defaults_to_20_steps_and_clips_x0():
    schedule = NoiseSchedule()

    class Wild(torch.nn.Module):  # predicts an x0 far outside the data range
        def forward(self, x, t):
            return 5 * torch.ones_like(x)

    trajectory = list(reverse_steps(Wild(), schedule, x_T(), sampler="dpmpp_2m", prediction_type="x0"))
    assert len(trajectory) == 20 and all(x0.max() == 1 for _, _, x0 in trajectory)
    assert trajectory[-1][1].max() == 1
    generator = torch.Generator().manual_seed(0)
    unclipped = final_sample(
        reverse_steps(Wild(), schedule, randn((3, 4), generator, torch.device("cpu")), generator=generator,
                      sampler="dpmpp_2m", steps=5, prediction_type="x0", clip_denoised=False)
    )  # fmt: skip
    assert math.isclose(unclipped.max().item(), 5, rel_tol=1e-5)


def test_dpmpp_2m_is_selectable_in_the_module_and_the_sample_cli(digits_checkpoint, tmp_path):
    module = load_checkpoint(digits_checkpoint, map_location="cpu")
    direct = module.sample(3, seed=7, options=SamplingOptions(sampler="dpmpp_2m", steps=4))
    assert direct.shape == (3, 1, 8, 8) and torch.isfinite(direct).all()
    path = sample_main(
        ["--ckpt", str(digits_checkpoint), "--out", str(tmp_path), "--num_samples", "3", "--seed", "7",
         "--sampler", "dpmpp_2m", "--steps", "4", "--device", "cpu"]
    )  # fmt: skip
    samples = np.load(path)["arr_0"]
    assert samples.shape == (3, 8, 8, 1) and samples.dtype == np.uint8
    # Deterministic given the per-sample seeds: the CLI's images are the module's samples, quantized.
    expected = ((direct.clamp(-1, 1) * 0.5 + 0.5) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    np.testing.assert_array_equal(samples, expected)
