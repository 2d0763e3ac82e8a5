"""Every registered sampler's samples converge toward DDPM-1000 of the optimal network as its steps grow (the
distributions by their Fréchet distance; a deterministic sampler's samples one by one to its many-step limit)."""

import pytest
import torch
from helpers.tiny_sampler import (  # noqa: F401 (_one_thread: autouse)
    NAMES,
    STD,
    T,
    _one_thread,
    frechet_distance,
    gaussian_fit,
    options,
    tiny_module,
)

from diffusion.core.sampling import SAMPLERS, SamplingOptions


# ---- convergence toward DDPM-1000 ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exact():
    """The tiny model without its perturbation (the optimal network: its ODE and SDE sample the same
    distribution), and 2,000 samples of its DDPM-1000."""
    module = tiny_module(perturbation=0.0)
    reference = module.sample(2000, seed=1000, options=SamplingOptions(sampler="ddpm", clip_denoised=False))
    return module, gaussian_fit(reference)


def test_ddpm_1000_of_the_optimal_network_samples_its_data(exact):
    # The reference the samplers converge to, itself against the data: over 30 seeds <= 0.0023 (2,000 samples).
    module, reference = exact
    data = (module.network.means[-1], torch.diag(STD**2))  # no label: the last row's Gaussian
    assert frechet_distance(reference, data) < 0.007


@pytest.mark.parametrize("name", NAMES)
def test_samples_converge_toward_ddpm_1000_as_steps_grow(name, exact):
    # Over 30 seeds (of these samples and of the reference) the distance at 2 steps was >= 0.78 for every sampler
    # and at 100 steps <= 0.0062 (two sets of 2,000 DDPM-1000 samples: 0.002): the bounds keep a margin of 3.
    module, reference = exact
    samples = {
        steps: module.sample(2000, seed=0, options=options(name, steps, clip_denoised=False))
        for steps in (2, 10, 100)
    }
    distances = {
        steps: frechet_distance(gaussian_fit(sample), reference) for steps, sample in samples.items()
    }
    assert distances[2] > 0.3 and distances[10] < distances[2] and distances[100] < 0.02, distances


@pytest.mark.parametrize("name", [name for name in NAMES if SAMPLERS[name]().deterministic])
def test_a_deterministic_sampler_converges_sample_by_sample_to_its_many_step_limit(name, exact):
    module, _ = exact
    limit = module.sample(64, seed=0, options=options(name, T, clip_denoised=False))
    samples = [
        module.sample(64, seed=0, options=options(name, steps, clip_denoised=False)) for steps in (2, 10, 100)
    ]
    errors = [(sample - limit).abs().max().item() for sample in samples]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.1, errors
