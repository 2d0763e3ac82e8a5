"""`import diffusion` is the surface users write against: these names stay, each is the object of its deep path,
the notebook and the guides import only from it, and the deep paths they used before still work."""

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import diffusion

REPO = Path(__file__).resolve().parents[1]

SURFACE = [
    "Batch", "BitsPerDim", "DiffusionModule", "ImageDataModule", "IndexedDataset", "MLP", "NoiseSchedule",
    "SAMPLERS", "SampleQuality", "SamplingOptions", "UNet", "UserError", "VectorDataModule", "class_labels",
    "denormalize", "final_sample", "frechet_distance", "generate", "latest_checkpoint", "load_checkpoint", "load_statistics",
    "reverse_steps", "rows_by_class", "save_image_grid", "to_uint8",
]  # fmt: skip

# What the notebook and docs imported before the surface existed: user code written against them keeps working.
DEEP_PATHS = {
    "diffusion.core.sampling": ["SAMPLERS", "SamplingOptions", "final_sample", "reverse_steps"],
    "diffusion.generation.ranks": ["generate"],
    "diffusion.generation.render": ["denormalize", "to_uint8", "rows_by_class"],
    "diffusion.training.loading": ["load_checkpoint"],
    "diffusion.training.run_folders": ["latest_checkpoint"],
    "diffusion.data.labels": ["class_labels"],
    "diffusion.core.schedule": ["NoiseSchedule"],
    "diffusion.models": ["UNet"],
}


def test_the_public_names_stay():
    assert sorted(diffusion.__all__) == sorted(SURFACE)
    assert sorted(diffusion._PUBLIC) == sorted(SURFACE)


@pytest.mark.parametrize("name", SURFACE)
def test_each_public_name_is_the_object_of_its_deep_path(name):
    value = getattr(diffusion, name)
    assert value is not None
    home = importlib.import_module(diffusion._PUBLIC[name])
    assert getattr(home, name) is value
    assert name in dir(diffusion)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'load_ckpt'"):
        diffusion.load_ckpt  # noqa: B018


@pytest.mark.parametrize("module", DEEP_PATHS)
def test_the_deep_paths_users_imported_still_work(module):
    imported = importlib.import_module(module)
    for name in DEEP_PATHS[module]:
        assert hasattr(imported, name), f"{module}.{name}"


def test_a_fresh_interpreter_loads_only_what_it_imports():
    # The names load on first use: a script that needs only the schedule does not pay for Lightning. Then the whole
    # project, the export and the diffusers-layout UNet included: diffusers (an optional extra) loads only when an
    # export or a diffusers folder is read. One cold interpreter for both, in that order.
    code = (
        "import sys; from diffusion import NoiseSchedule, reverse_steps; print('lightning' in sys.modules); "
        "import diffusion.cli.export, diffusion.cli.train, diffusion.training.loading, "
        "diffusion.models.diffusers_unet; print('lightning' in sys.modules, 'diffusers' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == ["False", "True", "False"], result.stderr[-3000:]


def python_in_docs() -> dict[str, str]:
    """The notebook's code cells and every ```python block of the README and docs/, by where they are."""
    sources = {}
    for cell_index, cell in enumerate(
        json.loads((REPO / "notebooks" / "sample_from_checkpoint.ipynb").read_text())["cells"]
    ):
        if cell["cell_type"] == "code":
            sources[f"notebook cell {cell_index}"] = "".join(cell["source"]).replace("%matplotlib inline", "")
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block_index, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S)):
            sources[f"{path.name} block {block_index}"] = block
    return sources


def test_the_notebook_and_the_guides_import_only_the_public_names():
    deep = []
    for where, source in python_in_docs().items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("diffusion."):
                deep.append(f"{where}: from {node.module} import ...")
            elif isinstance(node, ast.ImportFrom) and node.module == "diffusion":
                deep += [f"{where}: {a.name} is not public" for a in node.names if a.name not in SURFACE]
    assert not deep, deep
    assert any("from diffusion import" in source for source in python_in_docs().values())


def test_a_checkpoint_samples_through_the_public_names(digits_checkpoint):
    from diffusion import SamplingOptions, generate, load_checkpoint, to_uint8

    module = load_checkpoint(digits_checkpoint)
    samples = generate(module, 3, sampler=module.sampler(SamplingOptions(sampler="ddim", steps=2)), seed=0)
    assert samples.shape == (3, *module.sample_shape)
    assert to_uint8(samples, module.normalization).dtype == torch.uint8
    # The same samples as the module's own sampling of samples 0..2: the surface adds nothing of its own.
    again = module.sample(3, seed=0, options=SamplingOptions(sampler="ddim", steps=2))
    torch.testing.assert_close(samples, again)
