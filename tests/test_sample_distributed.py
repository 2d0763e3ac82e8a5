"""`python -m diffusion.sample --devices N`: N processes share the samples (sample i on rank i % N, per-sample
seeds), rank 0 gathers them in index order and writes samples.npz once, equal to a one-device run's."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from diffusion.checkpoints import load_checkpoint
from diffusion.generation import gather_in_order, generate
from diffusion.sample import main
from diffusion.sampling import SamplingOptions

REPO_ROOT = Path(__file__).parents[1]
# 5 samples over 2 ranks: uneven (rank 0 draws 0, 2, 4; rank 1 draws 1, 3 and an extra, 5, that is
# dropped) and in batches of 2, so both the split and the batching differ from one device's single batch.
ARGS = ["--num_samples", "5", "--batch_size", "2", "--seed", "7", "--sampler", "ddim", "--steps", "3"]


class StackingFabric:
    """Stands in for Fabric's all_gather across `world_size` in-process 'ranks' (the shapes Fabric returns)."""

    device = torch.device("cpu")

    def __init__(self, locals_: list[torch.Tensor]) -> None:
        self.locals = locals_

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.stack(self.locals)  # (world, per_rank, ...)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_shares_gathered_in_index_order_equal_one_devices_samples(world_size, digits_checkpoint):
    module = load_checkpoint(digits_checkpoint)
    options = {"seed": 7, "options": SamplingOptions(sampler="ddim", steps=3)}
    reference = generate(module, 5, batch_size=5, **options)
    shares = [
        generate(module, 5, batch_size=2, rank=r, world_size=world_size, **options) for r in range(world_size)
    ]
    assert {len(share) for share in shares} == {math.ceil(5 / world_size)}  # equal shapes for all_gather
    gathered = gather_in_order(shares[0], 5, StackingFabric(shares).all_gather)
    torch.testing.assert_close(gathered, reference, rtol=0, atol=1e-5)


@pytest.mark.multiprocess
def test_two_processes_write_one_devices_samples_once(digits_checkpoint, tmp_path):
    one = main(["--ckpt", str(digits_checkpoint), "--out", str(tmp_path / "one"), "--device", "cpu", *ARGS])
    result = subprocess.run(
        [sys.executable, "-m", "diffusion.sample", "--ckpt", str(digits_checkpoint), "--out", str(tmp_path / "two"),
         "--devices", "2", "--accelerator", "cpu", *ARGS],
        cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in result.stdout + result.stderr
    assert result.stdout.count("wrote 5 samples") == 1  # rank 0 alone writes and reports
    assert result.stderr.count("batches:   0%") == 1  # and shows the progress bar
    two = np.load(tmp_path / "two" / "samples.npz")["arr_0"]
    np.testing.assert_array_equal(two, np.load(one)["arr_0"])
    assert len({sample.tobytes() for sample in two}) == 5  # no sample drawn twice
    assert (tmp_path / "two" / "grid.png").is_file()


def test_devices_from_python_say_to_use_the_command_line(digits_checkpoint, tmp_path, monkeypatch):
    # main([...]) cannot start the other ranks: Fabric would re-run this process's sys.argv (pytest's).
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ValueError, match="python -m diffusion.sample"):
        main(
            [
                "--ckpt",
                str(digits_checkpoint),
                "--out",
                str(tmp_path),
                "--devices",
                "2",
                "--accelerator",
                "cpu",
            ]
        )
    assert not (tmp_path / "samples.npz").exists()


def test_zero_devices_is_an_argparse_error(digits_checkpoint, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--ckpt", str(digits_checkpoint), "--devices", "0"])
    assert exit_info.value.code == 2
    assert "--devices" in capsys.readouterr().err
