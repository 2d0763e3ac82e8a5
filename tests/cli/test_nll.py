"""`python -m diffusion.evaluate --nll --ckpt CKPT`: bits/dim of the run's held-out images (or an .npz), the same
on 1 or 2 processes, refused for vector models in one line."""

import math
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_run, warm
from helpers.damage import flip_byte_inside_largest_entry
from helpers.user_errors import run_in_process

from diffusion.cli import evaluate, evaluate_nll
from diffusion.core.variational_bound import ReverseProcess, bound_terms
from diffusion.data.images import ImageDataModule
from diffusion.generation.render import to_uint8_images
from diffusion.metrics.bits_per_dim import BitsPerDim, quantize_to_8_bits
from diffusion.training.loading import load_checkpoint

REPO_ROOT = Path(__file__).parents[2]
T = 20  # a short chain: every image costs T network evaluations


@pytest.fixture(scope="module")
def short_chain_checkpoint(tmp_path_factory) -> Path:
    """A tiny digits run with T = 20 timesteps."""
    save_dir = tmp_path_factory.mktemp("runs")
    tiny_run(save_dir, "--model.num_timesteps", str(T))
    return save_dir / "digits" / "version_0" / "checkpoints" / "last.ckpt"


def held_out_digits() -> torch.Tensor:
    """The digits recipe's validation split, as ImageDataModule's defaults hold it out."""
    data = ImageDataModule("digits")
    data.setup("fit")
    return torch.stack([item.x for item in data.val_set])


def bits(stdout: str) -> str:
    return re.search(r"bits/dim: (\S+)", stdout).group(1)


def test_bits_per_dim_of_the_runs_held_out_images(short_chain_checkpoint, capsys):
    result = evaluate_nll.main(["--ckpt", str(short_chain_checkpoint), "--seed", "3"])
    images = quantize_to_8_bits(held_out_digits())
    assert result["num_images"] == len(images) == 90  # 5% of the 1,797 digits
    module = load_checkpoint(short_chain_checkpoint)
    expected = bound_terms(
        module.network, module.schedule, ReverseProcess(), images, torch.arange(90), seed=3
    )
    torch.testing.assert_close(result["per_image"], expected.total, rtol=1e-6, atol=0)
    assert result["bits_per_dim"] == pytest.approx(expected.total.mean().item(), rel=1e-9)
    assert bits(capsys.readouterr().out) == f"{result['bits_per_dim']:.5f}"
    assert 0 < result["prior"] < 1e-3 < result["decoder"]  # a 4-step model: far from the data


def test_the_time_it_takes_is_said_up_front(short_chain_checkpoint, capsys, monkeypatch):
    clock = iter(range(1000))  # each reading 1 s after the last: a timed batch takes 1 s
    monkeypatch.setattr(evaluate_nll, "perf_counter", lambda: next(clock))
    evaluate_nll.main(["--ckpt", str(short_chain_checkpoint), "--batch_size", "32"])
    err = capsys.readouterr().err
    # 90 images in 3 batches of 32, each T = 20 evaluations of 1 s: 60 s.
    assert "bits/dim of 90 images: 20 network evaluations each, about 00:01:00 on cpu" in err
    assert err.index("about 00:01:00") < err.index("images: 90 (")  # before the work, not after it


def test_an_npz_of_the_same_images_gives_the_same_bits_per_dim(short_chain_checkpoint, tmp_path):
    path = tmp_path / "held_out.npz"
    np.savez(path, to_uint8_images(held_out_digits(), {"shift": [0.5], "scale": [0.5]}))
    from_file = evaluate.main(["--nll", "--ckpt", str(short_chain_checkpoint), "--data.path", str(path)])
    from_run = evaluate.main(["--ckpt", str(short_chain_checkpoint), "--nll"])  # through evaluate's main
    torch.testing.assert_close(from_file["per_image"], from_run["per_image"], rtol=1e-6, atol=0)


def test_a_split_given_with_a_data_file_is_said_unused(short_chain_checkpoint, tmp_path, capsys):
    path = tmp_path / "four.npz"
    np.savez(path, to_uint8_images(held_out_digits()[:4], {"shift": [0.5], "scale": [0.5]}))
    args = ["--nll", "--ckpt", str(short_chain_checkpoint), "--data.path", str(path)]
    evaluate.main([*args, "--split", "train"])
    assert f"note: --split train is not used: it picks a split of the run's data (from its config.yaml), and " \
        f"--data.path {path} gives the images" in capsys.readouterr().err  # fmt: skip
    evaluate.main(args)  # not written: no note
    assert "note:" not in capsys.readouterr().err


def test_only_nll_goes_to_the_likelihood_command():
    assert evaluate_nll.requested(["--nll", "--ckpt", "x"]) and evaluate_nll.requested(["--nll=true"])
    assert not evaluate_nll.requested(["--samples", "s.npz", "--reference", "digits"])
    assert not evaluate_nll.requested(["--nll=false"])


@pytest.mark.parametrize(
    "case, pattern",
    [
        ("vectors", r"--nll: .* models vectors of shape \(2,\), and bits/dim is a bound on 8-bit images — "),
        (
            "npz_size",
            r"--data.path .*: the images are uint8 \(4, 16, 16, 1\), the model's images uint8 \(N, 8, 8, 1\)",
        ),
        ("no_split", r"held out no images \(--data.val_fraction 0\) — pass --data.path"),
    ],
)
def test_user_errors_are_one_line(case, pattern, user, toy2d_checkpoint, digits_checkpoint, tmp_path, capsys):
    ckpt = toy2d_checkpoint if case == "vectors" else digits_checkpoint
    args = ["--nll", "--ckpt", str(ckpt)]
    if case == "npz_size":
        np.savez(tmp_path / "small.npz", np.zeros((4, 16, 16, 1), np.uint8))
        args += ["--data.path", str(tmp_path / "small.npz")]
    if case == "no_split":
        config = digits_checkpoint.parents[1] / "config.yaml"
        copy = tmp_path / "runs" / "digits" / "version_0"
        (copy / "checkpoints").mkdir(parents=True)
        (copy / "checkpoints" / "last.ckpt").write_bytes(digits_checkpoint.read_bytes())
        (copy / "config.yaml").write_text(
            config.read_text().replace("val_fraction: 0.05", "val_fraction: 0.0")
        )
        args = ["--nll", "--ckpt", str(copy / "checkpoints" / "last.ckpt")]
    line = run_in_process(evaluate.main, args, user, capsys)
    assert re.search(pattern, line), line


def damaged_images(path: Path) -> None:
    np.savez(path, np.full((4, 16, 16, 1), 7, np.uint8))
    flip_byte_inside_largest_entry(path)


DATA_CASES = {  # id: (how the --data.path file is made, what the line must say)
    "truncated": (
        lambda path: path.write_bytes(b"PK\x03\x04" + bytes(100)), r"is truncated or corrupt .* — save uint8"
    ),
    "damaged": (damaged_images, r"damaged.npz is truncated or corrupt \(.*CRC.*\) — save uint8"),
    "random_bytes": (lambda path: path.write_bytes(bytes(range(256))), r"is not a .npy file or an .npz archive"),
    "empty": (lambda path: path.write_bytes(b""), r"empty.npz is not a .npy file or an .npz archive"),
    "statistics": (
        lambda path: np.savez(path, mu=np.zeros(3), sigma=np.eye(3)), r"holds \['mu', 'sigma'\], no arr_0"
    ),
    "float_images": (
        lambda path: np.savez(path, np.zeros((4, 16, 16, 1), np.float32)), r"float images could be in 0..1"
    ),
    "not_images": (lambda path: np.save(path, np.zeros((4, 2))), r"not images \(N, H, W, C\)"),
    "objects": (
        lambda path: np.save(path, np.array([{}], dtype=object), allow_pickle=True), r"holds Python objects"
    ),
}  # fmt: skip


@pytest.mark.parametrize(("make", "pattern"), DATA_CASES.values(), ids=DATA_CASES.keys())
def test_a_damaged_or_wrong_data_file_is_one_line(
    make, pattern, digits_checkpoint, tmp_path, capsys, request
):
    path = tmp_path / f"{request.node.callspec.id}.npz"
    make(path)
    if not path.exists():  # np.save added .npy
        path = path.with_suffix(".npz.npy")
    args = ["--nll", "--ckpt", str(digits_checkpoint), "--data.path", str(path)]
    line = run_in_process(evaluate.main, args, tmp_path, capsys)
    assert re.search(pattern, line), line


@pytest.mark.multiprocess
def test_two_processes_give_one_processs_bits_per_dim(short_chain_checkpoint):
    # 7 images over 2 ranks in batches of 2: another split and other batches than one process's single batch.
    args = ["--nll", "--ckpt", str(short_chain_checkpoint), "--num_images", "7", "--seed", "5"]
    one = evaluate.main(args)
    result = warm.run(
        [sys.executable, "-m", "diffusion.evaluate", *args, "--devices", "2", "--accelerator", "cpu",
         "--batch_size", "2"],
        cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
        ranks=2,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in result.stdout + result.stderr
    assert result.stdout.count("bits/dim:") == 1  # rank 0 alone reports
    assert bits(result.stdout) == f"{one['bits_per_dim']:.5f}"


def test_a_learned_variance_checkpoint_is_evaluated_with_its_own_variance(tmp_path, capsys):
    save_dir = tmp_path / "runs"
    tiny_run(save_dir, "--model.num_timesteps", str(T), "--model.variance", "learned_range")
    ckpt = save_dir / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    result = evaluate_nll.main(["--ckpt", str(ckpt), "--num_images", "4"])
    module = load_checkpoint(ckpt)
    images = quantize_to_8_bits(held_out_digits()[:4])
    process = ReverseProcess(variance="learned_range", learned_variance=True)
    expected = bound_terms(module.network, module.schedule, process, images, torch.arange(4))
    torch.testing.assert_close(result["per_image"], expected.total, rtol=1e-6, atol=0)
    with pytest.raises(SystemExit):
        evaluate_nll.main(["--ckpt", str(ckpt), "--variance", "fixedlarge"])
    assert "this model learned its variance — leave --variance out" in capsys.readouterr().err


def test_nll_set_in_a_config_file_chooses_the_nll_command(tmp_path):
    """Round 9's Q3: `nll: true` in a --config file was refused as `nll is not an option of this command`."""
    from diffusion.cli import evaluate_nll

    (tmp_path / "run.yaml").write_text("nll: true\nckpt: last.ckpt\n")
    (tmp_path / "off.yaml").write_text("nll: false\n")
    config, off = ["--config", str(tmp_path / "run.yaml")], ["--config", str(tmp_path / "off.yaml")]
    assert evaluate_nll.requested(config)
    assert evaluate_nll.requested(["--nll"]) and evaluate_nll.requested(["--nll=true"])
    assert not evaluate_nll.requested([*config, "--nll=false"])  # the last word wins, as in the parse
    assert not evaluate_nll.requested([*config, *off]) and not evaluate_nll.requested(["--samples", "s.npz"])


def test_one_images_bits_per_dim_says_it_has_no_standard_error():
    # Round 25b's S6: `--num_images 1` printed "bits/dim: 6.55353 ± nan"
    one = BitsPerDim.of(torch.tensor([[0.0, 1.0, 2.0, 3.0]]))
    assert math.isnan(one.standard_error)
    assert evaluate_nll.bits_per_dim_line(one) == (
        "bits/dim: 3.00000 (one image: no standard error; pass --num_images 2 or more)"
    )
    two = BitsPerDim.of(torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 5.0]]))
    assert evaluate_nll.bits_per_dim_line(two) == "bits/dim: 4.00000 ± 1.00000 (standard error over images)"
