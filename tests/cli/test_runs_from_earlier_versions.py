"""What users trained with an earlier version keeps working: two run folders written by the code before the package
was split into layers (tests/fixtures/runs_made_at_06c7fb7: a digits UNet whose config names
`diffusion.data.ImageDataModule`, a toy 2-D MLP whose config names `diffusion.vectors.VectorDataModule`) train on
from their checkpoints with their own config.yaml, start new runs from that config, sample with `python -m
diffusion.sample` and load with `load_checkpoint`; class paths that configs of earlier versions name still name
their classes."""

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import warm

from diffusion.cli.legacy import same_class
from diffusion.cli.train import main as train
from diffusion.core.sampling import SamplingOptions
from diffusion.training.loading import load_checkpoint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs_made_at_06c7fb7"
REPO = FIXTURES.parents[2]
RUNS = ["digits", "toy2d"]


@pytest.fixture
def old_runs(tmp_path, monkeypatch) -> Path:
    """A copy of the old run folders under ./runs (their configs write to save_dir `runs`)."""
    shutil.copytree(FIXTURES, tmp_path / "runs", ignore=shutil.ignore_patterns("README.md"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "runs"


@pytest.mark.parametrize("name", RUNS)
def test_an_old_run_resumes_with_its_own_config(old_runs, name, capsys):
    run = old_runs / name / "version_0"
    config_before = (run / "config.yaml").read_text()
    resume = ["--config", str(run / "config.yaml"), "--ckpt_path", "last", "--max_steps", "6"]
    if name == "digits":
        # Its config's `image_size: null` meant digits at 16x16 when it was written (the native 8x8 now): resumed at
        # 8x8 without a word before; said, with the flag that resumes it as it trained.
        with pytest.raises(SystemExit):
            train(resume)
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "error: --ckpt_path runs/digits/version_0/checkpoints/last.ckpt trained on samples of shape (1, 16, 16), and the "
            "data now gives (1, 8, 8) — resume it on the data it trained on (e.g. --data.image_size 16), or train "
            "this data as a new run, without --ckpt_path (--model.init_from starts it from these weights)"
        )
        resume += ["--data.image_size", "16"]
    train(resume)
    resumed = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 6
    assert (run / "config.yaml").read_text() == config_before  # the run's own config is kept as it was
    assert (run / "config-resumed-at-step-4.yaml").is_file()
    assert not (old_runs / name / "version_1").exists()  # it went on in the same folder


@pytest.mark.parametrize("name", RUNS)
def test_an_old_config_starts_a_new_run(old_runs, name):
    train(["--config", str(old_runs / name / "version_0" / "config.yaml"), "--max_steps", "2"])
    assert (old_runs / name / "version_1" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("name", RUNS)
def test_an_old_checkpoint_samples_with_the_sample_command_and_loads(old_runs, name):
    checkpoint = old_runs / name / "version_0" / "checkpoints" / "last.ckpt"
    out = old_runs.parent / f"samples_{name}"
    result = warm.run(
        [sys.executable, "-m", "diffusion.sample", "--ckpt", str(checkpoint), "--num_samples", "4",
         "--sampler", "ddim", "--steps", "3", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    samples = np.load(out / "samples.npz")["arr_0"]
    assert samples.shape == ((4, 16, 16, 1) if name == "digits" else (4, 2))
    module = load_checkpoint(checkpoint)
    # Its own sampler (none was saved: the default, DDPM), on 10 steps: all 1,000 cost 20 s of CPU with the UNet,
    # and they are tests/training/test_learned_variance_training.py's on toy2d's run.
    assert module.sample(2, seed=0, options=SamplingOptions(steps=10)).isfinite().all()


@pytest.mark.parametrize(
    "old_path",
    [
        "diffusion.training.callbacks.FIDCallback",
        "diffusion.training.callbacks.fid.FIDCallback",
        "diffusion.callbacks.FIDCallback",
    ],
)
def test_a_renamed_callback_keeps_its_old_class_paths(old_path):
    assert same_class(old_path, "diffusion.training.callbacks.SampleQualityCallback")
