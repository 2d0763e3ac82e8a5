"""DDPM training and sampling on PyTorch Lightning: the names a user's code and notebooks reach for.

    from diffusion import SamplingOptions, generate, load_checkpoint

    module = load_checkpoint("runs/digits/version_0/checkpoints/last.ckpt")  # or an export, or a diffusers folder
    samples = generate(module, 64, seed=0, options=SamplingOptions(sampler="ddim", steps=50))

Each name lives in one of the package's layers (docs/layout.md), bottom to top: errors -> core -> models ->
data -> generation and metrics -> training -> cli. The names below are imported on first use (PEP 562), so
`import diffusion.core.schedule` stays as light as it was; their deep paths keep working. tests/test_public_api.py
pins this list: a name removed or renamed fails it.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_PUBLIC = {
    # loading and sampling
    "load_checkpoint": "diffusion.training.loading",  # a checkpoint, an export or a diffusers folder
    "latest_checkpoint": "diffusion.training.run_folders",  # the newest checkpoint of a run name
    "generate": "diffusion.generation.ranks",  # samples 0..N-1 in batches, the same on any number of ranks
    "SamplingOptions": "diffusion.core.sampling",  # sampler, steps, guidance, ...: unset fields defer
    "SAMPLERS": "diffusion.core.sampling",  # the registry: name -> sampler class
    "reverse_steps": "diffusion.core.sampling",  # a sampler's steps on a bare network (no Lightning)
    "final_sample": "diffusion.core.sampling",  # the last step's x of reverse_steps
    "class_labels": "diffusion.data.labels",  # labels for N samples of a class-conditional model
    # samples as pictures and data units
    "denormalize": "diffusion.generation.render",
    "to_uint8": "diffusion.generation.render",
    "rows_by_class": "diffusion.generation.render",
    "save_image_grid": "diffusion.generation.render",
    # training: the module, its schedule, networks and data modules
    "DiffusionModule": "diffusion.training.module",
    "NoiseSchedule": "diffusion.core.schedule",
    "UNet": "diffusion.models",
    "MLP": "diffusion.models",
    "ImageDataModule": "diffusion.data",
    "VectorDataModule": "diffusion.data",
    "Batch": "diffusion.data",
    "IndexedDataset": "diffusion.data",
    # metrics
    "SampleQuality": "diffusion.metrics.sample_quality",  # FID, KID and IS of samples against reference images
    "frechet_distance": "diffusion.metrics.fid",
    "BitsPerDim": "diffusion.metrics.bits_per_dim",
    "load_statistics": "diffusion.metrics.reference_stats",
    # the error every layer raises for a user's mistake: one line, what is wrong and the fix
    "UserError": "diffusion.errors",
}

__all__ = [  # the keys of _PUBLIC, written out for linters and editors (tests/test_public_api.py checks)
    "Batch",
    "BitsPerDim",
    "DiffusionModule",
    "ImageDataModule",
    "IndexedDataset",
    "MLP",
    "NoiseSchedule",
    "SAMPLERS",
    "SampleQuality",
    "SamplingOptions",
    "UNet",
    "UserError",
    "VectorDataModule",
    "class_labels",
    "denormalize",
    "final_sample",
    "frechet_distance",
    "generate",
    "latest_checkpoint",
    "load_checkpoint",
    "load_statistics",
    "reverse_steps",
    "rows_by_class",
    "save_image_grid",
    "to_uint8",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'diffusion' has no attribute {name!r}")
    value = getattr(import_module(_PUBLIC[name]), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what editors and type checkers see; at run time the names load on first use
    from diffusion.core.sampling import SAMPLERS, SamplingOptions, final_sample, reverse_steps
    from diffusion.core.schedule import NoiseSchedule
    from diffusion.data import Batch, ImageDataModule, IndexedDataset, VectorDataModule
    from diffusion.data.labels import class_labels
    from diffusion.errors import UserError
    from diffusion.generation.ranks import generate
    from diffusion.generation.render import denormalize, rows_by_class, save_image_grid, to_uint8
    from diffusion.metrics.bits_per_dim import BitsPerDim
    from diffusion.metrics.fid import frechet_distance
    from diffusion.metrics.reference_stats import load_statistics
    from diffusion.metrics.sample_quality import SampleQuality
    from diffusion.models import MLP, UNet
    from diffusion.training.loading import load_checkpoint
    from diffusion.training.module import DiffusionModule
    from diffusion.training.run_folders import latest_checkpoint
