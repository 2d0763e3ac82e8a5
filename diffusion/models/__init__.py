"""Noise-prediction networks: ``model(x, t) -> same shape as x`` (``model(x, t, y)`` with class labels y when
built with num_classes); they know nothing of diffusion."""

from diffusion.models.embedding import ClassEmbedding, sinusoidal_embedding
from diffusion.models.mlp import MLP
from diffusion.models.unet import UNet

__all__ = ["MLP", "ClassEmbedding", "UNet", "sinusoidal_embedding"]
