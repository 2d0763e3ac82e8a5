"""DDPM training and sampling on PyTorch Lightning: the names a user's code and notebooks reach for.

    from diffusion import SamplingOptions, generate, load_checkpoint

    module = load_checkpoint("runs/digits/version_0/checkpoints/last.ckpt")  # or an export, or a diffusers folder
    samples = generate(module, 64, seed=0)  # with the checkpoint's own sampler
    ddim = module.sampler(SamplingOptions(sampler="ddim", steps=50))  # another, over the checkpoint's defaults
    samples = generate(module, 64, sampler=ddim, seed=0)

Each name lives in one of the package's layers (docs/layout.md), bottom to top: errors -> core -> models ->
data -> generation and metrics -> training -> cli. The names below are imported on first use (PEP 562), so
`import diffusion.core.schedule` stays as light as it was; their deep paths keep working. They are written twice,
side by side: `_PUBLIC` (name -> module, what loads them at run time) and the imports of the `TYPE_CHECKING` block
beside it (what editors and type checkers read); tests/test_public_api.py holds the two equal and pins the list and
the signatures of the functions in it: a name or argument removed or renamed fails it.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

# name -> the module it is loaded from on first use; the same names, from the same modules, as the imports of the
# `TYPE_CHECKING` block below it (tests/test_public_api.py holds the two equal).
_PUBLIC = {
    "SAMPLERS": "diffusion.core.sampling",
    "SamplingOptions": "diffusion.core.sampling",
    "final_sample": "diffusion.core.sampling",
    "reverse_steps": "diffusion.core.sampling",
    "NoiseSchedule": "diffusion.core.schedule",
    "Batch": "diffusion.data",
    "ImageDataModule": "diffusion.data",
    "IndexedDataset": "diffusion.data",
    "VectorDataModule": "diffusion.data",
    "class_labels": "diffusion.data.labels",
    "UserError": "diffusion.errors",
    "generate": "diffusion.generation.ranks",
    "denormalize": "diffusion.generation.render",
    "rows_by_class": "diffusion.generation.image_grid",
    "save_image_grid": "diffusion.generation.image_grid",
    "to_uint8": "diffusion.generation.render",
    "BitsPerDim": "diffusion.metrics.bits_per_dim",
    "frechet_distance": "diffusion.metrics.fid",
    "load_statistics": "diffusion.metrics.reference_stats",
    "SampleQuality": "diffusion.metrics.sample_quality",
    "MLP": "diffusion.models",
    "UNet": "diffusion.models",
    "load_checkpoint": "diffusion.training.loading",
    "DiffusionModule": "diffusion.training.module",
    "latest_checkpoint": "diffusion.training.run_folders",
}

# The public names: what editors and type checkers see. At run time nothing here is imported (the names load on
# first use, from `_PUBLIC` just above, which names the same modules). `X as X` marks a re-export. What they are:
# loading and sampling: load_checkpoint (a checkpoint, an export or a diffusers folder), latest_checkpoint (the
#   newest of a run name), generate (samples 0..N-1, the same on any number of ranks), SamplingOptions (unset
#   fields defer), SAMPLERS (name -> class), reverse_steps / final_sample (a sampler on a bare network),
#   class_labels (labels for N samples of a class-conditional model);
# samples as pictures and data units: denormalize, to_uint8, rows_by_class, save_image_grid;
# training: DiffusionModule, NoiseSchedule, the networks UNet and MLP, the data modules and their Batch;
# metrics: SampleQuality (FID, KID and IS against reference images), frechet_distance, BitsPerDim, load_statistics;
# UserError, which every layer raises for a user's mistake: one line, what is wrong and the fix.
if TYPE_CHECKING:
    from diffusion.core.sampling import SAMPLERS as SAMPLERS
    from diffusion.core.sampling import SamplingOptions as SamplingOptions
    from diffusion.core.sampling import final_sample as final_sample
    from diffusion.core.sampling import reverse_steps as reverse_steps
    from diffusion.core.schedule import NoiseSchedule as NoiseSchedule
    from diffusion.data import Batch as Batch
    from diffusion.data import ImageDataModule as ImageDataModule
    from diffusion.data import IndexedDataset as IndexedDataset
    from diffusion.data import VectorDataModule as VectorDataModule
    from diffusion.data.labels import class_labels as class_labels
    from diffusion.errors import UserError as UserError
    from diffusion.generation.image_grid import rows_by_class as rows_by_class
    from diffusion.generation.image_grid import save_image_grid as save_image_grid
    from diffusion.generation.ranks import generate as generate
    from diffusion.generation.render import denormalize as denormalize
    from diffusion.generation.render import to_uint8 as to_uint8
    from diffusion.metrics.bits_per_dim import BitsPerDim as BitsPerDim
    from diffusion.metrics.fid import frechet_distance as frechet_distance
    from diffusion.metrics.reference_stats import load_statistics as load_statistics
    from diffusion.metrics.sample_quality import SampleQuality as SampleQuality
    from diffusion.models import MLP as MLP
    from diffusion.models import UNet as UNet
    from diffusion.training.loading import load_checkpoint as load_checkpoint
    from diffusion.training.module import DiffusionModule as DiffusionModule
    from diffusion.training.run_folders import latest_checkpoint as latest_checkpoint

__all__ = sorted(_PUBLIC)  # `from diffusion import *`


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'diffusion' has no attribute {name!r}")
    value = getattr(import_module(_PUBLIC[name]), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
