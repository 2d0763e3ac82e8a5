"""Counter-based noise (diffusion/core/noise.py): its bits equal an independent uint32 reference, its normals and
timesteps have the right distribution with no correlation between neighbours, and a sample's noise does not
depend on the batch it is drawn in, the order of the batch or the device."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from diffusion.core import noise
from diffusion.core.noise import randn

KEY = noise.noise_key(1234, noise.TRAINING_NOISE, 7)


def reference_bits(key: tuple[int, int], index: int, element: int) -> int:
    """random_bits for one (index, element), in numpy uint32 arithmetic (which wraps mod 2**32 natively)."""

    def mix(x):
        x = np.uint32(x)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x21F0AAAD)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x735A2D97)
        return x ^ (x >> np.uint32(15))

    with np.errstate(over="ignore"):
        row = mix(mix(np.uint32(index & 0xFFFFFFFF) ^ np.uint32(key[0])) ^ np.uint32(index >> 32))
        col = mix(np.uint32(element) ^ np.uint32(key[1]))
        return int(mix(mix(row + col)))


def test_bits_equal_a_uint32_reference_so_no_backend_overflows():
    """int64 torch ops compute the 32-bit hash exactly: the definition every device shares."""
    indices = torch.tensor([0, 1, 2, 12345, 2**31 + 5, 2**40 + 3])
    bits = noise.random_bits(KEY, indices, 5)
    assert bits.dtype == torch.int64 and bits.min() >= 0 and bits.max() < 2**32
    for row, index in enumerate(indices.tolist()):
        for element in range(5):
            assert int(bits[row, element]) == reference_bits(KEY, index, element), (index, element)


def test_normals_have_mean_zero_std_one_and_a_normal_distribution():
    z = noise.normal((1000, 3, 16, 16), KEY, torch.arange(1000)).flatten().double()  # 768,000 values
    standard_error = 1 / math.sqrt(len(z))
    assert abs(z.mean().item()) < 5 * standard_error
    assert abs(z.std().item() - 1) < 5 * standard_error
    assert stats.kstest(z[:100_000].numpy(), "norm").pvalue > 1e-3
    # Tails: P(|z| > 2) = 4.55%, P(|z| > 3) = 0.27%; Box-Muller on 24-bit uniforms reaches |z| = 5.9.
    assert (z.abs() > 2).double().mean().item() == pytest.approx(0.0455, abs=0.0015)
    assert (z.abs() > 3).double().mean().item() == pytest.approx(0.0027, abs=0.0004)
    assert 4.5 < z.abs().max().item() < 6.0


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([a.flatten(), b.flatten()]).double())[0, 1].item()


def test_neighbouring_indices_elements_and_steps_are_uncorrelated():
    z = noise.normal((2000, 64), KEY, torch.arange(2000))
    bound = 5 / math.sqrt(z.numel() / 2)
    assert abs(correlation(z[:-1], z[1:])) < bound  # sample i and i + 1, same element
    assert abs(correlation(z[:, :-1], z[:, 1:])) < bound  # element e and e + 1 (one Box-Muller pair or two)
    # Box-Muller's pairs share a radius: their squares would correlate if the two uniforms did not look
    # independent (for a true normal pair they are independent).
    assert abs(correlation(z[:, 0::2] ** 2, z[:, 1::2] ** 2)) < 2 * bound
    next_step = noise.normal((2000, 64), noise.noise_key(1234, noise.TRAINING_NOISE, 8), torch.arange(2000))
    assert abs(correlation(z, next_step)) < bound
    other_stream = noise.normal(
        (2000, 64), noise.noise_key(1234, noise.SAMPLING_NOISE, 7), torch.arange(2000)
    )
    assert abs(correlation(z, other_stream)) < bound


def test_timesteps_are_uniform_over_the_range():
    t = noise.randint(1000, KEY, torch.arange(200_000))
    assert t.dtype == torch.int64 and t.min() == 0 and t.max() == 999
    counts = torch.bincount(t, minlength=1000).numpy()
    assert stats.chisquare(counts).pvalue > 1e-3
    assert abs(correlation(t[:-1].double(), t[1:].double())) < 5 / math.sqrt(len(t))
    with pytest.raises(ValueError, match="high=0"):
        noise.randint(0, KEY, torch.arange(3))


def test_a_samples_noise_does_not_depend_on_the_batch_or_its_order():
    indices = torch.tensor([5, 0, 17, 3, 2**33, 8])
    whole = noise.normal((6, 2, 3, 3), KEY, indices)
    in_parts = torch.cat(
        [noise.normal((k, 2, 3, 3), KEY, part) for k, part in ((2, indices[:2]), (4, indices[2:]))]
    )
    assert torch.equal(whole, in_parts)
    order = torch.tensor([3, 1, 5, 0, 2, 4])
    assert torch.equal(noise.normal((6, 2, 3, 3), KEY, indices[order]), whole[order])
    assert torch.equal(noise.randint(1000, KEY, indices[order]), noise.randint(1000, KEY, indices)[order])
    # Rank r of W drawing samples r, r + W, ... gets rows of the one-process draw.
    ranks = [noise.normal((3, 2, 3, 3), KEY, indices[r::2]) for r in range(2)]
    assert torch.equal(torch.stack(ranks, dim=1).flatten(0, 1), whole)


def test_the_seed_and_every_counter_change_the_noise():
    base = noise.normal((4, 8), noise.noise_key(0, 0, 0), torch.arange(4))
    for key in [
        noise.noise_key(1, 0, 0),
        noise.noise_key(0, 1, 0),
        noise.noise_key(0, 0, 1),
        noise.noise_key(0, 0, 2**32),
    ]:
        assert not torch.isclose(noise.normal((4, 8), key, torch.arange(4)), base).any()


def test_drawn_entirely_on_the_device_without_reading_values_back():
    """Meta tensors have shapes but no values: a host read (.item(), a Python loop over the indices) fails."""
    indices = torch.arange(4, device="meta")
    assert noise.normal((4, 3, 2), KEY, indices).device.type == "meta"
    assert noise.randint(10, KEY, indices).device.type == "meta"
    stream = noise.PerSampleNoise(0, torch.arange(4))
    assert stream.randn((4, 3), "meta").shape == (4, 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_same_bits_on_cuda_and_cpu_and_normals_to_rounding():
    indices = torch.arange(64) * 7
    assert torch.equal(
        noise.random_bits(KEY, indices.cuda(), 100).cpu(), noise.random_bits(KEY, indices, 100)
    )
    torch.testing.assert_close(
        noise.normal((64, 100), KEY, indices.cuda()).cpu(),
        noise.normal((64, 100), KEY, indices),
        atol=1e-5,
        rtol=1e-5,
    )


def test_per_sample_noise_draws_in_sequence_and_splits_like_the_batch():
    all_at_once = noise.PerSampleNoise(3, torch.arange(6))
    first, second = all_at_once.randn((6, 4), "cpu"), all_at_once.randn((6, 4), "cpu")
    assert not torch.equal(first, second)  # each call is the next draw
    halves = [noise.PerSampleNoise(3, torch.arange(6)[part]) for part in (slice(0, 2), slice(2, 6))]
    for expected in (first, second):
        assert torch.equal(torch.cat([randn((len(h), 4), h, torch.device("cpu")) for h in halves]), expected)
    assert not torch.equal(noise.PerSampleNoise(3, torch.arange(6), step=1).randn((6, 4)), first)
    with pytest.raises(ValueError, match="6 sample indices for a batch of 5"):
        noise.PerSampleNoise(3, torch.arange(6)).randn((5, 4))


def test_training_noise_per_sample_is_the_same_in_any_batch_split():
    from diffusion.models import MLP
    from diffusion.training.module import DiffusionModule

    module = DiffusionModule(MLP(in_channels=2, hidden_dim=8, num_blocks=1), sample_shape=(2,), noise_seed=5)
    x0, indices = torch.zeros(6, 2), torch.tensor([9, 4, 0, 31, 7, 2])
    noise_all, t_all = module.draw_noise_and_timesteps(x0, indices, step=3, per_sample=True)
    parts = [module.draw_noise_and_timesteps(x0[s], indices[s], 3, True) for s in (slice(0, 1), slice(1, 6))]
    assert torch.equal(torch.cat([n for n, _ in parts]), noise_all)
    assert torch.equal(torch.cat([t for _, t in parts]), t_all)
    assert t_all.dtype == torch.int64 and t_all.min() >= 0 and t_all.max() < 1000
    # Another step draws other noise and timesteps for the same samples.
    noise_next, t_next = module.draw_noise_and_timesteps(x0, indices, step=4, per_sample=True)
    assert not torch.isclose(noise_next, noise_all).any() and not torch.equal(t_next, t_all)
