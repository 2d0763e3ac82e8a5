"""Every training/sampling option of DiffusionModule changes behaviour, not just the parsed config.

Oracle networks know the clean data x_0, so for any input x_t they can output the exact eps, x_0 or v:
a loss of zero for the matching prediction_type, and exact recovery of x_0 by the samplers.
"""

import pytest
import torch
from torch import nn

from diffusion.core.sampling import SamplingOptions
from diffusion.core.schedule import NoiseSchedule
from diffusion.models import MLP
from diffusion.training.module import DiffusionModule

X0 = torch.rand(16, 2, generator=torch.Generator().manual_seed(0)) * 1.6 - 0.8  # (B, D) in [-0.8, 0.8]
NOISE = torch.randn(16, 2, generator=torch.Generator().manual_seed(1))
T = torch.tensor([0, 1, 5, 20, 50, 100, 150, 200, 300, 400, 500, 600, 700, 800, 900, 999])


def make_module(network: nn.Module | None = None, **options) -> DiffusionModule:
    """A module for 2-D vectors; without `network`, a tiny untrained MLP whose weights depend only on the seed.

    Its zero-initialized output layer is randomized, so the output depends on x_t and t (a zero output would
    make the eps loss independent of the schedule).
    """
    if network is None:
        torch.manual_seed(0)
        network = MLP(in_channels=2, hidden_dim=32, num_blocks=2, time_embed_dim=16)
        nn.init.normal_(network.out.weight, std=0.5)
    return DiffusionModule(network, sample_shape=(2,), **options).eval()


class Oracle(nn.Module):
    """Outputs the true eps, x_0 or v for inputs x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps of known x_0."""

    def __init__(self, x0: torch.Tensor, prediction_type: str, schedule: NoiseSchedule) -> None:
        super().__init__()
        self.x0, self.prediction_type, self.schedule = x0, prediction_type, schedule

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        sqrt_abar = self.schedule.sqrt_alphas_cumprod[t].view(-1, 1).double()
        sqrt_one_minus = self.schedule.sqrt_one_minus_alphas_cumprod[t].view(-1, 1).double()
        x0 = self.x0.double()
        eps = (x.double() - sqrt_abar * x0) / sqrt_one_minus
        output = {"eps": eps, "x0": x0, "v": sqrt_abar * eps - sqrt_one_minus * x0}[self.prediction_type]
        return output.float()


# ---- prediction_type ----------------------------------------------------------------------------------
def test_prediction_types_train_different_targets():
    losses = {p: make_module(prediction_type=p).per_sample_loss(X0, NOISE, T) for p in ("eps", "x0", "v")}
    assert not torch.allclose(losses["eps"], losses["x0"]) and not torch.allclose(losses["eps"], losses["v"])
    assert not torch.allclose(losses["x0"], losses["v"])
    # Each loss is the MSE to its own target, written out here: eps, x_0, v = sqrt(abar) eps - sqrt(1-abar) x_0.
    schedule = NoiseSchedule()
    abar = schedule.alphas_cumprod[T].view(-1, 1)
    x_t = abar.sqrt() * X0 + (1 - abar).sqrt() * NOISE
    targets = {"eps": NOISE, "x0": X0, "v": abar.sqrt() * NOISE - (1 - abar).sqrt() * X0}
    output = make_module().network(x_t, T)
    for p, target in targets.items():
        torch.testing.assert_close(losses[p], (output - target).pow(2).mean(dim=1), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("prediction_type", ["eps", "x0", "v"])
def test_oracle_has_zero_loss_only_for_its_own_prediction_type(prediction_type):
    oracle = Oracle(X0, prediction_type, NoiseSchedule())
    for module_type in ("eps", "x0", "v"):
        loss = make_module(oracle, prediction_type=module_type).per_sample_loss(X0, NOISE, T)
        if module_type == prediction_type:
            assert loss.max().item() < 1e-6
        else:
            assert loss.mean().item() > 1e-2


@pytest.mark.parametrize("prediction_type", ["eps", "x0", "v"])
@pytest.mark.parametrize("sampler, steps", [("ddim", 1), ("ddim", 10), ("ddpm", 20)])
def test_samplers_convert_each_prediction_type_to_exact_x0(prediction_type, sampler, steps):
    module = make_module(Oracle(X0, prediction_type, NoiseSchedule()), prediction_type=prediction_type)
    samples = module.sample(len(X0), seed=0, options=SamplingOptions(sampler=sampler, steps=steps))
    torch.testing.assert_close(samples, X0, atol=1e-4, rtol=1e-4)


def test_sampler_uses_the_modules_prediction_type():
    v_oracle = Oracle(X0, "v", NoiseSchedule())
    wrong = make_module(v_oracle, prediction_type="eps").sample(
        len(X0), seed=0, options=SamplingOptions(sampler="ddim", steps=1)
    )
    assert (wrong - X0).abs().max().item() > 0.1


# ---- beta_schedule --------------------------------------------------------------------------------------
def test_beta_schedules_change_alphas_cumprod_and_the_loss():
    modules = {s: make_module(beta_schedule=s) for s in ("linear", "cosine", "sigmoid")}
    names = list(modules)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            abar_a, abar_b = modules[a].schedule.alphas_cumprod, modules[b].schedule.alphas_cumprod
            assert (abar_a - abar_b).abs().max().item() > 0.01, (a, b)  # cosine vs sigmoid: 0.016
            loss_a = modules[a].per_sample_loss(X0, NOISE, T)
            loss_b = modules[b].per_sample_loss(X0, NOISE, T)
            assert not torch.allclose(loss_a, loss_b), (a, b)
    for name, module in modules.items():
        assert module.schedule.beta_schedule == name and module.hparams.beta_schedule == name


# ---- variance -------------------------------------------------------------------------------------------
def test_variance_changes_ddpm_samples_but_not_ddim_ones():
    large, small = (make_module(sampling=SamplingOptions(variance=v)) for v in ("fixedlarge", "fixedsmall"))
    ddpm = [m.sample(8, seed=0, options=SamplingOptions(sampler="ddpm", steps=10)) for m in (large, small)]
    assert (ddpm[0] - ddpm[1]).abs().max().item() > 1e-3
    ddim = [m.sample(8, seed=0, options=SamplingOptions(sampler="ddim", steps=10)) for m in (large, small)]
    torch.testing.assert_close(ddim[0], ddim[1], atol=0, rtol=0)
    # The stored option is the default of sample(): no override needed.
    torch.testing.assert_close(
        small.sample(8, seed=0, options=SamplingOptions(steps=10)), ddpm[1], atol=0, rtol=0
    )


# ---- loss_weighting -------------------------------------------------------------------------------------
@pytest.mark.parametrize("prediction_type", ["eps", "x0", "v"])
def test_min_snr_weights_the_loss_by_min_snr_gamma(prediction_type):
    gamma = 5.0
    plain = make_module(prediction_type=prediction_type, loss_weighting="none")
    weighted = make_module(prediction_type=prediction_type, loss_weighting="min_snr", min_snr_gamma=gamma)
    loss, weighted_loss = plain.per_sample_loss(X0, NOISE, T), weighted.per_sample_loss(X0, NOISE, T)
    abar = NoiseSchedule().alphas_cumprod.double()[T]
    snr = abar / (1 - abar)
    clipped = snr.clamp(max=gamma)
    # Hang et al. 2023: min(SNR, gamma) on the x_0 loss; the eps loss is SNR times it, the v loss SNR + 1 times.
    weight = {"eps": clipped / snr, "x0": clipped, "v": clipped / (snr + 1)}[prediction_type]
    torch.testing.assert_close(weighted_loss.double(), loss.double() * weight, atol=1e-6, rtol=1e-4)
    assert not torch.allclose(weighted_loss, loss)
    if prediction_type == "eps":  # down-weights only the low-noise steps, where SNR > gamma
        assert weight[0] < 1e-3 and weight[-1] == 1.0


# ---- clip_denoised --------------------------------------------------------------------------------------
def test_clip_denoised_changes_samples_of_an_untrained_network():
    from diffusion.core.sampling import reverse_steps

    unclipped, clipped = (make_module(sampling=SamplingOptions(clip_denoised=c)) for c in (False, True))
    x_T = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    _, _, x0_hat = next(reverse_steps(unclipped.network, unclipped.schedule, x_T, clip_denoised=False))
    assert x0_hat.abs().max().item() > 1  # an untrained eps-network's x_0 predictions leave [-1, 1]
    _, _, x0_clipped = next(reverse_steps(clipped.network, clipped.schedule, x_T, clip_denoised=True))
    assert x0_clipped.abs().max().item() <= 1
    for sampler in ("ddpm", "ddim"):
        a, b = (
            m.sample(8, seed=0, options=SamplingOptions(sampler=sampler, steps=10))
            for m in (unclipped, clipped)
        )
        assert (a - b).abs().max().item() > 1e-2, sampler


# ---- noise_mode -----------------------------------------------------------------------------------------
def test_per_sample_noise_depends_only_on_seed_step_and_index():
    module = make_module(noise_mode="per_sample", noise_seed=7)
    x0 = torch.zeros(3, 2)
    noise_a, t_a = module.draw_noise_and_timesteps(x0, torch.tensor([5, 9, 2]), step=3, per_sample=True)
    noise_b, t_b = module.draw_noise_and_timesteps(x0, torch.tensor([2, 7, 5]), step=3, per_sample=True)
    # Index 5 sits first in one batch and last in the other: same noise and timestep.
    torch.testing.assert_close(noise_a[0], noise_b[2], atol=0, rtol=0)
    torch.testing.assert_close(noise_a[2], noise_b[0], atol=0, rtol=0)
    assert t_a[0] == t_b[2] and t_a[2] == t_b[0]
    # Another step or another seed: fresh noise for the same index.
    noise_c, _ = module.draw_noise_and_timesteps(x0, torch.tensor([5, 9, 2]), step=4, per_sample=True)
    assert not torch.equal(noise_a[0], noise_c[0])
    other_seed = make_module(noise_mode="per_sample", noise_seed=8)
    noise_d, _ = other_seed.draw_noise_and_timesteps(x0, torch.tensor([5, 9, 2]), step=3, per_sample=True)
    assert not torch.equal(noise_a[0], noise_d[0])


def test_fast_noise_depends_on_batch_position_and_generator_state():
    module = make_module(noise_mode="fast", noise_seed=7)
    x0 = torch.zeros(3, 2)
    module.on_fit_start()  # seeds the rank's generator from (noise_seed, global step, rank)
    noise_a, _ = module.draw_noise_and_timesteps(x0, torch.tensor([5, 9, 2]), step=3, per_sample=False)
    module.on_fit_start()
    noise_b, _ = module.draw_noise_and_timesteps(x0, torch.tensor([2, 7, 5]), step=3, per_sample=False)
    torch.testing.assert_close(noise_a, noise_b, atol=0, rtol=0)  # the same stream, whatever the indices
    assert not torch.equal(noise_a[0], noise_b[2])  # so index 5 gets other noise in another position
    noise_c, _ = module.draw_noise_and_timesteps(x0, torch.tensor([5, 9, 2]), step=3, per_sample=False)
    assert not torch.equal(noise_a, noise_c)  # and the stream moves on


def test_per_sample_losses_follow_their_samples_through_a_shuffle():
    module = make_module(noise_mode="per_sample", noise_seed=0)
    indices = torch.arange(16)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))

    def losses(order: torch.Tensor) -> torch.Tensor:
        noise, t = module.draw_noise_and_timesteps(X0[order], indices[order], step=0, per_sample=True)
        return module.per_sample_loss(X0[order], noise, t)

    torch.testing.assert_close(losses(perm), losses(indices)[perm], atol=1e-6, rtol=1e-5)


def test_noise_seed_none_uses_the_global_seed(monkeypatch):
    x0, indices = torch.zeros(2, 2), torch.tensor([0, 1])
    monkeypatch.setenv("PL_GLOBAL_SEED", "3")
    from_env = make_module(noise_mode="per_sample").draw_noise_and_timesteps(x0, indices, 0, per_sample=True)
    explicit = make_module(noise_seed=3).draw_noise_and_timesteps(x0, indices, 0, per_sample=True)
    torch.testing.assert_close(from_env[0], explicit[0], atol=0, rtol=0)


# ---- the batch contract ---------------------------------------------------------------------------------
def test_training_and_validation_refuse_a_batch_that_is_not_x_and_index():
    module = make_module()
    foreign = (X0, torch.zeros(len(X0), dtype=torch.long))  # e.g. (image, label) from a user's DataModule
    for step in (module.training_step, module.validation_step):
        with pytest.raises(TypeError, match="diffusion.data.Batch"):
            step(foreign, 0)
