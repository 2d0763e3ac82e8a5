"""A residual MLP that predicts the noise for vector data (toy 2-D sets, ``.npy`` features)."""

from collections.abc import Sequence

import torch
from torch import nn

from diffusion.core.noise import check_network_dtype
from diffusion.errors import OutOfRange
from diffusion.models.checks import (
    CLASSES,
    check_sample_shape,
    check_weights_fit_memory,
    fraction,
    optional_whole,
    whole,
)
from diffusion.models.embedding import (
    ClassEmbedding,
    fourier_features,
    sinusoidal_embedding,
)
from diffusion.models.inputs import check_forward_inputs


class ResidualBlock(nn.Module):
    """Pre-norm residual block whose hidden layer is shifted by the time embedding."""

    def __init__(self, hidden_dim: int, time_dim: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_dim)
        self.fc1 = nn.Linear(hidden_dim, hidden_dim)
        self.time_proj = nn.Linear(time_dim, hidden_dim)
        self.dropout = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.act = nn.SiLU()

    def forward(self, h: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        # h: (B, hidden), temb: (B, time_dim)
        z = self.fc1(self.act(self.norm(h)))
        z = z + self.time_proj(self.act(temb))
        z = self.fc2(self.dropout(self.act(z)))
        return h + z


class MLP(nn.Module):
    """Noise-prediction network for vectors: ``model(x, t)`` with x of shape (B, D), returns (B, D).

    Args:
        in_channels: number of features D of each data vector. Named like the UNet's argument so that
            the CLI can link the data's first dimension into whichever network is configured.
        hidden_dim: width of the residual stream.
        num_blocks: number of residual blocks.
        time_embed_dim: width of the sinusoidal timestep embedding.
        dropout: dropout inside each residual block.
        fourier_frequencies: K > 0 feeds each coordinate with its sines and cosines at K octave frequencies
            (``fourier_features``), which fine structure in low-dimensional data needs; 0 feeds raw x.
        num_classes: classes of a class-conditional network (``model(x, t, y)``, see `ClassEmbedding`); None
            (default) builds the unconditional network, parameter for parameter.
        out_channels: output features, ``in_channels`` when None (as the UNet's).
    """

    def __init__(
        self,
        in_channels: int = 2,
        hidden_dim: int = 256,
        num_blocks: int = 4,
        time_embed_dim: int = 128,
        dropout: float = 0.0,
        fourier_frequencies: int = 0,
        num_classes: int | None = None,
        out_channels: int | None = None,
    ) -> None:
        super().__init__()
        owner = type(self)
        in_channels = whole(owner, "in_channels", in_channels, 1)
        hidden_dim = whole(owner, "hidden_dim", hidden_dim, 1)
        out_channels = in_channels if out_channels is None else whole(owner, "out_channels", out_channels, 1)
        num_blocks = whole(owner, "num_blocks", num_blocks, 0)
        time_embed_dim = whole(owner, "time_embed_dim", time_embed_dim, 2)
        dropout = fraction(owner, "dropout", dropout)
        # Beyond 24 octaves float32 sin(pi 2^k x) is noise.
        fourier_frequencies = whole(owner, "fourier_frequencies", fourier_frequencies, 0, "in [0, 24]")
        if fourier_frequencies > 24:
            raise OutOfRange("fourier_frequencies", fourier_frequencies, "in [0, 24]", owner=owner)
        num_classes = optional_whole(owner, "num_classes", num_classes, 1, CLASSES)
        inputs = (
            in_channels * (1 + 2 * fourier_frequencies) + time_embed_dim + out_channels + (num_classes or 0)
        )
        parameters = hidden_dim * hidden_dim * (1 + 3 * num_blocks) + hidden_dim * (
            inputs + 8 + 5 * num_blocks
        )
        check_weights_fit_memory(owner, "hidden_dim", hidden_dim, parameters)
        self.fourier_frequencies = fourier_frequencies
        self.in_channels = in_channels
        self.time_embed_dim = time_embed_dim
        self.num_classes = num_classes

        self.time_mlp = nn.Sequential(
            nn.Linear(time_embed_dim, hidden_dim),
            nn.SiLU(),
            nn.Linear(hidden_dim, hidden_dim),
        )
        self.input = nn.Linear(in_channels * (1 + 2 * fourier_frequencies), hidden_dim)
        self.blocks = nn.ModuleList(ResidualBlock(hidden_dim, hidden_dim, dropout) for _ in range(num_blocks))
        self.out_norm = nn.LayerNorm(hidden_dim)
        self.out = nn.Linear(hidden_dim, out_channels)
        # A zero output layer makes the first prediction 0 for every input, so early steps
        # do not push the residual stream around with random noise estimates.
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        if num_classes is not None:  # created last: an unconditional network draws its init exactly as before
            self.class_embed = ClassEmbedding(num_classes, hidden_dim)

    def check_input_shape(self, shape: Sequence[int]) -> None:
        """Raise InvalidValue unless one sample of `shape` fits: a vector (D,) of D = in_channels features. Called
        by the CLI before training, and on every forward."""
        check_sample_shape(type(self), shape, "vectors", self.in_channels)

    def check_input_dtype(self, x: torch.Tensor, name: str = "x") -> None:
        """WrongDtype unless `x` is of the weights' dtype (or under autocast): `check_network_dtype`."""
        check_network_dtype(name, x, self.input.weight.dtype, "MLP")

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, D) float, t: (B,) int64, y: (B,) int64 class labels (NO_LABEL or None: none; only with
        num_classes) -> predicted noise (B, D), or (B, out_channels)."""
        check_forward_inputs(self, x, t, y, "vectors")
        temb = self.time_mlp(sinusoidal_embedding(t, self.time_embed_dim).to(x.dtype))  # (B, hidden)
        if self.num_classes is not None:
            temb = temb + self.class_embed(y, len(x)).to(temb.dtype)
        h = self.input(fourier_features(x, self.fourier_frequencies))  # (B, hidden)
        for block in self.blocks:
            h = block(h, temb)
        return self.out(nn.functional.silu(self.out_norm(h)))  # (B, D)
