"""`import diffusion` is the surface users write against: these names stay, each is the object of its deep path,
the notebook and the guides import only from it, and the deep paths they used before still work."""

import ast
import dataclasses
import importlib
import inspect
import json
import re
import subprocess
import sys
import typing
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


def type_checking_imports() -> dict[str, str]:
    """name -> module of the `TYPE_CHECKING` imports of diffusion/__init__.py: what editors and type checkers see
    (each `X as X`, which marks a re-export to them)."""
    tree = ast.parse((REPO / "diffusion" / "__init__.py").read_text())
    block = next(
        node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    imports = [
        (alias, str(node.module))
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    ]
    assert all(alias.asname == alias.name for alias, _ in imports), (
        "write each import as `X as X` (a re-export)"
    )
    return {alias.name: module for alias, module in imports}


def test_the_names_loaded_at_run_time_are_the_names_type_checkers_see():
    # `_PUBLIC` loads them; the TYPE_CHECKING imports beside it show them to editors: one may not drift from the other.
    assert type_checking_imports() == diffusion._PUBLIC


# Every callable of the surface, as its parameters' names, kinds and defaults (annotations left out): changing one is
# a decision made here, not an accident. A renamed or removed argument keeps its old form for a while with a
# DeprecationWarning (as generate's `options=`), and leaves this table only when that form goes.
SIGNATURES = {
    "Batch": "(x, index, label=-1)",
    "BitsPerDim": "(bits_per_dim, standard_error, prior, decoder, kl, num_images)",
    "DiffusionModule": (
        "(network, sample_shape=(1, 8, 8), normalization=None, beta_schedule='linear', num_timesteps=1000, "
        "beta_start=0.0001, beta_end=0.02, zero_terminal_snr=False, trained_betas=None, prediction_type='eps', "
        "loss_weighting='none', min_snr_gamma=5.0, lr=0.0002, warmup_steps=5000, lr_schedule='constant', "
        "adam_betas=(0.9, 0.999), weight_decay=0.0, sampling=SamplingOptions(sampler=None, steps=None, "
        "clip_denoised=None, guidance_scale=None, spacing=None, compile=None, variance=None, eta=None, "
        "s_churn=None, s_tmin=None, s_tmax=None, s_noise=None), noise_mode='fast', noise_seed=None, init_from=None, "
        "compile_training=False, compile=None, compile_mode=None, compile_channels_last=False, label_dropout=0.0, "
        "class_names=None, variance='fixed', offset_noise=0.0)"
    ),
    "ImageDataModule": (
        "(dataset='digits', root='data', image_size=None, channels=None, random_flip=None, batch_size=64, "
        "num_workers=0, val_fraction=0.05, seed=0, val_from_train=None, verify=False, conditional=False, "
        "on_device=True, cache_dir=None, max_cache_size=None)"
    ),
    "IndexedDataset": "(base, transform=None, with_labels=False)",
    "MLP": (
        "(in_channels=2, hidden_dim=256, num_blocks=4, time_embed_dim=128, dropout=0.0, fourier_frequencies=0, "
        "num_classes=None, out_channels=None)"
    ),
    "NoiseSchedule": (
        "(beta_schedule='linear', num_timesteps=1000, beta_start=0.0001, beta_end=0.02, zero_terminal_snr=False, "
        "trained_betas=None)"
    ),
    "SampleQuality": (
        "(features='inception', metrics=('fid', 'kid'), *, channels=3, reference=None, kid_subset_size=1000, "
        "kid_subsets=100, is_splits=10, inception_weights=None, **metric_kwargs)"
    ),
    "SamplingOptions": (
        "(sampler=None, steps=None, clip_denoised=None, guidance_scale=None, spacing=None, compile=None, "
        "variance=None, eta=None, s_churn=None, s_tmin=None, s_tmax=None, s_noise=None)"
    ),
    "UNet": (
        "(in_channels=1, channels=64, channel_mult=(1, 2, 2), num_res_blocks=2, attention_levels=(1,), dropout=0.0, "
        "num_heads=1, out_channels=None, num_classes=None, checkpoint_levels=())"
    ),
    "UserError": "(problem, fix, owner=None)",
    "VectorDataModule": (
        "(dataset='swiss_roll', path=None, num_samples=10000, dim=16, noise=0.05, batch_size=256, num_workers=0, "
        "val_fraction=0.05, seed=0, normalize='standardize', feature_std=3.0, labels=None, on_device=True, "
        "cache_dir=None, max_cache_size=None)"
    ),
    "class_labels": "(num_samples, num_classes, class_label=None, class_names=None)",
    "denormalize": "(x, normalization)",
    "final_sample": "(steps)",
    "frechet_distance": "(mu1, sigma1, mu2, sigma2)",
    "generate": (
        "(module, num_samples, *, sampler=None, seed=0, batch_size=256, rank=0, world_size=1, progress=False, "
        "uint8_images=False, labels=None, options=None)"
    ),
    "latest_checkpoint": "(save_dir, name)",
    "load_checkpoint": "(path, weights=None, map_location='cpu')",
    "load_statistics": "(path)",
    "reverse_steps": (
        "(model, schedule, x_T, *, prediction_type='eps', generator=None, progress=False, labels=None, "
        "learned_variance=False, **options)"
    ),
    "rows_by_class": "(images, labels, per_class=None)",
    "save_image_grid": "(images, path, nrow=None)",
    "to_uint8": "(x, normalization)",
}
NOT_CALLABLE = {"SAMPLERS"}  # the registry: a dict, name -> sampler class

# SamplingOptions' fields, their types and defaults: the config keys of every recipe and checkpoint.
SAMPLING_OPTIONS_FIELDS = {
    "sampler": "Optional[Literal['ddpm', 'ddim', 'dpmpp_2m', 'dpmpp_2m_sde', 'heun', 'euler_ancestral']]",
    "steps": "int | None",
    "clip_denoised": "bool | None",
    "guidance_scale": "float | None",
    "spacing": "Optional[Literal['uniform', 'trailing', 'log_snr', 'karras']]",
    "compile": "bool | None",
    "variance": "Optional[Literal['fixedlarge', 'fixedsmall', 'learned_range']]",
    "eta": "float | None",
    "s_churn": "float | None",
    "s_tmin": "float | None",
    "s_tmax": "float | None",
    "s_noise": "float | None",
}


def without_annotations(thing: object) -> str:
    signature = inspect.signature(thing)
    parameters = [p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty))


def test_the_public_signatures_stay():
    assert sorted([*SIGNATURES, *NOT_CALLABLE]) == sorted(diffusion.__all__)
    changed = {
        name: without_annotations(getattr(diffusion, name))
        for name in SIGNATURES
        if without_annotations(getattr(diffusion, name)) != SIGNATURES[name]
    }
    assert changed == {}, (
        "a public signature changed: keep the old form working (deprecated), then update SIGNATURES"
    )


def test_the_sampling_options_fields_stay():
    from diffusion import SamplingOptions

    written = {f.name: str(f.type).replace("typing.", "") for f in dataclasses.fields(SamplingOptions)}
    assert written == SAMPLING_OPTIONS_FIELDS
    assert all(f.default is None for f in dataclasses.fields(SamplingOptions))


def test_the_sampling_options_are_every_samplers_options():
    # SamplingOptions is written out field by field (what editors and type checkers read); the samplers declare
    # their options themselves: this holds the two equal, so a sampler's new option needs its field.
    from diffusion.core.sampling import OPTION_OWNERS, SamplerName, SamplingOptions, option_types

    assert typing.get_args(SamplerName) == tuple(diffusion.SAMPLERS)
    declared = {f.name: f.type for f in dataclasses.fields(SamplingOptions)}
    assert list(declared) == ["sampler", *OPTION_OWNERS]
    assert declared["sampler"] == SamplerName | None
    assert {name: declared[name] for name in OPTION_OWNERS} == {
        name: kind | None for name, kind in option_types().items()
    }


def tiny_vector_model() -> "diffusion.DiffusionModule":
    """A 20-step vector model whose checkpoint options name DDIM-3: an untrained MLP, its weights drawn at random
    (its last layer starts at zero, which would predict no noise at all and make samplers agree)."""
    from diffusion import MLP, DiffusionModule, SamplingOptions

    torch.manual_seed(0)
    module = DiffusionModule(
        MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8), sample_shape=(2,), num_timesteps=20,
        normalization={"shift": [0.0, 0.0], "scale": [1.0, 1.0]}, sampling=SamplingOptions(sampler="ddim", steps=3),
    )  # fmt: skip
    with torch.no_grad():
        for weight in module.network.parameters():
            weight.normal_(0, 0.5)
    return module


def test_generate_without_a_sampler_draws_with_the_checkpoints_own():
    from diffusion import SamplingOptions, generate

    module = tiny_vector_model()
    own = generate(module, 4, seed=0)
    torch.testing.assert_close(own, generate(module, 4, sampler=module.sampler(), seed=0), rtol=0, atol=0)
    # The checkpoint's DDIM-3, not the samplers' default (DDPM over all 20 steps): the two differ.
    ddpm = generate(module, 4, sampler=module.sampler(SamplingOptions(sampler="ddpm")), seed=0)
    assert not torch.allclose(own, ddpm)


def test_the_options_form_of_generate_still_works_with_a_deprecation_warning():
    from diffusion import SamplingOptions, generate

    module = tiny_vector_model()
    options = SamplingOptions(sampler="ddpm", steps=4)  # not the checkpoint's DDIM-3
    with pytest.warns(
        DeprecationWarning, match=r"options=\.\.\.\) is deprecated; pass sampler=module.sampler\(options\)"
    ):
        old = generate(module, 3, options=options, seed=1)
    new = generate(module, 3, sampler=module.sampler(options), seed=1)
    torch.testing.assert_close(old, new, rtol=0, atol=0)
    assert not torch.allclose(old, generate(module, 3, seed=1))  # the options were not ignored


def test_the_readmes_python_block_runs(digits_checkpoint):
    # As printed, on a checkpoint of the default recipe (its own sampler: dpmpp_2m_sde-20), with its path, and 4
    # samples and 2 DDIM steps for 64 and 50 (seconds, not a minute, on two busy cores).
    block = re.search(r"## From Python\n\n```python\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(
        1
    )
    assert "generate(module, 64, seed=0)" in block  # the simplest form comes first
    for printed, here in [("runs/digits/version_0/checkpoints/last.ckpt", str(digits_checkpoint)),
                          ("generate(module, 64,", "generate(module, 4,"), ("steps=50", "steps=2")]:  # fmt: skip
        assert printed in block
        block = block.replace(printed, here)
    names: dict = {}
    exec(block, names)
    assert names["images"].shape == (4, 1, 8, 8) and names["images"].dtype == torch.uint8
    assert names["samples"].shape == (4, 1, 8, 8)
