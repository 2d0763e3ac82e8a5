"""benchmarks/gpu_suite.sh, the GPU measurements in device calls, runs end to end: a GPU is lent
only now and then, and a wrong flag found there would cost its scarce minutes. SUITE_QUICK=1 runs the stages on
this CPU with a tiny UNet (the compiled stage's flags are those of speed.py --compiled, tests/training/test_speed_options.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def suite(out: Path, *stages: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "SUITE_QUICK": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    return subprocess.run(
        ["bash", "benchmarks/gpu_suite.sh", str(out), *stages], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_the_gpu_suite_runs_its_stages_on_the_cifar10_recipe(tmp_path):
    result = suite(tmp_path, "fp16", "bf16", "nccl", "sample")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for stage in ("fp16", "bf16"):
        table = (tmp_path / stage / "speed.md").read_text()
        assert "configs/cifar10.yaml" in table and "| project: Lightning Trainer + EMA callback |" in table
    assert "precision bf16-mixed" in (tmp_path / "bf16" / "speed.md").read_text()
    log = (tmp_path / "suite.log").read_text()
    assert "distributed_backend=gloo" in log  # train.py under --strategy ddp (NCCL on the GPU)
    assert "train.py: 2 steps in" in log and "last.ckpt" in log
    for precision in ("32", "bf16-mixed"):
        assert f"sample: 8 DDIM-50 images under {precision} in" in log


def test_an_unknown_stage_is_refused(tmp_path):
    result = suite(tmp_path, "fp32")
    assert result.returncode == 2 and "unknown stage fp32" in result.stdout + result.stderr
