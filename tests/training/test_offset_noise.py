"""Offset noise (Guttenberg 2023, `--model.offset_noise`): the training noise plus offset_noise times one normal
per (sample, channel), drawn like the noise itself: per sample (noise_mode per_sample: a function of seed, step
and dataset index, so any split over batches or ranks draws the same) or from the rank's generator (fast: its
state, saved in checkpoints, resumes it). At 0 the noise is exactly what it was without the option."""

import pytest
import torch

from diffusion.models import MLP, UNet
from diffusion.training.loss import noise_and_timesteps
from diffusion.training.module import DiffusionModule

X0 = torch.rand(6, 3, 4, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1
INDICES = torch.tensor([5, 0, 9, 2, 7, 11])


def draw(offset_noise: float, indices: torch.Tensor = INDICES, generator_seed: int | None = None):
    generator = None if generator_seed is None else torch.Generator().manual_seed(generator_seed)
    x0 = X0[: len(indices)]
    return noise_and_timesteps(x0, indices, 3, 1000, 17, generator, offset_noise=offset_noise)


@pytest.mark.parametrize("generator_seed", [None, 4], ids=["per_sample", "fast"])
def test_offset_noise_adds_one_normal_per_sample_and_channel(generator_seed):
    plain, t = draw(0.0, generator_seed=generator_seed)
    shifted, t_shifted = draw(0.1, generator_seed=generator_seed)
    assert torch.equal(t, t_shifted)
    offset = (shifted - plain) / 0.1  # (B, C, H, W): z of each (sample, channel) over all its pixels
    torch.testing.assert_close(offset, offset[:, :, :1, :1].expand_as(offset), rtol=0, atol=1e-5)
    assert offset[:, :, 0, 0].unique().numel() == 18 and 0.3 < offset[:, :, 0, 0].std() < 3


def test_without_offset_noise_the_generator_draws_what_it_drew_before():
    # Fast mode's stream: the timesteps, then the noise, batch after batch; nothing spent on an offset of 0.
    generator, replay = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    for _ in range(2):
        noise, t = noise_and_timesteps(X0, INDICES, 3, 1000, 17, generator)
        assert torch.equal(t, torch.randint(1000, (6,), generator=replay))
        assert torch.equal(noise, torch.randn(X0.shape, generator=replay))


def test_per_sample_offsets_do_not_depend_on_the_batch():
    whole, _ = draw(0.1)
    halves = torch.cat([draw(0.1, INDICES[:2])[0], draw(0.1, INDICES[2:])[0]])
    torch.testing.assert_close(halves, whole, rtol=0, atol=0)


def test_offset_noise_is_checked_and_reaches_the_training_noise():
    network = UNet(in_channels=3, channels=8, channel_mult=[1], num_res_blocks=1, attention_levels=[])
    module = DiffusionModule(network, sample_shape=(3, 4, 4), offset_noise=0.1, noise_seed=17)
    noise, _ = module.draw_noise_and_timesteps(X0, INDICES, step=3, per_sample=True)
    torch.testing.assert_close(noise, draw(0.1)[0].float(), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^offset_noise=-0.1 must be a finite number >= 0 — pass e.g. 0.1"):
        DiffusionModule(network, sample_shape=(3, 4, 4), offset_noise=-0.1)
    with pytest.raises(ValueError, match=r"^offset_noise shifts an image's channels: it is for images — "):
        DiffusionModule(MLP(hidden_dim=8, num_blocks=1), sample_shape=(2,), offset_noise=0.1)
