"""ToModelUnits gives, image for image and draw for draw, what the torchvision v2.Compose it stands for gives."""

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from diffusion.data.image_transform import ToModelUnits


def torchvisions(size: int, random_flip: bool, channels: int) -> v2.Compose:
    steps = [v2.ToImage(), v2.Resize(size, antialias=True), v2.CenterCrop(size)]
    steps += [v2.RandomHorizontalFlip()] if random_flip else []
    steps += [
        v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * channels, [0.5] * channels), v2.ToPureTensor()
    ]  # fmt: skip
    return v2.Compose(steps)


@pytest.mark.parametrize("random_flip", [True, False])
@pytest.mark.parametrize(("mode", "shape"), [("RGB", (32, 32, 3)), ("RGB", (40, 57, 3)), ("L", (23, 16))])
def test_the_transform_is_torchvisions_compose_output_for_output(mode, shape, random_flip):
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode) for _ in range(16)]
    channels = 3 if mode == "RGB" else 1
    ours, theirs = ToModelUnits(32, random_flip), torchvisions(32, random_flip, channels)
    torch.manual_seed(1)
    expected = [theirs(image) for image in images]
    after_theirs = torch.rand(1)
    torch.manual_seed(1)
    actual = [ours(image) for image in images]
    assert torch.rand(1) == after_theirs  # the same draws from the global RNG (resumed runs replay them)
    for x, y in zip(actual, expected, strict=True):
        assert type(x) is torch.Tensor and x.dtype == torch.float32 and x.shape == (channels, 32, 32)
        assert torch.equal(x, y)
    if random_flip:  # some were flipped and some not
        unflipped = [ToModelUnits(32, False)(image) for image in images]
        assert 0 < sum(torch.equal(x, y) for x, y in zip(actual, unflipped, strict=True)) < len(images)
