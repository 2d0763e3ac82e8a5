"""The sampler contract's tiny model (tests/core/test_sampler_contract.py, test_sampler_convergence.py): the optimal
eps-prediction (or v-prediction) for class-conditional Gaussian data in 4 dimensions, shaped (1, 2, 2) so it can
learn variances (which only images do), plus a seeded perturbation, as no trained network is exact."""

import pytest
import torch
from torch import nn

from diffusion.core.sampling import SAMPLERS, SamplingOptions
from diffusion.core.schedule import NoiseSchedule
from diffusion.training.module import DiffusionModule

T = 1000
STD = torch.tensor([0.3, 0.5, 0.1, 0.7], dtype=torch.float64)
NAMES = list(SAMPLERS)


class TinyNetwork(nn.Module):
    """eps of class-conditional Gaussian data x_0 ~ N(means[y], diag(STD^2)) (the last row of `means` for NO_LABEL),
    exact when `perturbation` is 0; with `learned_variance`, also a v in (-1, 1) (2C output channels). With
    `zero_terminal_snr`, the v-prediction (Salimans & Ho's v, not the variance's) on that schedule."""

    def __init__(
        self, learned_variance: bool = False, perturbation: float = 0.05, num_classes: int = 3,
        zero_terminal_snr: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.num_classes = num_classes
        self.learned_variance = learned_variance
        self.perturbation = perturbation
        self.predicts_v = zero_terminal_snr
        schedule = NoiseSchedule(num_timesteps=T, zero_terminal_snr=zero_terminal_snr)
        self.register_buffer("alphas_cumprod", schedule.alphas_cumprod.double())
        self.register_buffer(
            "means", 0.5 * torch.randn(num_classes + 1, 4, generator=generator, dtype=torch.float64)
        )
        self.register_buffer("weight", 0.3 * torch.randn(4, 4, generator=generator, dtype=torch.float64))
        self.register_buffer("weight_v", torch.randn(4, 4, generator=generator, dtype=torch.float64))

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.double().flatten(1)  # (B, 4)
        abar = self.alphas_cumprod[t].unsqueeze(1)  # (B, 1)
        mean = self.means[-1 if y is None else y]  # NO_LABEL = -1: the last row
        x0 = mean + abar.sqrt() * STD**2 * (flat - abar.sqrt() * mean) / (abar * STD**2 + 1 - abar)
        eps = (flat - abar.sqrt() * x0) / (1 - abar).sqrt()
        time = (t.double() / T).unsqueeze(1)
        eps = eps + self.perturbation * torch.tanh((flat[:, :, None] * self.weight).sum(1) + time)
        if self.predicts_v:  # v = sqrt(abar) eps - sqrt(1 - abar) x_0, perturbed through eps
            eps = abar.sqrt() * eps - (1 - abar).sqrt() * x0
        out = eps.float().view_as(x)
        if not self.learned_variance:
            return out
        v = torch.tanh((flat[:, :, None] * self.weight_v).sum(1) + 2 * time - 1)
        return torch.cat([out, v.float().view_as(x)], dim=1)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tensors of a few thousand numbers: threads only wait for each other (seconds become minutes on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_module(
    learned_variance: bool = False, perturbation: float = 0.05, zero_terminal_snr: bool = False
) -> DiffusionModule:
    network = TinyNetwork(learned_variance, perturbation, zero_terminal_snr=zero_terminal_snr)
    variance = "learned_range" if learned_variance else "fixed"
    return DiffusionModule(
        network, sample_shape=(1, 2, 2), num_timesteps=T, variance=variance, zero_terminal_snr=zero_terminal_snr,
        prediction_type="v" if zero_terminal_snr else "eps",
        label_dropout=0.1,  # its NO_LABEL row is the unconditional model: guidance takes it
    )  # fmt: skip


def options(name: str, steps: int = 4, **more) -> SamplingOptions:
    return SamplingOptions(sampler=name, steps=steps, **more)


def guided(name: str) -> dict:
    """Guidance 1.5 for a sampler that takes it."""
    return {"guidance_scale": 1.5} if SAMPLERS[name].takes_guidance else {}


LABELS = torch.tensor([0, 1, 2])


def gaussian_fit(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of samples (N, ...), float64."""
    flat = samples.flatten(1).double()
    return flat.mean(0), torch.cov(flat.T)


def frechet_distance(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The Fréchet distance between two Gaussians given as (mean, covariance)."""
    (mean_a, cov_a), (mean_b, cov_b) = a, b
    values, vectors = torch.linalg.eigh(cov_a)
    root_a = vectors @ torch.diag(values.clamp(min=0).sqrt()) @ vectors.T
    cross = torch.linalg.eigvalsh(root_a @ cov_b @ root_a).clamp(min=0).sqrt().sum()
    return ((mean_a - mean_b) ** 2).sum().item() + (cov_a.trace() + cov_b.trace() - 2 * cross).item()
