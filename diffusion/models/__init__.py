"""Noise-prediction networks: ``model(x, t) -> same shape as x``; they know nothing of diffusion."""

from diffusion.models.embedding import sinusoidal_embedding
from diffusion.models.mlp import MLP
from diffusion.models.unet import UNet

__all__ = ["MLP", "UNet", "sinusoidal_embedding"]
