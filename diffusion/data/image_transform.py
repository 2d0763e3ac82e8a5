"""The per-image transform of the image datasets: a PIL image to a float32 tensor in model units, [-1, 1]."""

import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F


class ToModelUnits:
    """PIL image -> float32 tensor (C, size, size) in [-1, 1]: resized (shorter side, antialiased, on uint8 so
    interpolation cannot overshoot [0, 1]) and center-cropped where the image is not `size` already, flipped
    horizontally with probability 1/2 if `random_flip`.

    The arithmetic and random draws of v2.Compose([ToImage(), Resize(size), CenterCrop(size),
    RandomHorizontalFlip(), ToDtype(float32, scale=True), Normalize(0.5, 0.5), ToPureTensor()]), output for
    output (tests/data/test_image_data.py), in one call: on 32x32 images Compose's dispatch of six transform
    objects costs several times the arithmetic, and a DataLoader worker runs it for every image.
    """

    def __init__(self, size: int | None, random_flip: bool) -> None:
        self.size = size  # None: the images have the size already
        self.random_flip = random_flip

    def __call__(self, image: Image.Image) -> torch.Tensor:
        x = F.pil_to_tensor(image)  # (C, H, W) uint8, as v2.ToImage
        if self.size is not None and tuple(x.shape[-2:]) != (self.size, self.size):
            x = F.center_crop(F.resize(x, self.size, antialias=True), self.size)
        if self.random_flip and torch.rand(1) < 0.5:  # v2.RandomHorizontalFlip's draw from the global RNG
            x = x.flip(-1)
        return (
            x.to(torch.float32).mul_(1.0 / 255).sub_(0.5).div_(0.5)
        )  # ToDtype(scale) then Normalize(0.5, 0.5)
