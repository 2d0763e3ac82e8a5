"""The per-image transform of the image datasets: a PIL image to a float32 tensor in model units, [-1, 1]; its
resize and its conversion also serve whole batches of uint8 images (`diffusion.data.on_device`)."""

import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F


def resized(images: torch.Tensor, size: int | None) -> torch.Tensor:
    """uint8 images (..., C, H, W) resized on their shorter side to `size` (antialiased, on uint8 so
    interpolation cannot overshoot [0, 1]) and center-cropped; as they are where they are `size` already."""
    if size is None or tuple(images.shape[-2:]) == (size, size):
        return images
    return F.center_crop(F.resize(images, size, antialias=True), size)


def to_model_units(images: torch.Tensor) -> torch.Tensor:
    """uint8 images -> float32 in [-1, 1]: v2.ToDtype(float32, scale=True) then v2.Normalize(0.5, 0.5)."""
    return images.to(torch.float32).mul_(1.0 / 255).sub_(0.5).div_(0.5)


class ToModelUnits:
    """PIL image -> float32 tensor (C, size, size) in [-1, 1]: `resized`, flipped horizontally with
    probability 1/2 if `random_flip`, `to_model_units`.

    The arithmetic and random draws of v2.Compose([ToImage(), Resize(size), CenterCrop(size),
    RandomHorizontalFlip(), ToDtype(float32, scale=True), Normalize(0.5, 0.5), ToPureTensor()]), output for
    output (tests/data/test_image_data.py), in one call: on 32x32 images Compose's dispatch of six transform
    objects costs several times the arithmetic, and a DataLoader worker runs it for every image.
    """

    def __init__(self, size: int | None, random_flip: bool) -> None:
        self.size = size  # None: the images have the size already
        self.random_flip = random_flip

    def __call__(self, image: Image.Image) -> torch.Tensor:
        x = resized(F.pil_to_tensor(image), self.size)  # (C, H, W) uint8, as v2.ToImage
        if self.random_flip and torch.rand(1) < 0.5:  # v2.RandomHorizontalFlip's draw from the global RNG
            x = x.flip(-1)
        return to_model_units(x)
