"""Every user error of the three commands ends in one line, `error: <what is wrong> — <how to fix it>`, on
stderr with exit status 2 and no traceback, before training or sampling time is spent; nothing the user had
(checkpoints, samples, run folders) changes, and a run that fails before its first step leaves no folder.

Most cases call `main([...])` in-process (seconds each); a few run the real commands in a subprocess to prove
the no-traceback contract end to end. `DIFFUSION_DEBUG=1` / `--debug` bring the traceback back.
"""

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import QUICK, TINY_MLP, TINY_UNET
from PIL import Image
from torch import nn

from diffusion import evaluate, sample
from diffusion.checkpoints import load_checkpoint
from diffusion.cli import main as train
from diffusion.errors import UserError, one_line, reporting_user_errors

REPO = Path(__file__).parents[1]
CONFIGS = REPO / "configs"


def error_line(stderr: str) -> str:
    """The one `error:` line of a command's stderr, checked: the only one, the last line, no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr[-3000:]
    return errors[0]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file (a digest of its bytes) and folder under `folder`: what the user had."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        if path.is_file()
        else "/"
        for path in sorted(folder.rglob("*"))
    }


@pytest.fixture(scope="module")
def user(tmp_path_factory, digits_checkpoint, toy2d_checkpoint) -> Path:
    """A user's folder: two finished runs, broken checkpoint files, bare weights, a samples folder, a file,
    an image folder with one corrupt image, and two broken configs."""
    home = tmp_path_factory.mktemp("user")
    shutil.copytree(digits_checkpoint.parents[1], home / "runs" / "digits" / "version_0")
    shutil.copytree(toy2d_checkpoint.parents[1], home / "runs" / "toy2d" / "version_0")
    good = home / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    (home / "truncated.ckpt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (home / "empty.ckpt").write_bytes(b"")
    (home / "random.ckpt").write_bytes(np.random.default_rng(0).bytes(5000))
    torch.save(load_checkpoint(good).network.state_dict(), home / "weights.pt")
    (home / "a_file").write_text("not a folder")
    (home / "samples").mkdir()
    np.savez(home / "samples" / "samples.npz", np.zeros((4, 16, 16, 1), np.uint8))
    (home / "images").mkdir()
    for i in range(6):
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(home / "images" / f"{i}.png")
    (home / "images" / "broken.png").write_bytes(b"definitely not a png")
    (home / "bad.yaml").write_text("trainer: [\n")
    (home / "typo.yaml").write_text("trainer:\n  max_step: 3\n")
    return home


def fill(flags: list[str], user: Path) -> list[str]:
    return [flag.format(user=user, configs=CONFIGS) for flag in flags]


def train_args(flags: list[str], user: Path, save_dir: Path) -> list[str]:
    """The tiny quick run with `flags`; a --config first, since a config file overrides the flags before it."""
    flags = fill(flags, user)
    config = flags[:2] if flags[:1] == ["--config"] else []
    network = TINY_MLP if "toy2d" in "".join(config) else TINY_UNET
    save = ["--trainer.logger.init_args.save_dir", str(save_dir)]
    return [*config, *network, *QUICK, *save, *flags[len(config) :]]


def run_in_process(command, args: list[str], user: Path, capsys) -> str:
    """Run a command's main, check exit status 2, the one line and that the user's files are unchanged."""
    before = snapshot(user)
    with pytest.raises(SystemExit) as exit_info:
        command(args)
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert snapshot(user) == before
    return line


FOLDER = ["--config", "{configs}/folder.yaml", "--data.root", "{user}/images", "--data.image_size", "8",
          "--data.val_fraction", "0"]  # fmt: skip
TRAIN_CASES = {  # id: (flags, what the line must say)
    "batch_size_0": (
        ["--data.batch_size", "0"],
        r"--data.batch_size 0 is out of range — pass an integer >= 1",
    ),
    "accumulate_0": (["--accumulate_grad_batches", "0"], r"accumulate_grad_batches 0 is out of range"),
    "val_check_interval_0": (["--trainer.val_check_interval", "0"], r"val_check_interval 0 is out of range"),
    "sample_grid_steps_0": (["--sample_grid.sampling.steps", "0"], r"steps=0 must be >= 1"),
    "eta_2": (["--model.sampling.eta", "2"], r"eta=2.0 must be in \[0, 1\]"),
    "lr_not_a_number": (["--model.lr", "abc"], r"--model.lr abc is not a valid float"),
    "lr_negative": (["--model.lr", "-1"], r"lr > 0.*lr=-1"),
    "num_workers_negative": (["--data.num_workers", "-1"], r"num_workers must be >= 0, got -1"),
    "unknown_flag": (["--max_step", "3"], r"unrecognized arguments: --max_step"),
    "unknown_choice": (["--data.dataset", "imagenet"], r"--data.dataset imagenet .*choose one of 'digits'"),
    # --precision is a union of Literals: each value once, no parser internals.
    "precision_not_a_choice": (
        ["--precision", "17"],
        r"--trainer.precision 17 is not one of the choices — choose one of 64, 32, 16, [^\]]*'bf16-mixed'[^\]]*$",
    ),
    "devices_0": (["--devices", "0"], r"--devices 0 is not a number of devices — pass a count >= 1"),
    "devices_not_a_number": (["--devices", "abc"], r"--devices abc is not a number of devices"),
    "devices_gpu_indices_on_cpu": (
        ["--accelerator", "cpu", "--devices", "0,1"],
        r"--devices 0,1 lists GPU indices, but this run is on the CPU — pass a number of processes",
    ),
    "strategy_unknown": (
        ["--strategy", "ddpx"],
        r"--strategy ddpx is not a Lightning strategy — pass auto, ddp",
    ),
    "num_nodes_0": (["--num_nodes", "0"], r"--trainer.num_nodes 0 is out of range — pass an integer >= 1"),
    # Lightning skips clipping for a value <= 0: -1 would silently train unclipped.
    "gradient_clip_negative": (
        ["--trainer.gradient_clip_val", "-1"],
        r"gradient_clip_val -1.0 is out of range",
    ),
    "missing_config": (["--config", "{user}/nope.yaml"], r"--config: .*nope.yaml"),
    "broken_yaml": (["--config", "{user}/bad.yaml"], r"Problems parsing config.* — fix the YAML"),
    "config_typo": (["--config", "{user}/typo.yaml"], r"'max_step'"),
    "missing_data_file": (
        ["--config", "{configs}/toy2d.yaml", "--data.path", "{user}/nope.npy"],
        r"nope\.npy",
    ),
    "data_file_not_an_array": (
        ["--config", "{configs}/toy2d.yaml", "--data.path", "{user}/a_file"],
        r"a_file",
    ),
    "missing_image_folder": (
        [*FOLDER[:3], "{user}/nope", *FOLDER[4:]],
        r"image folder .*nope does not exist",
    ),
    "image_size_vs_unet": (["--data.image_size", "9"], r"image size 9x9 is not divisible by 2"),
    "guidance_negative": (["--model.sampling.guidance_scale", "-1"], r"guidance_scale=-1.0 must be a finite"),
    "label_dropout_1": (
        ["--data.conditional", "true", "--model.label_dropout", "1"],
        r"label_dropout=1.0 must be",
    ),
    "label_dropout_unconditional": (["--model.label_dropout", "0.1"], r"needs a class-conditional network"),
    "conditional_loose_images": (
        [*FOLDER, "--data.conditional", "true"],
        r"lie directly in .*images.* — move them into a class folder",
    ),
    "logger_dir_is_a_file": (["--trainer.logger.init_args.save_dir", "{user}/a_file"], r"a_file is a file"),
    "checkpoint_dir_under_a_file": (["--checkpoint.dirpath", "{user}/a_file/ckpts"], r"a_file is a file"),
    "resume_truncated": (["--ckpt_path", "{user}/truncated.ckpt"], r"truncated.ckpt is truncated or not"),
    "resume_empty": (["--ckpt_path", "{user}/empty.ckpt"], r"empty.ckpt is empty \(0 bytes\)"),
    "resume_random_bytes": (["--ckpt_path", "{user}/random.ckpt"], r"random.ckpt is truncated or not"),
    "resume_a_folder": (
        ["--ckpt_path", "{user}/runs/digits"],
        r"is a folder, not a checkpoint file — pass .*last",
    ),
    "resume_missing": (["--ckpt_path", "{user}/nope.ckpt"], r"no checkpoint at .*nope.ckpt"),
    "resume_last_of_no_run": (
        ["--ckpt_path", "last", "--trainer.logger.init_args.name", "none"],
        r"train first",
    ),
    "resume_vector_run": (
        ["--ckpt_path", "{user}/runs/toy2d/version_0/checkpoints/last.ckpt"],
        r"another kind of run: MLP on samples of shape \(2,\), while this config has UNet.* — resume it with its "
        r"own config: --config .*toy2d/version_0/config.yaml",
    ),
    "init_from_vector_run": (
        ["--model.init_from", "{user}/runs/toy2d/version_0/checkpoints/last.ckpt"],
        r"holds MLP weights .*but this config's network is UNet",
    ),
    "init_from_other_widths": (
        ["--model.init_from", "{user}/weights.pt", "--model.network.init_args.channels", "16"],
        r"weights\.pt: these weights do not fit UNet.*\(\d+ of another shape \(e\.g\. ",
    ),
    "init_from_truncated": (["--model.init_from", "{user}/truncated.ckpt"], r"truncated.ckpt is truncated"),
    # These fail inside fit, before the first step: the run folder they started is removed again.
    "true_half_precision": (["--precision", "16-true"], r"precision=16-true is not supported"),
    "cosine_without_an_end": (
        ["--model.lr_schedule", "cosine", "--max_steps", "-1", "--max_epochs", "-1"],
        r"lr_schedule=cosine decays to the run's last step: set trainer.max_steps",
    ),
    # Without --data.verify this run would succeed: its one step of batch 1 draws a good image (4.png).
    "verify_finds_a_corrupt_image": (
        [*FOLDER, "--data.verify", "true", "--data.batch_size", "1", "--max_steps", "1"],
        r"cannot read image .*broken\.png",
    ),
    "corrupt_image_in_a_worker": (
        [*FOLDER, "--data.batch_size", "8", "--data.num_workers", "1"],
        r"^error: cannot read image .*broken\.png.*Remove or replace the file\.$",
    ),
}


if not torch.cuda.is_available():  # Lightning raises "No supported gpu backend found!" without a fix
    TRAIN_CASES["accelerator_gpu_without_one"] = (
        ["--accelerator", "gpu"],
        r"--accelerator gpu: torch sees no CUDA GPU on this machine — train on the CPU with --accelerator cpu",
    )
if importlib.util.find_spec("torch_xla") is None:  # Lightning raises a ModuleNotFoundError with a traceback
    TRAIN_CASES["accelerator_tpu_without_xla"] = (["--accelerator", "tpu"], r"tpu needs torch_xla")
if Path("/proc/self").is_dir():  # Linux: a folder nobody can write into, root included
    TRAIN_CASES["checkpoint_dir_unwritable"] = (
        ["--checkpoint.dirpath", "/proc/ckpts"],
        r"cannot write into /proc",
    )


@pytest.mark.parametrize(("flags", "expected"), TRAIN_CASES.values(), ids=TRAIN_CASES.keys())
def test_train_reports_a_bad_input_in_one_line(flags, expected, user, capsys):
    assert re.search(expected, run_in_process(train, train_args(flags, user, user / "runs"), user, capsys))


SAMPLE_CASES = {
    "num_samples_0": (["--num_samples", "0"], r"--num_samples 0 is out of range — pass a value > 0"),
    "batch_size_0": (["--batch_size", "0"], r"--batch_size 0 is out of range"),
    "devices_0": (["--devices", "0"], r"--devices 0 is out of range"),
    "steps_0": (["--steps", "0"], r"--steps 0 is out of range — pass a value > 0"),
    "eta_negative": (["--eta", "-1"], r"--eta -1 is out of range — pass a value >= 0 and <= 1"),
    "eta_100": (["--eta", "100"], r"--eta 100 is out of range — pass a value >= 0 and <= 1"),
    "steps_beyond_the_schedule": (["--steps", "5000"], r"steps=5000 must be between 1 and .*1000"),
    "unknown_sampler": (
        ["--sampler", "ddqm"],
        r"--sampler ddqm is not one of the choices — choose one of 'ddpm'",
    ),
    "unknown_flag": (["--temperature", "0.5"], r"unrecognized arguments: --temperature 0.5"),
    "config_typo": (["--config", "{user}/typo.yaml"], r"'trainer.max_step' is not accepted — see --help"),
    "cuda_without_a_gpu": (["--device", "cuda"], r"--device cuda: no CUDA GPU .* — use --device cpu"),
    "not_a_device": (["--device", "tpu9"], r"--device tpu9 is not a device"),
    "truncated": (["--ckpt", "{user}/truncated.ckpt"], r"truncated.ckpt is truncated or not a PyTorch"),
    "empty": (["--ckpt", "{user}/empty.ckpt"], r"empty.ckpt is empty"),
    "random_bytes": (["--ckpt", "{user}/random.ckpt"], r"random.ckpt is truncated or not a PyTorch"),
    "a_folder": (["--ckpt", "{user}/runs/toy2d"], r"is a folder, not a checkpoint file — pass .*last.ckpt"),
    "missing": (["--ckpt", "{user}/nope.ckpt"], r"no checkpoint at .*nope.ckpt"),
    "bare_weights": (["--ckpt", "{user}/weights.pt"], r"weights.pt is not a checkpoint written by train.py"),
    "out_is_a_file": (["--out", "{user}/a_file"], r"--out .*a_file is a file, not a folder"),
    "out_under_a_file": (["--out", "{user}/a_file/samples"], r"a_file is a file, not a folder"),
    "samples_exist": (["--out", "{user}/samples"], r"samples.npz exists — pass --overwrite"),
    "guidance_negative": (
        ["--guidance_scale", "-1"],
        r"--guidance_scale -1 is out of range — pass a value >= 0",
    ),
    "guidance_infinite": (["--guidance_scale", "inf"], r"guidance_scale=inf must be a finite number >= 0"),
    "class_of_an_unconditional_model": (
        ["--class_label", "3"],
        r"--class_label: this checkpoint is unconditional .* — sample it without --class_label",
    ),
    "guidance_of_an_unconditional_model": (
        ["--guidance_scale", "2"],
        r"--guidance_scale: this checkpoint is unconditional",
    ),
}


if Path("/proc/self").is_dir():
    SAMPLE_CASES["out_unwritable"] = (
        ["--out", "/proc/samples"],
        r"--out /proc/samples: cannot write into /proc",
    )


@pytest.mark.parametrize(("flags", "expected"), SAMPLE_CASES.values(), ids=SAMPLE_CASES.keys())
def test_sample_reports_a_bad_input_in_one_line(flags, expected, user, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on machines with a GPU
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    args = ["--ckpt", str(good), "--out", str(user / "new"), "--sampler", "ddim", "--steps", "2", "--num_samples",
            "2", *fill(flags, user)]  # fmt: skip
    assert re.search(expected, run_in_process(sample.main, args, user, capsys))


EVALUATE_CASES = {
    "missing_samples": (["--samples", "{user}/nope.npz"], r"no such file .*nope.npz"),
    "random_bytes": (["--samples", "{user}/random.ckpt"], r"random.ckpt"),
    "unknown_reference": (["--reference", "imagenet"], r"'imagenet' is neither .* datasets"),
    "unknown_features": (["--features", "clip"], r"--features clip is not one of the choices"),
    "kid_subset_size_1": (
        ["--kid_subset_size", "1"],
        r"--kid_subset_size 1 is out of range — pass a value >= 2",
    ),
    "batch_size_0": (["--batch_size", "0"], r"--batch_size 0 is out of range"),
    "missing_reference": (["--reference", "{user}/nope.npz"], r"no such file .*nope.npz"),
}


@pytest.mark.parametrize(("flags", "expected"), EVALUATE_CASES.values(), ids=EVALUATE_CASES.keys())
def test_evaluate_reports_a_bad_input_in_one_line(flags, expected, user, capsys):
    samples = str(user / "samples" / "samples.npz")
    args = ["--samples", samples, "--reference", samples, "--features", "pixels", *fill(flags, user)]
    assert re.search(expected, run_in_process(evaluate.main, args, user, capsys))


def test_a_corrupt_image_met_in_training_names_it_and_keeps_the_last_checkpoint(tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    for i in range(7):
        Image.fromarray(np.full((8, 8, 3), 30 * i, np.uint8)).save(images / f"{i}.png")
    args = train_args(
        [*FOLDER, "--data.batch_size", "3", "--data.num_workers", "0"], tmp_path, tmp_path / "runs"
    )
    train(args)
    last = tmp_path / "runs" / "folder" / "version_0" / "checkpoints" / "last.ckpt"
    steps = torch.load(last, weights_only=True)["global_step"]
    (images / "3.png").write_bytes(b"\x89PNG but cut off")  # the disk or a copy broke it since
    with pytest.raises(SystemExit) as exit_info:
        train([*args, "--ckpt_path", "last", "--max_steps", "12"])
    assert exit_info.value.code == 2
    assert re.search(r"cannot read image .*3\.png", error_line(capsys.readouterr().err))
    assert load_checkpoint(last).sample_shape == (3, 8, 8)  # still a good checkpoint
    assert torch.load(last, weights_only=True)["global_step"] >= steps


def test_existing_samples_are_replaced_only_with_overwrite(user, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(user / "samples", out)
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    path = sample.main(["--ckpt", str(good), "--out", str(out), "--sampler", "ddim", "--steps", "2",
                        "--num_samples", "3", "--device", "cpu", "--overwrite"])  # fmt: skip
    assert np.load(path)["arr_0"].shape == (3, 16, 16, 1)  # the user's 4 blank images replaced


def test_debug_lets_the_exception_through(user, monkeypatch):
    args = ["--ckpt", str(user / "truncated.ckpt"), "--out", str(user / "new")]
    with pytest.raises(UserError, match="truncated"):
        sample.main([*args, "--debug"])
    monkeypatch.setenv("DIFFUSION_DEBUG", "1")
    with pytest.raises(UserError, match="truncated"):
        sample.main(args)


def test_a_bug_keeps_its_traceback_and_messages_become_one_line():
    with pytest.raises(TypeError), reporting_user_errors([]):
        raise TypeError("a bug in the code, not in the input")
    layer = nn.Linear(2, 2)
    with pytest.raises(RuntimeError) as error:
        layer.load_state_dict({"weight": torch.zeros(3, 2), "extra": torch.zeros(1)})
    assert one_line(error.value) == (
        "the weights do not fit Linear (1 missing keys (e.g. bias), 1 unexpected keys (e.g. extra), "
        "1 of another shape (e.g. weight))"
    )


def run_command(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )  # fmt: skip


def test_real_commands_print_one_line_and_no_traceback(user, tmp_path):
    before = snapshot(user)
    result = run_command(["-m", "diffusion.sample", "--ckpt", str(user / "random.ckpt")], tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert re.search(r"^error: --ckpt .*random.ckpt is truncated", error_line(result.stderr))
    result = run_command([str(REPO / "train.py"), "--accumulate_grad_batches", "0"], tmp_path)
    assert result.returncode == 2 and "accumulate_grad_batches 0" in error_line(result.stderr)
    assert list(tmp_path.iterdir()) == [] and snapshot(user) == before  # no runs/, no samples/
    debug = run_command(
        ["-m", "diffusion.sample", "--ckpt", str(user / "random.ckpt")], tmp_path, DIFFUSION_DEBUG="1"
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "UserError" in debug.stderr


def test_without_the_default_recipe_no_arguments_stop_with_one_line(tmp_path):
    # The package installed without the project's configs/ folder: never train the code defaults instead.
    shutil.copytree(
        REPO / "diffusion", tmp_path / "site" / "diffusion", ignore=shutil.ignore_patterns("__pycache__")
    )
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", "from diffusion.cli import main; main()"], cwd=work, capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )  # fmt: skip
    assert result.returncode == 2
    assert re.search(
        r"default recipe .*configs/digits.yaml is missing.* — pass --config", error_line(result.stderr)
    )
    assert list(work.iterdir()) == []
