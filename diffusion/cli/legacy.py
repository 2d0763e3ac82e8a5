"""Class paths that configs of earlier versions name, so that their `config.yaml` still trains and resumes:
`diffusion.vectors.VectorDataModule`, `diffusion.callbacks.FIDCallback`, ... (`diffusion.data.ImageDataModule` and
`diffusion.models.UNet` kept their paths). A renamed class keeps its old name beside the new one in its module
(`diffusion.training.callbacks.FIDCallback` is `SampleQualityCallback`).

The old module names are aliases of the new modules, registered when a command parses a config, so jsonargparse
imports the same classes under either name; configs written from now on name the new paths.
"""

import importlib
import sys
from typing import Any

MOVED_MODULES = {
    "diffusion.vectors": "diffusion.data.vectors",
    "diffusion.callbacks": "diffusion.training.callbacks",
    "diffusion.module": "diffusion.training.module",
    "diffusion.training.callbacks.fid": "diffusion.training.callbacks.sample_quality",
}


def accept_moved_class_paths() -> None:
    """Let `diffusion.vectors.X` (and the other moved modules) name the classes they held."""
    for old, new in MOVED_MODULES.items():
        sys.modules.setdefault(old, importlib.import_module(new))


def same_class(saved_path: str, current_path: str) -> bool:
    """Whether two class paths name the same class, an old path and its new one included."""
    if saved_path == current_path:
        return True
    accept_moved_class_paths()
    try:
        return class_at(saved_path) is class_at(current_path)
    except (ImportError, AttributeError, ValueError):
        return False


def class_at(path: str) -> Any:
    """The class (or any object) a class path names: `diffusion.data.ImageDataModule`."""
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)
