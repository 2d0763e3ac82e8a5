"""Sampling a class-conditional checkpoint: class labels by sample index, per-class files and grids, the sample
CLI (one and two processes), guidance, the notebook and the guidance benchmark; unconditional models unchanged."""

import os
import re
import shutil
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
from helpers import QUICK, TINY_UNET, warm
from helpers.user_errors import error_line
from nbclient import NotebookClient
from PIL import Image

from diffusion.cli import evaluate
from diffusion.cli.sample import main as sample_main
from diffusion.cli.train import main
from diffusion.core.sampling import SamplingOptions
from diffusion.data.labels import class_labels
from diffusion.generation.ranks import generate
from diffusion.generation.render import rows_by_class
from diffusion.training.loading import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
CONDITIONAL = ["--config", str(REPO / "configs" / "digits_conditional.yaml")]
SAMPLE = ["--num_samples", "4", "--batch_size", "4", "--seed", "7", "--sampler", "ddim", "--steps", "3",
          "--device", "cpu"]  # fmt: skip


@pytest.fixture(scope="module")
def conditional_checkpoint(tmp_path_factory) -> Path:
    """last.ckpt of a tiny run of configs/digits_conditional.yaml (its grid: 4 samples, classes 0..3)."""
    save_dir = tmp_path_factory.mktemp("runs")
    main([*CONDITIONAL, *TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", str(save_dir)])
    return save_dir / "digits_conditional" / "version_0" / "checkpoints" / "last.ckpt"


# ---- sampling: labels, files, grids ----------------------------------------------------------------------
def test_class_labels_are_a_function_of_the_sample_index():
    assert class_labels(12, 10).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert class_labels(12, 10, "all").tolist() == class_labels(12, 10).tolist()
    assert class_labels(3, 10, "7").tolist() == [7, 7, 7] and class_labels(2, 3, 1).tolist() == [1, 1]
    assert class_labels(2, 3, "dog", ["cat", "dog", "emu"]).tolist() == [1, 1]
    assert class_labels(5, None) is None
    for bad in ("10", "-1", "cow"):
        with pytest.raises(ValueError, match=f"^class_label {bad} is not a class of this model — use 0..9"):
            class_labels(2, 10, bad)
    with pytest.raises(ValueError, match="unconditional"):
        class_labels(2, None, 3)


def test_rows_by_class_puts_each_class_on_its_own_row():
    images = torch.arange(5.0).view(5, 1, 1, 1) + 1
    arranged, per_row = rows_by_class(images, torch.tensor([1, 0, 1, 2, 1]))
    assert per_row == 3
    assert arranged.flatten().tolist() == [2, 0, 0, 1, 3, 5, 4, 0, 0]  # rows 0, 1, 2; blanks are 0


def test_sample_cli_writes_one_class_and_its_labels(conditional_checkpoint, tmp_path):
    path = sample_main(["--ckpt", str(conditional_checkpoint), "--out", str(tmp_path / "three"), *SAMPLE,
                        "--class_label", "3", "--guidance_scale", "2"])  # fmt: skip
    files = np.load(path)
    assert files["arr_0"].shape == (4, 8, 8, 1) and files["arr_0"].dtype == np.uint8
    assert files["arr_1"].tolist() == [3, 3, 3, 3] and files["arr_1"].dtype == np.int64
    # Sample i depends on (seed, i, its label): sample 3 of a run over all classes is sample 3 of this one.
    every = sample_main(["--ckpt", str(conditional_checkpoint), "--out", str(tmp_path / "all"),
                         *SAMPLE, "--num_samples", "12", "--class_label", "all",
                         "--guidance_scale", "2"])  # fmt: skip
    every = np.load(every)
    assert every["arr_1"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert np.abs(every["arr_0"][3].astype(int) - files["arr_0"][3].astype(int)).max() <= 1
    with Image.open(tmp_path / "all" / "grid.png") as grid:  # one row per class: 10 rows of 9 px + 1
        assert grid.height == 10 * 9 + 1
    # Its labels beside the images (arr_1, one per sample) are no second array of samples: evaluate reads it.
    assert evaluate.main(["--samples", str(path), "--reference", str(path), "--features", "pixels"])


def test_a_class_label_written_in_a_config_file_is_the_flags(conditional_checkpoint, tmp_path):
    """`class_label: 3` in a --config file is YAML's int 3: taken as `--class_label 3` (it was a union report)."""
    config = tmp_path / "sample.yaml"
    config.write_text("class_label: 3\n")
    path = sample_main(["--ckpt", str(conditional_checkpoint), "--out", str(tmp_path / "three"), *SAMPLE,
                        "--config", str(config)])  # fmt: skip
    assert np.load(path)["arr_1"].tolist() == [3, 3, 3, 3]


@pytest.mark.multiprocess
def test_two_processes_write_the_labels_and_samples_of_one(conditional_checkpoint, tmp_path):
    # 5 samples over 2 ranks in batches of 2: rank 1 draws samples 1, 3 and a padding sample 5, dropped.
    flags = ["--ckpt", str(conditional_checkpoint), *SAMPLE, "--num_samples", "5", "--batch_size", "2",
             "--guidance_scale", "2"]  # fmt: skip
    one = np.load(sample_main([*flags, "--out", str(tmp_path / "one")]))
    command = [sys.executable, "-m", "diffusion.sample", *[f for f in flags if f not in ("--device", "cpu")],
               "--devices", "2", "--accelerator", "cpu", "--out", str(tmp_path / "two")]  # fmt: skip
    result = warm.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                            text=True, timeout=300, ranks=2)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    two = np.load(tmp_path / "two" / "samples.npz")
    assert two["arr_1"].tolist() == one["arr_1"].tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(two["arr_0"], one["arr_0"])


def test_guidance_scale_changes_conditional_samples(conditional_checkpoint, tmp_path):
    runs = [np.load(sample_main(["--ckpt", str(conditional_checkpoint), "--out", str(tmp_path / str(scale)),
                                 *SAMPLE, "--class_label", "1", "--guidance_scale", str(scale)]))["arr_0"]
            for scale in (0.0, 1.0, 4.0)]  # fmt: skip
    assert not np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[1], runs[2])


def test_unconditional_checkpoints_write_no_arr_1(digits_checkpoint, tmp_path):
    # (Asking one for a class or for guidance is a user error: tests/cli/test_train_errors.py SAMPLE_CASES.)
    path = sample_main(["--ckpt", str(digits_checkpoint), "--out", str(tmp_path), *SAMPLE])
    assert np.load(path).files == ["arr_0"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--class_label", "10"],
            r"^error: --class_label 10 is not a class of this model — use 0..9, 'all' or a name in",
        ),
        (["--class_label", "cow"], r"^error: --class_label cow is not a class of this model"),
        (
            ["--guidance_scale", "-0.5"],
            r"--guidance_scale -0.5 is out of range \(must be a finite number >= 0\) — pass 0 for",
        ),
    ],
    ids=["class_10", "unknown_name", "negative_guidance"],
)
def test_bad_class_or_guidance_is_one_line_before_sampling(
    conditional_checkpoint, tmp_path, capsys, flags, expected
):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        sample_main(["--ckpt", str(conditional_checkpoint), "--out", str(out), *SAMPLE, *flags])
    assert exit_info.value.code == 2
    assert re.search(expected, error_line(capsys.readouterr().err))
    assert not out.exists()  # stopped before anything was sampled or written


def test_a_checkpoint_alone_samples_a_named_class(conditional_checkpoint, tmp_path):
    alone = tmp_path / "alone.ckpt"  # no config.yaml or hparams.yaml beside it
    shutil.copy(conditional_checkpoint, alone)
    module = load_checkpoint(alone)
    assert module.num_classes == 10 and module.hparams.class_names[3] == "3"
    assert module.sampling.guidance_scale == 1.5  # the recipe's default, kept in the checkpoint
    labels = class_labels(4, module.num_classes, "3", module.hparams.class_names)
    samples = generate(module, 4, sampler=module.sampler(SamplingOptions(steps=3)), seed=0, labels=labels)
    assert samples.shape == (4, 1, 8, 8) and torch.isfinite(samples).all()
    with pytest.raises(ValueError, match="0..9"):
        module.sample(2, seed=0, labels=torch.tensor([3, 10]))


def test_training_grid_has_one_row_per_class(conditional_checkpoint):
    grid = conditional_checkpoint.parents[1] / "samples" / "latest.png"
    with Image.open(grid) as image:  # QUICK draws 4 samples: classes 0..3, one each
        assert (image.width, image.height) == (1 * 9 + 1, 4 * 9 + 1)


# ---- unconditional models unchanged ----------------------------------------------------------------------
def test_unconditional_samples_refuse_guidance_and_old_checkpoints_load(digits_checkpoint, tmp_path):
    module = load_checkpoint(digits_checkpoint)
    reference = module.sample(3, seed=0, options=SamplingOptions(sampler="ddim", steps=3))
    # Guidance of a model without classes would be ignored: refused, in Python as --guidance_scale is.
    with pytest.raises(ValueError, match=r"^guidance_scale=3.0 must be unset \(or 1\) for an unconditional"):
        module.sample(3, seed=0, options=SamplingOptions(sampler="ddim", steps=3, guidance_scale=3.0))
    # A checkpoint written before labels existed has none of the new hyperparameters.
    checkpoint = torch.load(digits_checkpoint, weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    for key in ("label_dropout", "class_names"):
        del hparams[key]
    del hparams["network"]["init_args"]["num_classes"], hparams["sampling"]["guidance_scale"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    old = load_checkpoint(tmp_path / "old.ckpt")
    assert old.num_classes is None
    old_samples = old.sample(3, seed=0, options=SamplingOptions(sampler="ddim", steps=3))
    torch.testing.assert_close(old_samples, reference, rtol=0, atol=0)


# ---- the benchmark ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_guidance_benchmark_runs_on_its_own_and_reuses_a_finished_run(tmp_path, capsys):
    quality = [sys.executable, "benchmarks/quality/quality.py", "--quick", "--only", "digits_conditional"]
    trained = warm.run([*quality, "--out", str(tmp_path / "trained")], cwd=REPO, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    table = (tmp_path / "trained" / "quality_conditional.md").read_text()
    assert (
        "| 1.5 (default) |" in table and "| real digits (other half) |" in table and "every class >=" in table
    )
    assert "| digits |" not in table  # the unconditional recipes are not part of this section
    assert (tmp_path / "trained" / "digits_conditional_grid.png").stat().st_size > 0
    # Reusing the finished run: in this process (the script as a file ran above; a launch costs ~8 s of imports).
    from benchmarks.quality.quality import main as quality_main

    capsys.readouterr()
    quality_main(["--quick", "--only", "digits_conditional", "--reuse", str(tmp_path / "trained" / "runs"),
                  "--out", str(tmp_path / "reused")])  # fmt: skip
    assert "training reused" in (tmp_path / "reused" / "quality_conditional.md").read_text()
    assert "training:" not in capsys.readouterr().out  # nothing trained


# ---- the notebook ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_notebook_shows_a_grid_per_class_and_the_guidance_scale(conditional_checkpoint, monkeypatch):
    monkeypatch.setenv("CKPT", str(conditional_checkpoint))
    monkeypatch.setenv("NUM_SAMPLES", "4")
    monkeypatch.setenv("STEPS", "3")
    monkeypatch.setattr(sys, "executable", warm.python())  # the kernel forked warm, as in tests/notebooks
    notebook = nbformat.read(REPO / "notebooks" / "sample_from_checkpoint.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    text = "".join(output.get("text", "") for output in outputs)
    assert len(images) >= 4, "expected samples, trajectory, per-class grid and guidance-scale figures"
    assert "class-conditional: 10 classes" in text
