"""A file the project wrote whose bytes changed inside its data (a bad copy, a failing disk) is refused in one line
naming it, by every command that reads it: checkpoints and post-hoc EMA snapshots (their zip entries' CRC-32,
which torch.load does not check), exports (the SHA-256 in config.json), FID statistics and samples (.npz: np.load
checks the CRC-32). Weights that are not finite are refused before any work, and a sampling run whose samples are
not finite exits non-zero and writes nothing that looks finished."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_run
from helpers.damage import flip_byte_inside_largest_entry, flip_byte_near_the_end
from helpers.user_errors import run_in_process

from diffusion.cli import evaluate, export, phema, sample
from diffusion.errors import UserError
from diffusion.training.checkpoint_files import read_network_weights
from diffusion.training.loading import load_checkpoint

SAMPLE = ["--num_samples", "4", "--batch_size", "2", "--sampler", "ddim", "--steps", "2", "--device", "cpu"]
DAMAGED = r"is damaged: its bytes do not match their checksum"


def damaged_copy(source: Path, target: Path) -> Path:
    shutil.copyfile(source, target)
    flip_byte_inside_largest_entry(target)
    return target


@pytest.fixture(scope="module")
def home(tmp_path_factory, digits_checkpoint) -> Path:
    """A user's folder: a damaged checkpoint, one with a NaN weight, an export and a damaged one, samples, FID
    statistics and damaged copies of both, and a run with post-hoc EMA snapshots, one of them damaged."""
    home = tmp_path_factory.mktemp("home")
    damaged_copy(digits_checkpoint, home / "damaged.ckpt")
    state = torch.load(digits_checkpoint, map_location="cpu", weights_only=True)
    name = next(key for key in state["state_dict"] if key.startswith("network.") and key.endswith("weight"))
    state["state_dict"][name][0] = float("nan")
    torch.save(state, home / "nan.ckpt")
    export.main(["--ckpt", str(digits_checkpoint), "--format", "safetensors", "--out", str(home / "export")])
    shutil.copytree(home / "export", home / "damaged_export")
    flip_byte_near_the_end(home / "damaged_export" / "model.safetensors")
    rng = np.random.default_rng(0)
    np.savez(home / "samples.npz", rng.integers(0, 256, (8, 16, 16, 1), dtype=np.uint8))
    damaged_copy(home / "samples.npz", home / "damaged_samples.npz")
    np.savez(home / "stats.npz", mu=np.zeros(64), sigma=np.eye(64), features="pixels")
    damaged_copy(home / "stats.npz", home / "damaged_stats.npz")
    save_dir = tmp_path_factory.mktemp("runs")
    tiny_run(save_dir, "--ema.post_hoc", "true", "--ema.snapshot_every", "2")
    shutil.copytree(save_dir / "digits" / "version_0", home / "run")
    snapshot = sorted((home / "run" / "post_hoc_ema").glob("*.pt"))[-1]
    flip_byte_inside_largest_entry(snapshot)
    return home


def test_sample_refuses_a_checkpoint_with_a_changed_byte(home, tmp_path, capsys):
    line = run_in_process(sample.main, ["--ckpt", str(home / "damaged.ckpt"), "--out", str(tmp_path), *SAMPLE],
                          home, capsys)  # fmt: skip
    assert re.search(rf"--ckpt .*damaged.ckpt {DAMAGED} .* — pass an intact checkpoint", line)
    assert not any(tmp_path.iterdir())


def test_export_refuses_a_checkpoint_with_a_changed_byte(home, tmp_path, capsys):
    args = ["--ckpt", str(home / "damaged.ckpt"), "--format", "safetensors", "--out", str(tmp_path / "x")]
    assert re.search(rf"damaged.ckpt {DAMAGED}", run_in_process(export.main, args, home, capsys))


def test_an_export_with_a_changed_byte_is_refused_and_one_without_a_checksum_loads(home, tmp_path):
    with pytest.raises(UserError, match=r"damaged_export/model.safetensors is damaged: its bytes do not match the "
                                        r"checksum in config.json"):  # fmt: skip
        load_checkpoint(home / "damaged_export")
    assert torch.isfinite(next(load_checkpoint(home / "export").network.parameters())).all()
    # An export written before exports carried a checksum:
    older = shutil.copytree(home / "damaged_export", tmp_path / "older")
    config = json.loads((older / "config.json").read_text())
    del config["weights_sha256"]
    (older / "config.json").write_text(json.dumps(config))
    load_checkpoint(older)  # unverifiable: loads, as it always did


@pytest.mark.parametrize("flag", ["--samples", "--reference"])
def test_evaluate_refuses_samples_with_a_changed_byte(flag, home, capsys):
    files = {"--samples": home / "samples.npz", "--reference": home / "samples.npz"}
    files[flag] = home / "damaged_samples.npz"
    args = ["--samples", str(files["--samples"]), "--reference", str(files["--reference"]),
            "--features", "pixels"]  # fmt: skip
    line = run_in_process(evaluate.main, args, home, capsys)
    assert re.search(r"damaged_samples.npz is truncated or corrupt \(Bad CRC-32 for file 'arr_0.npy'\)", line)


def test_evaluate_refuses_statistics_with_a_changed_byte(home, capsys):
    args = ["--samples", str(home / "samples.npz"), "--reference", str(home / "damaged_stats.npz"),
            "--features", "pixels"]  # fmt: skip
    line = run_in_process(evaluate.main, args, home, capsys)
    assert re.search(r"damaged_stats.npz is truncated or corrupt \(Bad CRC-32 for file 'sigma.npy'\)", line)


def test_phema_refuses_a_snapshot_with_a_changed_byte(home, tmp_path, capsys):
    args = ["--run", str(home / "run"), "--sigma_rel", "0.1", "--out", str(tmp_path / "x.ckpt")]
    line = run_in_process(phema.main, args, home, capsys)
    assert re.search(rf"post-hoc EMA snapshot .*step=000000004-sigma_rel=.*\.pt {DAMAGED}", line)
    assert not (tmp_path / "x.ckpt").exists()


def test_init_from_refuses_a_checkpoint_with_a_changed_byte_or_a_nan_weight(home):
    with pytest.raises(UserError, match=rf"init_from .*damaged.ckpt {DAMAGED}"):
        read_network_weights(home / "damaged.ckpt")
    with pytest.raises(UserError, match=r"nan.ckpt holds weights that are not finite .*, first \w"):
        read_network_weights(home / "nan.ckpt")


def test_sample_refuses_a_nan_weight_naming_the_file_and_the_tensor(home, tmp_path, capsys):
    line = run_in_process(sample.main, ["--ckpt", str(home / "nan.ckpt"), "--out", str(tmp_path), *SAMPLE],
                          home, capsys)  # fmt: skip
    assert re.search(
        r"nan.ckpt \(ema weights\) holds weights that are not finite \(NaN or infinity\), first [\w.]+weight "
        r"— training diverged before it was saved: use an earlier checkpoint",
        line,
    )
    assert not any(tmp_path.iterdir())


def test_samples_that_are_not_finite_exit_non_zero_and_leave_nothing_that_looks_finished(
    digits_checkpoint, tmp_path, capsys, monkeypatch
):
    loaded = sample.load_checkpoint

    def diverging(*args, **kwargs):  # finite weights whose network overflows: NaN out
        module = loaded(*args, **kwargs)
        module.network.register_forward_hook(lambda network, inputs, output: output * float("nan"))
        return module

    monkeypatch.setattr(sample, "load_checkpoint", diverging)
    out = tmp_path / "out"
    line = run_in_process(sample.main, ["--ckpt", str(digits_checkpoint), "--out", str(out), *SAMPLE],
                          tmp_path / "nothing", capsys)  # fmt: skip
    assert re.search(r"sampling produced values that are not finite \(NaN or infinity\) among samples 0 to 3; "
                     r"nothing was written — sample at --precision 32", line)  # fmt: skip
    assert not out.exists()  # made for this run, and removed with what it held


def test_a_checkpoint_given_as_samples_is_said_as_one(tmp_path, capsys):
    # Round 13's Y3: torch.save's zip entries were listed as the arrays of an .npz, an 18 KB line
    checkpoint = tmp_path / "last.ckpt"
    torch.save({f"w{i}": torch.zeros(2) for i in range(50)}, checkpoint)
    line = run_in_process(
        evaluate.main, ["--samples", str(checkpoint), "--features", "pixels"], tmp_path, capsys
    )
    assert line.startswith(
        f"error: --samples {checkpoint} is a PyTorch file (torch.save: a checkpoint), not a NumPy array — "
    ), line
    assert len(line) < 300
