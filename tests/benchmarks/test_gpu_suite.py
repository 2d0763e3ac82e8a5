"""benchmarks/gpu_suite.sh runs end to end: a GPU is lent only now and then, and a wrong flag found there would cost
its scarce minutes. SUITE_QUICK=1 runs the stages on this CPU with a tiny UNet (speed_compiled's flags are those of
speed.py --compiled, run in-process with a light compile backend by tests/training/test_speed_options.py: Inductor
on this CPU would take minutes)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def suite(out: Path, *stages: str, **env: str) -> subprocess.CompletedProcess:
    environment = {
        **os.environ,
        "SUITE_QUICK": "1",
        "SUITE_WORK": str(out.parent / "work"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        **env,
    }
    return subprocess.run(
        ["bash", "benchmarks/gpu_suite.sh", str(out), *stages], cwd=ROOT, env=environment, capture_output=True,
        text=True, timeout=2400,
    )  # fmt: skip


def stage_results(out: Path) -> dict[str, list[str]]:
    rows = (out / "summary.md").read_text().splitlines()[2:]
    return {cells[1].strip(): [c.strip() for c in cells[2:-1]] for cells in (row.split("|") for row in rows)}


@pytest.mark.slow
def test_the_first_call_trains_resumes_after_a_kill_and_samples(tmp_path):
    out = tmp_path / "out"
    result = suite(out, "call1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert {stage: cells[0] for stage, cells in stage_results(out).items()} == {
        "check": "OK", "train": "OK", "sample": "OK"
    }  # fmt: skip
    train = (out / "train.md").read_text()
    assert "`--precision bf16-mixed --max_steps 6`: " in train and "all finite" in train
    assert "`--precision 16-mixed --max_steps 3`: " in train
    # On the CPU the resumed run lands on the weights of the run left alone, as tests/training/test_resume.py says.
    assert "- kill -9 at step 4 + `--ckpt_path last` to step 6: raw weights max|diff| 0 from" in train
    sample = (out / "sample.md").read_text()
    for run in ("ddim-50 32", "ddim-50 bf16-mixed", "dpmpp_2m_sde-20 32", "dpmpp_2m_sde-20 bf16-mixed"):
        assert f"- {run}: 8 samples (batch 4) in " in sample
    log = (out / "suite.log").read_text()
    assert "distributed_backend=gloo" in log  # train.py under --strategy ddp (NCCL on the GPU)
    assert sorted(p.name for p in out.iterdir()) == ["sample.md", "suite.log", "summary.md", "train.md"]


@pytest.mark.slow
def test_the_speed_stages_run_on_the_cifar10_recipe(tmp_path):
    # The digits stage is quality.py --quick plus a grep; quality.py --quick has an end-to-end test of its own
    # (test_quality_benchmark.py), and speed_compiled's flags are those of test_speed_options.py's --compiled run.
    out = tmp_path / "out"
    result = suite(out, "speed_fp16", "speed_bf16")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert all(cells[0] == "OK" for cells in stage_results(out).values()), (out / "summary.md").read_text()
    for stage in ("speed_fp16", "speed_bf16"):
        table = (out / stage / "speed.md").read_text()
        assert "configs/cifar10.yaml" in table and "| project: Lightning Trainer + EMA callback |" in table
        assert "as users run it (StepTimer;" in table
    bf16 = (out / "speed_bf16" / "speed.md").read_text()
    assert "precision bf16-mixed" in bf16 and "| `train.py --trainer.benchmark true` as users run it" in bf16
    assert "| dpmpp_2m_sde-3 | bf16-mixed | 8 |" in bf16
    assert "Data loader alone (SyntheticCIFAR10(cifar10)" in (out / "speed_fp16" / "speed.md").read_text()


def test_a_failing_stage_says_why_and_the_next_one_runs(tmp_path):
    out = tmp_path / "out"
    result = suite(out, "train", "check", SUITE_WORK="/dev/null/work")  # train cannot make its folder
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = stage_results(out)
    assert results["train"][0] == "FAILED" and "exit status 1: " in results["train"][2]
    assert "NotADirectoryError" in results["train"][2] or "FileNotFoundError" in results["train"][2]
    assert results["check"][0] == "OK"


def test_a_stage_past_its_limit_is_ended_and_reported(tmp_path):
    out = tmp_path / "out"
    result = suite(out, "check", SUITE_LIMITS="check=1")
    assert result.returncode == 0
    assert stage_results(out)["check"] == [
        "FAILED",
        stage_results(out)["check"][1],
        "ran past its 1 s limit: ended",
    ]


def test_an_unknown_stage_is_refused(tmp_path):
    result = suite(tmp_path / "out", "fp32")
    assert result.returncode == 2 and "unknown stage fp32" in result.stdout + result.stderr
