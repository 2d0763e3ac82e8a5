"""Golden values for the schedules, the posterior and full reverse loops; oracle-network checks."""

import math

import pytest
import torch

from diffusion.core.noise import randn
from diffusion.core.samplers.spacing import uniform_timesteps
from diffusion.core.sampling import final_sample, reverse_steps
from diffusion.core.schedule import NoiseSchedule, make_betas


def sample(model, schedule, shape, generator, **options) -> torch.Tensor:
    """x_0 from noise x_T drawn from `generator` (one generator, or one per sample)."""
    x_T = randn(shape, generator, torch.device("cpu"))
    return final_sample(reverse_steps(model, schedule, x_T, generator=generator, **options))


class Dummy(torch.nn.Module):
    """A fixed, cheap 'network' so reverse loops are deterministic and checkable."""

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return 0.1 * x + 0.001 * t.float().view(-1, *[1] * (x.ndim - 1))


def test_linear_schedule_golden_values():
    schedule = NoiseSchedule()  # Ho et al.: linear 1e-4 .. 0.02, T = 1000
    expected = {0: 0.9999, 1: 0.9999 * (1 - (1e-4 + (0.02 - 1e-4) / 999)), 499: 0.0785872, 999: 4.03583e-05}
    for t, value in expected.items():
        assert schedule.alphas_cumprod[t].item() == pytest.approx(value, rel=1e-5)
    assert schedule.betas[0].item() == pytest.approx(1e-4) and schedule.betas[-1].item() == pytest.approx(
        0.02
    )
    assert all(buffer.dtype == torch.float32 for buffer in schedule.buffers())


def test_linear_betas_are_scaled_by_1000_over_T_so_x_T_stays_near_pure_noise():
    # improved-diffusion's get_named_beta_schedule("linear"): beta_start and beta_end are scaled by 1000 / T.
    short = NoiseSchedule(num_timesteps=100)
    torch.testing.assert_close(short.betas, torch.linspace(1e-3, 0.2, 100))
    # alphas_cumprod at T: 2.0e-5 for T = 100 and 4.0e-5 for T = 1000 (unscaled, T = 100 would end at 0.36).
    full = NoiseSchedule()
    assert short.alphas_cumprod[-1].log().item() == pytest.approx(
        full.alphas_cumprod[-1].log().item(), rel=0.1
    )
    assert short.alphas_cumprod[49].item() == pytest.approx(full.alphas_cumprod[499].item(), rel=0.2)
    # Where the scaling would reach 1 (T = 20: beta_end 0.02 * 50 = 1) the schedule is refused, not clipped.
    assert NoiseSchedule(num_timesteps=21).betas[-1].item() == pytest.approx(0.02 * 1000 / 21)


def test_cosine_and_sigmoid_golden_values():
    cosine = NoiseSchedule("cosine")
    s = 0.008
    f = lambda t: math.cos((t / 1000 + s) / (1 + s) * math.pi / 2) ** 2  # noqa: E731
    assert cosine.alphas_cumprod[499].item() == pytest.approx(f(500) / f(0), rel=1e-5)
    assert cosine.betas.max().item() == pytest.approx(0.999)  # clipped as in Nichol & Dhariwal
    sigmoid = NoiseSchedule("sigmoid")
    assert sigmoid.alphas_cumprod[499].item() == pytest.approx(0.5, abs=1e-6)  # symmetric around T/2
    # Schedules differ where it matters: the cosine keeps more signal mid-way than the linear one.
    assert cosine.alphas_cumprod[499] > NoiseSchedule().alphas_cumprod[499]


def test_bad_schedule_options_are_rejected_with_the_allowed_values():
    with pytest.raises(ValueError, match=r"beta_schedule='quadratic'.*'linear', 'cosine', 'sigmoid'"):
        make_betas("quadratic", 1000)
    with pytest.raises(ValueError, match="num_timesteps=0"):
        NoiseSchedule(num_timesteps=0)
    with pytest.raises(ValueError, match=r"beta_end=0.0001 must be in \(beta_start, 1\)"):
        NoiseSchedule(beta_start=0.02, beta_end=1e-4)


def test_q_sample_matches_closed_form_and_posterior_matches_eq_7():
    schedule = NoiseSchedule()
    x0, noise = torch.tensor([[0.5, -0.25]]), torch.tensor([[1.0, 2.0]])
    t = torch.tensor([10])
    betas = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
    abar = torch.cumprod(1 - betas, 0)
    expected_xt = abar[10].sqrt() * x0.double() + (1 - abar[10]).sqrt() * noise.double()
    torch.testing.assert_close(schedule.q_sample(x0, t, noise).double(), expected_xt, rtol=1e-6, atol=1e-7)

    x_t = torch.tensor([[0.1, 0.2]])
    mean, variance, beta = schedule.q_posterior(x0, x_t, t)
    coef1 = betas[10] * abar[9].sqrt() / (1 - abar[10])
    coef2 = (1 - abar[9]) * (1 - betas[10]).sqrt() / (1 - abar[10])
    torch.testing.assert_close(
        mean.double(), coef1 * x0.double() + coef2 * x_t.double(), rtol=1e-6, atol=1e-7
    )
    expected_variance = betas[10] * (1 - abar[9]) / (1 - abar[10])
    assert variance.item() == pytest.approx(expected_variance.item(), rel=1e-5)
    assert beta.item() == pytest.approx(betas[10].item(), rel=1e-4)
    # Golden numbers, so a silent change of convention is caught too.
    torch.testing.assert_close(mean, torch.tensor([[0.15451114, 0.13867496]]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("prediction_type", ["eps", "x0", "v"])
def test_prediction_round_trip(prediction_type):
    schedule = NoiseSchedule("cosine")
    generator = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(4, 3, generator=generator), torch.randn(4, 3, generator=generator)
    # Not t = 999: there abar ~ 2e-9 and x0 from eps amplifies float32 rounding by 1/sqrt(abar) ~ 2e4.
    t = torch.tensor([0, 10, 500, 900])
    x_t = schedule.q_sample(x0, t, noise)
    target = schedule.training_target(prediction_type, x0, t, noise)
    x0_hat, eps_hat = schedule.split_prediction(prediction_type, x_t, t, target)
    torch.testing.assert_close(x0_hat, x0, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(eps_hat[1:], noise[1:], atol=2e-3, rtol=1e-3)  # eps is ill-posed at t=0 for x0


def reference_algorithm_2(model, schedule, x_T, generator):
    """Ho et al. 2020 Algorithm 2 written out independently, sigma_t^2 = beta_t, clipped x_0 via Eq. (7)."""
    betas = schedule.betas.double()
    abar = torch.cumprod(1 - betas, 0)
    abar_prev = torch.cat([torch.ones(1, dtype=torch.float64), abar[:-1]])
    x = x_T.double()
    for t in reversed(range(len(betas))):
        eps = model(x.float(), torch.full((x.shape[0],), t)).double()
        x0 = ((x - (1 - abar[t]).sqrt() * eps) / abar[t].sqrt()).clamp(-1, 1)
        mean = (betas[t] * abar_prev[t].sqrt() / (1 - abar[t])) * x0 + (
            (1 - abar_prev[t]) * (1 - betas[t]).sqrt() / (1 - abar[t])
        ) * x
        z = torch.randn(x.shape, generator=generator).double() if t > 0 else 0
        x = mean + betas[t].sqrt() * z
    return x.float()


def test_full_ddpm_loop_matches_algorithm_2_and_golden_values():
    schedule = NoiseSchedule(num_timesteps=50)
    ours = sample(Dummy(), schedule, (2, 3), torch.Generator().manual_seed(0), sampler="ddpm")
    generator = torch.Generator().manual_seed(0)
    x_T = torch.randn(2, 3, generator=generator)
    torch.testing.assert_close(
        ours, reference_algorithm_2(Dummy(), schedule, x_T, generator), atol=1e-5, rtol=1e-5
    )
    golden = torch.tensor([[0.76912665, 0.94134015, 0.90016246], [0.74366009, -1.0, -1.0]])
    torch.testing.assert_close(ours, golden, atol=1e-5, rtol=1e-5)


def test_ddim_golden_values_and_determinism():
    schedule = NoiseSchedule(num_timesteps=50)
    first = sample(Dummy(), schedule, (2, 3), torch.Generator().manual_seed(0), sampler="ddim", steps=10)
    golden = torch.tensor([[1.0, -1.0, -1.0], [1.0, -1.0, -1.0]])
    torch.testing.assert_close(first, golden, atol=1e-5, rtol=1e-5)
    # The end is clipped to [-1, 1] whatever the path: also pin the state halfway (after 5 of 10 steps).
    x_T = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    t, halfway, _ = list(reverse_steps(Dummy(), schedule, x_T, sampler="ddim", steps=10))[5]
    golden_halfway = torch.tensor(
        [[1.83466005, -0.79309601, -2.36713839], [1.02268898, -1.45356107, -1.71577311]]
    )
    assert t == 22
    torch.testing.assert_close(halfway, golden_halfway, atol=1e-5, rtol=1e-5)
    # eta = 0: given x_T the result is a deterministic function (the generator's later state is irrelevant).
    x_T = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    runs = [
        list(
            reverse_steps(
                Dummy(), schedule, x_T, sampler="ddim", steps=10, generator=torch.Generator().manual_seed(s)
            )
        )
        for s in (2, 3)
    ]
    torch.testing.assert_close(runs[0][-1][1], runs[1][-1][1])


def test_ddim_with_eta_1_and_all_steps_equals_the_ddpm_posterior_step():
    schedule = NoiseSchedule(num_timesteps=100)
    x_T = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))

    def run(**options):
        return next(
            reverse_steps(Dummy(), schedule, x_T, generator=torch.Generator().manual_seed(5), **options)
        )[1]

    ddim = run(sampler="ddim", steps=100, eta=1.0)
    ddpm_small = run(sampler="ddpm", variance="fixedsmall")
    torch.testing.assert_close(ddim, ddpm_small, atol=1e-5, rtol=1e-5)


def test_respaced_timesteps_cover_both_ends():
    assert uniform_timesteps(1000, 1000).tolist() == list(range(1000))
    steps = uniform_timesteps(1000, 50)
    assert steps[0] == 0 and steps[-1] == 999 and len(set(steps.tolist())) == 50
    with pytest.raises(ValueError, match="steps=2000"):
        uniform_timesteps(1000, 2000)


def test_oracle_network_gives_zero_loss_and_exact_x0():
    """An eps-network that knows the true noise has zero loss and the loop recovers x_0 in one step."""
    schedule = NoiseSchedule()
    x0 = torch.rand(16, 1, 4, 4) * 2 - 1
    noise = torch.randn_like(x0)
    t = torch.randint(0, 1000, (16,))
    x_t = schedule.q_sample(x0, t, noise)

    class Oracle(torch.nn.Module):
        def forward(self, x, tt):
            return (
                x - schedule.sqrt_alphas_cumprod[tt].view(-1, 1, 1, 1) * x0
            ) / schedule.sqrt_one_minus_alphas_cumprod[tt].view(-1, 1, 1, 1)

    loss = (Oracle()(x_t, t) - noise).pow(2).flatten(1).mean(1)
    assert loss.max().item() < 1e-8
    _, _, x0_hat = next(reverse_steps(Oracle(), schedule, x_t, sampler="ddim", steps=1))
    torch.testing.assert_close(x0_hat, x0, atol=1e-3, rtol=1e-3)


def test_per_sample_generators_make_samples_independent_of_batching():
    schedule = NoiseSchedule("cosine", num_timesteps=20)
    gens = lambda ids: [torch.Generator().manual_seed(i) for i in ids]  # noqa: E731
    all_at_once = sample(Dummy(), schedule, (6, 2), gens(range(6)))
    in_two = torch.cat([sample(Dummy(), schedule, (3, 2), gens(ids)) for ids in (range(3), range(3, 6))])
    torch.testing.assert_close(all_at_once, in_two)
    with pytest.raises(ValueError, match="one per sample"):
        sample(Dummy(), schedule, (6, 2), gens(range(5)))
