"""Arguments of generation and rendering that torch would take wrongly or fail on with its own words: a seed it
would wrap around, labels it cannot read, images of another rank. (The other argument checks of the public API:
tests/test_public_api_arguments.py.)"""

import pytest
import torch
from helpers import tiny_vector_model

from diffusion.errors import InvalidValue, OutOfRange
from diffusion.generation.arguments import SEED_LIMIT
from diffusion.generation.ranks import generate, generate_in_chunks
from diffusion.generation.render import rows_by_class, save_image_grid
from diffusion.training.module import DiffusionModule


def tiny(num_classes: int | None = None) -> DiffusionModule:
    return tiny_vector_model(num_classes, steps=2)


SEED_RANGE = r"must be a whole number in \[0, 2\*\*64 - 1\] — pass a seed from 0 to 18446744073709551615"


@pytest.mark.parametrize("seed", [2**70, SEED_LIMIT, -1, -(2**63)])
def test_a_seed_torch_would_wrap_around_is_refused_by_its_name(seed):
    # 2**70 drew seed 0's samples, and -1 those of 2**64 - 1: torch and the noise take seeds modulo 2**64.
    module = tiny()
    with pytest.raises(OutOfRange, match=rf"^seed={seed} {SEED_RANGE}"):
        generate(module, 2, seed=seed)
    with pytest.raises(OutOfRange, match=rf"^seed={seed} {SEED_RANGE}"):
        next(generate_in_chunks(module, 2, sampler=module.sampler(), seed=seed))
    with pytest.raises(OutOfRange, match=rf"^seed={seed} {SEED_RANGE}"):
        module.sample(2, seed=seed)


def test_the_seeds_at_the_ends_of_the_range_draw_samples_of_their_own():
    module = tiny()
    first, last = generate(module, 2, seed=0), generate(module, 2, seed=SEED_LIMIT - 1)
    assert first.shape == last.shape == (2, 2) and not torch.equal(first, last)


def test_labels_that_cannot_be_read_are_refused_by_their_name():
    module = tiny(num_classes=3)
    on_meta = torch.zeros(4, dtype=torch.long, device="meta")
    with pytest.raises(
        InvalidValue, match=r"^labels is a tensor on the meta device, whose values cannot be read — "
    ):
        generate(module, 4, labels=on_meta)
    # Labels it can read are taken from wherever they are, as before.
    assert generate(module, 4, labels=torch.tensor([0, 1, 2, 0])).shape == (4, 2)


@pytest.mark.parametrize("shape", [(1, 8, 8), (8, 8), (2, 1, 1, 8, 8)])
def test_images_of_another_rank_are_refused_naming_their_shape(shape, tmp_path):
    images = torch.zeros(shape)
    shown = rf"^images has shape \({', '.join(map(str, shape))}\), not \(N, C, H, W\) — "
    with pytest.raises(InvalidValue, match=shown):
        save_image_grid(images, tmp_path / "grid.png")
    with pytest.raises(InvalidValue, match=shown):
        rows_by_class(images, torch.zeros(len(images), dtype=torch.long))
    assert not (tmp_path / "grid.png").exists()
