"""`python -m diffusion.sample --devices N`: N processes share the samples (sample i on rank i % N, per-sample
seeds), rank 0 gathers them in index order and writes samples.npz once, equal to a one-device run's.

Ranks hand all_gather uint8 images (a quarter of float32's bytes), vectors as float.

Run as a script (`python tests/cli/test_sample_distributed.py <sample flags>`), this file is the sample CLI with
Fabric's all_gather recorded into $GATHER_RECORD/rank<r>.json (see `record_gathers`).
"""

import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import warm
from lightning.fabric import Fabric

from diffusion.cli.process_group import process_group_is_open
from diffusion.cli.sample import main
from diffusion.core.sampling import SamplingOptions, build_sampler
from diffusion.generation.ranks import gather_in_order, generate, sample_across_ranks
from diffusion.generation.render import save_preview, to_uint8, to_uint8_images, write_samples
from diffusion.training.loading import load_checkpoint

REPO_ROOT = Path(__file__).parents[2]
# 5 samples over 2 ranks: uneven (rank 0 draws 0, 2, 4; rank 1 draws 1, 3 and an extra, 5, that is
# dropped) and in batches of 2, so both the split and the batching differ from one device's single batch.
ARGS = ["--num_samples", "5", "--batch_size", "2", "--seed", "7", "--sampler", "ddim", "--steps", "3"]
OPTIONS = {"seed": 7, "sampler": build_sampler(SamplingOptions(sampler="ddim", steps=3))}


class StackingFabric:
    """Stands in for Fabric's all_gather across `world_size` in-process 'ranks' (the shapes Fabric returns);
    keeps what it was handed."""

    device = torch.device("cpu")

    def __init__(self, locals_: list[torch.Tensor]) -> None:
        self.locals = locals_
        self.handed: list[torch.Tensor] = []

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self.handed.append(tensor)
        return torch.stack(self.locals)  # (world, per_rank, ...)


def one_devices_images(checkpoint: Path) -> np.ndarray:
    """samples.npz's content as written before ranks gathered uint8: float samples, then to_uint8_images."""
    module = load_checkpoint(checkpoint)
    return to_uint8_images(generate(module, 5, batch_size=5, **OPTIONS), module.normalization)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_shares_gathered_in_index_order_equal_one_devices_samples(world_size, digits_checkpoint):
    module = load_checkpoint(digits_checkpoint)
    reference = generate(module, 5, batch_size=5, **OPTIONS)
    shares = [
        generate(module, 5, batch_size=2, rank=r, world_size=world_size, **OPTIONS) for r in range(world_size)
    ]
    assert {len(share) for share in shares} == {math.ceil(5 / world_size)}  # equal shapes for all_gather
    gathered = gather_in_order(shares[0], 5, StackingFabric(shares).all_gather)
    torch.testing.assert_close(gathered, reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_hand_all_gather_uint8_images_a_quarter_of_float_bytes(world_size, digits_checkpoint):
    module = load_checkpoint(digits_checkpoint)
    reference = generate(module, 5, batch_size=5, **OPTIONS)  # float, one device, one batch
    shares = [
        generate(module, 5, batch_size=2, rank=r, world_size=world_size, uint8_images=True, **OPTIONS)
        for r in range(world_size)
    ]
    fabric = StackingFabric(shares)
    gathered = gather_in_order(shares[0], 5, fabric.all_gather)
    per_rank = math.ceil(5 / world_size)
    (handed,) = fabric.handed
    assert handed.dtype == torch.uint8 and handed.shape == (per_rank, 1, 8, 8)
    assert handed.nbytes == per_rank * 8 * 8  # float32 samples: 4x that
    assert gathered.dtype == torch.uint8
    # Other batch shapes move float samples by ~1e-6; uint8 rounding absorbs that (a value within 1e-6 of a
    # rounding boundary would flip one level: these seeds hit none).
    torch.testing.assert_close(gathered, to_uint8(reference, module.normalization), rtol=0, atol=0)


@pytest.mark.parametrize("world_size", [1, 2])
def test_training_time_grids_gather_uint8_images(world_size, digits_checkpoint):
    # sample_across_ranks (SampleGrid's) as rank 0 of `world_size`, the other ranks' shares computed here.
    module = load_checkpoint(digits_checkpoint)
    shares = [
        generate(module, 5, batch_size=5, rank=r, world_size=world_size, uint8_images=True, **OPTIONS)
        for r in range(world_size)
    ]
    fabric = StackingFabric(shares)
    strategy = SimpleNamespace(all_gather=lambda tensor, **kwargs: fabric.all_gather(tensor))
    module.trainer = SimpleNamespace(world_size=world_size, global_rank=0, strategy=strategy)
    grid = sample_across_ranks(module, 5, OPTIONS["seed"], OPTIONS["sampler"])
    assert [tensor.dtype for tensor in fabric.handed] == [torch.uint8] * (world_size - 1)  # none for 1 rank
    reference = generate(module, 5, batch_size=5, **OPTIONS)
    torch.testing.assert_close(grid, to_uint8(reference, module.normalization), rtol=0, atol=0)


def test_vectors_are_gathered_as_float(toy2d_checkpoint):
    module = load_checkpoint(toy2d_checkpoint)
    shares = [generate(module, 5, rank=r, world_size=2, uint8_images=True, **OPTIONS) for r in range(2)]
    fabric = StackingFabric(shares)
    gathered = gather_in_order(shares[0], 5, fabric.all_gather)
    assert fabric.handed[0].dtype == gathered.dtype == torch.float32
    torch.testing.assert_close(
        gathered, generate(module, 5, **OPTIONS), rtol=1e-6, atol=1e-5
    )  # float32 ulps of data units


def test_files_from_uint8_images_equal_those_from_float_samples(digits_checkpoint, tmp_path):
    module = load_checkpoint(digits_checkpoint)
    samples = generate(module, 5, **OPTIONS)
    uint8 = generate(module, 5, uint8_images=True, **OPTIONS)
    np.testing.assert_array_equal(uint8.numpy(), to_uint8(samples, module.normalization).numpy())
    paths = [
        write_samples(x, module.normalization, tmp_path / name) for name, x in [("f", samples), ("u", uint8)]
    ]
    np.testing.assert_array_equal(np.load(paths[0])["arr_0"], np.load(paths[1])["arr_0"])
    assert (tmp_path / "f" / "grid.png").read_bytes() == (tmp_path / "u" / "grid.png").read_bytes()
    grids = [
        save_preview(x, module.normalization, tmp_path / f"{i}.png") for i, x in enumerate([samples, uint8])
    ]
    torch.testing.assert_close(grids[0], grids[1], rtol=0, atol=0)  # what SampleGrid logs to TensorBoard


def record_gathers(record_dir: Path) -> None:
    """Make every Fabric.all_gather of this process write what it was handed and gave back to
    record_dir/rank<global rank>.json."""
    all_gather = Fabric.all_gather

    def recording_all_gather(self: Fabric, data: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        gathered = all_gather(self, data, *args, **kwargs)
        record = {"handed": [str(data.dtype), list(data.shape), data.nbytes],
                  "gathered": [str(gathered.dtype), list(gathered.shape)]}  # fmt: skip
        (record_dir / f"rank{self.global_rank}.json").write_text(json.dumps(record))
        return gathered

    Fabric.all_gather = recording_all_gather


@pytest.mark.multiprocess
def test_two_processes_write_one_devices_samples_once_gathering_uint8(digits_checkpoint, tmp_path):
    # One launch, several guarantees (a launch costs ~20 s of imports): the sample CLI on two ranks, with Fabric's
    # all_gather recorded (this file run as a script: `main()` of diffusion.sample, as `-m diffusion.sample` runs).
    one = main(["--ckpt", str(digits_checkpoint), "--out", str(tmp_path / "one"), "--device", "cpu", *ARGS])
    result = warm.run(
        [sys.executable, __file__, "--ckpt", str(digits_checkpoint), "--out", str(tmp_path / "two"),
         "--devices", "2", "--accelerator", "cpu", *ARGS],
        cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", "GATHER_RECORD": str(tmp_path),
                             "PYTHONPATH": str(REPO_ROOT / "tests")},  # rank 1 imports this file: helpers
        capture_output=True, text=True, timeout=300, ranks=2,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in result.stdout + result.stderr
    assert result.stdout.count("wrote 5 samples") == 1  # rank 0 alone writes and reports
    assert result.stderr.count("batches:   0%") == 1  # and shows the progress bar
    for rank in range(2):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["handed"] == ["torch.uint8", [3, 1, 8, 8], 3 * 8 * 8]  # float32 would be 4x
        assert record["gathered"] == ["torch.uint8", [2, 3, 1, 8, 8]]
        # the gloo group closed before exit (left open, it can abort the process: diffusion/cli/process_group.py)
        assert (tmp_path / f"rank{rank}.after_main").read_text() == "False"
    two = np.load(tmp_path / "two" / "samples.npz")["arr_0"]
    np.testing.assert_array_equal(two, np.load(one)["arr_0"])
    np.testing.assert_array_equal(two, one_devices_images(digits_checkpoint))  # content unchanged
    assert len({sample.tobytes() for sample in two}) == 5  # no sample drawn twice
    assert (tmp_path / "two" / "grid.png").read_bytes() == (tmp_path / "one" / "grid.png").read_bytes()


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


if __name__ == "__main__":
    record_gathers(Path(os.environ["GATHER_RECORD"]))
    main()
    rank = int(os.environ.get("LOCAL_RANK", 0))
    (Path(os.environ["GATHER_RECORD"]) / f"rank{rank}.after_main").write_text(str(process_group_is_open()))
