"""What generation needs of a module is declared (`diffusion.generation.ranks.Sampleable`) and is all it uses: a
DiffusionModule is one, and an object with those members alone, no Lightning, draws the module's samples."""

import torch
from helpers.tiny_sampler import tiny_module

from diffusion.core.sampling import SamplingOptions, build_sampler
from diffusion.generation.ranks import Sampleable, generate

DDIM_4 = build_sampler(SamplingOptions(sampler="ddim", steps=4))


class OnlyTheProtocol:
    """A module's Sampleable members and nothing else."""

    def __init__(self, module) -> None:
        self._module = module
        self.sample_shape = module.sample_shape

    @property
    def normalization(self):
        return self._module.normalization

    def initial_noise(self, num_samples, seed=None, indices=None):
        return self._module.initial_noise(num_samples, seed, indices)

    def denoiser(self, num_samples, labels=None):
        return self._module.denoiser(num_samples, labels)

    def evaluating(self):
        return self._module.evaluating()


def test_generation_needs_only_what_sampleable_declares():
    module = tiny_module()
    module.hparams.normalization = {"shift": [0.5], "scale": [0.5]}  # as train.py sets it from the data
    assert isinstance(module, Sampleable)
    bare = OnlyTheProtocol(module)
    assert isinstance(bare, Sampleable)
    torch.testing.assert_close(
        generate(bare, 5, seed=3, batch_size=2, sampler=DDIM_4),
        generate(module, 5, seed=3, batch_size=2, sampler=DDIM_4),
        rtol=0, atol=0,
    )  # fmt: skip
    torch.testing.assert_close(
        generate(bare, 3, seed=1, sampler=DDIM_4, uint8_images=True),
        generate(module, 3, seed=1, sampler=DDIM_4, uint8_images=True),
        rtol=0, atol=0,
    )  # fmt: skip
