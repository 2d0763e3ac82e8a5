"""`python -m diffusion.export`: a checkpoint exported to diffusers samples, in a fresh Python that imports only torch
and diffusers, what the model samples from the same noise; exported to safetensors, it loads as the checkpoint
does, and the script in docs/export.md samples it (bad inputs: tests/cli/test_export_errors.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_run
from PIL import Image

from diffusion.cli import export
from diffusion.core.sampling import SamplingOptions
from diffusion.training.loading import load_checkpoint

DOCS = Path(__file__).parents[2] / "docs" / "export.md"
T = 10


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny digits run with T = 10, its EMA and raw weights then replaced by random ones (different for each): a
    few training steps leave the zero-initialised layers near zero, and random weights make every layer count."""
    save_dir = tmp_path_factory.mktemp("runs")
    # beta_end 0.005: linear betas scaled by 1000 / T end at 0.5 (the default 0.02 would reach 1, refused)
    tiny_run(
        save_dir, "--model.num_timesteps", str(T), "--model.beta_end", "0.005", "--model.sampling.steps", "5"
    )
    path = save_dir / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    state = torch.load(path, weights_only=True)
    generator = torch.Generator().manual_seed(0)
    for key in ("state_dict", "current_model_state"):
        for name, value in state[key].items():
            if name.startswith("network."):
                state[key][name] = 0.2 * torch.randn(value.shape, generator=generator)
    random = path.with_name("random.ckpt")
    torch.save(state, random)
    return random


def our_images(module, seed: int, steps: int, n: int = 3) -> torch.Tensor:
    torch.manual_seed(seed)  # the global generator draws as a fresh generator seeded alike
    return (module.sample(n, options=SamplingOptions(sampler="ddpm", steps=steps)) * 0.5 + 0.5).clamp(0, 1)


# Only torch and diffusers: DDPM over all T steps and over 4 (respaced), 3 images each, from seeded generators.
FRESH_SESSION = """
import sys, torch
from diffusers import DDPMPipeline
pipe = DDPMPipeline.from_pretrained(sys.argv[1])
pipe.set_progress_bar_config(disable=True)
T = pipe.scheduler.config.num_train_timesteps
images = {steps: pipe(batch_size=3, generator=torch.Generator().manual_seed(7), num_inference_steps=steps,
                      output_type="pt").images for steps in (T, 4)}
torch.save(images, sys.argv[2])
print("imported:", sorted(name for name in sys.modules if name.split(".")[0] == "diffusion"))
"""


def test_a_diffusers_export_samples_in_a_fresh_python_as_the_model(checkpoint, tmp_path):
    out = export.main(
        ["--ckpt", str(checkpoint), "--format", "diffusers", "--out", str(tmp_path / "pipeline")]
    )
    result = subprocess.run(
        [sys.executable, "-c", FRESH_SESSION, str(out), str(tmp_path / "images.pt")], capture_output=True,
        text=True, timeout=600, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "imported: []" in result.stdout  # nothing of this project
    theirs = torch.load(tmp_path / "images.pt", weights_only=True)
    module = load_checkpoint(checkpoint)  # EMA, as exported
    for steps in (T, 4):
        ours = our_images(module, 7, steps)
        assert (ours[0] - ours[1]).abs().max() > 0.1  # samples, not a constant image
        torch.testing.assert_close(theirs[steps], ours, rtol=0, atol=1e-5)


@pytest.mark.parametrize("weights", ["ema", "raw"])
def test_a_safetensors_export_loads_as_the_checkpoint(checkpoint, tmp_path, weights):
    out = export.main(["--ckpt", str(checkpoint), "--format", "safetensors", "--out", str(tmp_path / "export"),
                       "--weights", weights])  # fmt: skip
    expected = load_checkpoint(checkpoint, weights=weights).state_dict()
    other = load_checkpoint(checkpoint, weights="raw" if weights == "ema" else "ema").state_dict()
    loaded = load_checkpoint(out).state_dict()
    assert loaded.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), key
    assert not torch.equal(loaded["network.conv_in.weight"], other["network.conv_in.weight"])
    config = json.loads((out / "config.json").read_text())
    assert config["weights"] == weights
    saved = torch.load(checkpoint, weights_only=True)["hyper_parameters"]
    # The same network: the export names it by its module path, a run's config by its public one (diffusion.UNet).
    assert config["hyper_parameters"]["network"]["init_args"] == saved["network"]["init_args"]
    assert (
        config["hyper_parameters"]["network"]["class_path"]
        == "diffusion.models." + saved["network"]["class_path"].rpartition(".")[2]
    )
    for key in (
        "num_timesteps",
        "beta_schedule",
        "normalization",
        "class_names",
        "prediction_type",
        "sampling",
    ):
        assert config["hyper_parameters"][key] == saved[key], key


def test_overwrite_replaces_an_earlier_export(checkpoint, tmp_path, capsys):
    out = tmp_path / "export"
    export.main(["--ckpt", str(checkpoint), "--format", "safetensors", "--out", str(out)])
    args = ["--ckpt", str(checkpoint), "--format", "safetensors", "--out", str(out), "--weights", "raw"]
    with pytest.raises(SystemExit):
        export.main(args)
    assert re.search(r"error: --out .*export is not empty — pass --overwrite", capsys.readouterr().err)
    assert json.loads((out / "config.json").read_text())["weights"] == "ema"
    export.main([*args, "--overwrite"])
    assert json.loads((out / "config.json").read_text())["weights"] == "raw"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no staging folder left behind


def test_the_script_in_the_docs_samples_an_export(checkpoint, tmp_path):
    # The docs' script reads export/ in the working folder (the test's tmp_path).
    export.main(["--ckpt", str(checkpoint), "--format", "safetensors", "--out", str(tmp_path / "export")])
    script = re.search(r"<!-- export-script -->\n```python\n(.*?)```", DOCS.read_text(), flags=re.S).group(1)
    assert len([line for line in script.splitlines() if line.strip()]) <= 13  # "a few lines"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with Image.open(tmp_path / "samples.png") as grid:  # 16 samples of 8 x 8, 4 per row, 2-pixel padding
        assert grid.size == (4 * 10 + 2, 4 * 10 + 2)
