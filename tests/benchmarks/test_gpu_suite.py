"""benchmarks/gpu/gpu_suite.sh runs end to end: a GPU is lent only now and then, for one call, and a wrong flag found
there would cost its scarce minutes. SUITE_QUICK=1 runs the same commands on this CPU with a tiny UNet (the
compiled plain loop with Dynamo's eager backend: Inductor would take minutes here)."""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers import warm

ROOT = Path(__file__).resolve().parents[2]
RETURNED_FILES = 8  # what the device tool brings back from one call


def suite(
    out: Path, *stages: str, first_on_path: Path | None = None, **env: str
) -> subprocess.CompletedProcess:
    """The suite in quick mode; `first_on_path`: a folder of stand-in commands ahead of everything."""
    path = [str(first_on_path)] if first_on_path else []
    # `python3 ...` forked warm (helpers/warm.py): what the suite runs, without importing torch each time.
    path += [warm.interpreter_folder(), str(Path(sys.executable).parent), os.environ["PATH"]]
    environment = {
        **os.environ,
        "SUITE_QUICK": "1",
        "SUITE_WORK": str(out.parent / "work"),
        "PATH": os.pathsep.join(path),
        **env,
    }
    return subprocess.run(
        ["bash", "benchmarks/gpu/gpu_suite.sh", str(out), *stages], cwd=ROOT, env=environment, capture_output=True,
        text=True, timeout=2400,
    )  # fmt: skip


def stage_results(out: Path) -> dict[str, list[str]]:
    rows = (out / "summary.md").read_text().splitlines()[2:]
    return {cells[1].strip(): [c.strip() for c in cells[2:-1]] for cells in (row.split("|") for row in rows)}


def details(out: Path) -> dict[str, str]:
    with tarfile.open(out / "details.tar.gz") as tar:
        return {
            member.name.removeprefix("details/"): tar.extractfile(member).read().decode()
            for member in tar.getmembers()
            if member.isfile()
        }


@pytest.mark.slow
def test_the_call_runs_every_stage_and_writes_gpu_md_in_the_files_the_device_tool_returns(tmp_path):
    out = tmp_path / "out"
    # A variant train.py does not accept (an option not there yet) is skipped, not a failure. The device machine
    # has no pytest-xdist (pyproject's addopts start its workers): the check stage's pytest runs without it.
    result = suite(out, SUITE_VARIANTS="--data.no_such_option 1", PYTEST_ADDOPTS="-p no:xdist")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stages = {
        stage: cells[0] for stage, cells in stage_results(out).items() if stage != "wheels"
    }  # .whl/: if any
    assert stages == dict.fromkeys(["check", "train", "sample", "speed_bf16", "speed_fp16"], "OK"), (
        out / "summary.md"
    ).read_text()
    files = [path for path in out.rglob("*") if path.is_file()]
    assert len(files) <= RETURNED_FILES
    assert sorted(path.name for path in files) == ["details.tar.gz", "gpu.md", "suite.log", "summary.md"]

    # The correctness stages side by side: all three started before the first of them ended; then each speed
    # stage alone.
    log = (out / "suite.log").read_text()
    events = re.findall(r"^=== (\w+)( \(limit|:)", log, flags=re.M)  # a stage's start, and its end
    assert sorted(events[:3]) == [("check", " (limit"), ("sample", " (limit"), ("train", " (limit")]
    assert sorted(events[3:6]) == [("check", ":"), ("sample", ":"), ("train", ":")]
    assert events[6:] == [
        ("speed_bf16", " (limit"),
        ("speed_bf16", ":"),
        ("speed_fp16", " (limit"),
        ("speed_fp16", ":"),
    ]

    files = details(out)
    train = files["train.md"]
    assert (
        "`--precision 16-mixed --max_steps 5 --ckpt_path last`: " in train and "NOT ALL FINITE" not in train
    )
    assert "(left alone): " in train and "all finite" in train
    # On the CPU the resumed run lands on the weights of the run left alone, as tests/training/test_resume.py says.
    assert "- kill -9 at step 4 + `--ckpt_path last` to step 6: raw weights max|diff| 0 from" in train
    assert "distributed_backend=gloo" in files["logs/train.log"]  # DDPStrategy on one device: NCCL on a GPU
    sample = files["sample.md"]
    for run in ("ddim-50 32", "dpmpp_2m_sde-20 bf16-mixed"):
        assert f"- {run}: 4 samples (batch 2) in " in sample and "uint8 (4, 32, 32, 3)" in sample
    bf16 = files["speed_bf16/speed.md"]
    for row in (
        "| `train.py` as users run it (StepTimer; bf16-mixed, global batch 2) |",
        "| `train.py --model.compile_training false` as users run it (StepTimer; bf16-mixed, global batch 2) |",
        "| plain loop, same module |",
        "| plain loop, network compiled (torch.compile, eager backend, as fitting compiles it) |",
        "| plain loop, network compiled NHWC (--model.compile_channels_last true) |",
        "| `train.py --model.compile_channels_last true` as users run it (StepTimer; bf16-mixed, global batch 2) |",
        "| `train.py --data.no_such_option 1`: skipped, train.py does not accept these flags: ",
    ):
        assert row in bf16
    # The profiled steps happened (a CPU has no kernels to summarise: no profile table there).
    assert json.loads(files["speed_bf16/speed.json"])["train_py"][0]["profile"] is None
    assert "Data path alone (SyntheticCIFAR10(cifar10)" in bf16
    assert (
        "project: Lightning Trainer" not in bf16
        and "| `train.py` as users run it" in files["speed_fp16/speed.md"]
    )

    gpu = (out / "gpu.md").read_text()
    assert gpu.startswith("# The project on one GPU: ") and "QUICK MODE" in gpu
    assert re.search(r"Machine: .*; torch [\d.]+.*, lightning [\d.]+.*; commit ", gpu)
    targets = [line for line in gpu.splitlines() if line.endswith(("| PASS |", "| MISS |"))]
    expected = {
        "speed_bf16": ["`train.py` >= 8,000 training images / s", "`train.py` >= 3 x diffusers' plain loop",
                       "`train.py` step <= 1.05 x the best plain loop's", "data path >= 2 x 8,000 images / s"],
        "speed_fp16": ["`train.py` >= 8,000 training images / s", "`train.py` step <= 1.05 x the best plain loop's"],
    }  # fmt: skip
    for stage, names in expected.items():
        for name in names:
            assert any(line.startswith(f"| {stage} (") and f"| {name}" in line for line in targets), (
                stage,
                name,
            )
    assert "| speed_bf16 (bf16-mixed) | `train.py --model.compile_training false` as users run it | " in gpu
    assert "| peak memory |" in gpu and "| stage | result | seconds | reason or note |" in gpu
    assert "### train.py on the GPU" in gpu and "### The sample CLI on the GPU" in gpu


@pytest.mark.slow
def test_the_compile_stage_times_a_cold_and_a_warm_compile(tmp_path):
    out = tmp_path / "out"
    result = suite(out, "compile")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert stage_results(out)["compile"][0] == "OK", (out / "summary.md").read_text()
    table = details(out)["compile/speed.md"]
    assert (
        "| `train.py (cold compile cache)` as users run it" in table
        and "| `train.py` as users run it" in table
    )
    assert re.search(r"`train.py \(cold compile cache\)` [\d.]+ s; `train.py` [\d.]+ s\.", table)
    assert re.search(r"\| compile \(bf16-mixed\) \| warm compile <= 30 s \| [\d.]+ s \| (PASS|MISS) \|",
                     (out / "gpu.md").read_text())  # fmt: skip


def test_the_call_fits_in_eight_minutes():
    result = subprocess.run(
        ["bash", "benchmarks/gpu/gpu_suite.sh", "unused"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "SUITE_DRY": "1", "SUITE_QUICK": "0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = result.stdout.strip()
    assert plan.startswith("plan: wheels (") and ", side by side: check (" in plan
    assert plan.index("side by side:") < plan.index("then alone: speed_bf16 (") < plan.index("speed_fp16 (")
    limits = {stage: int(s) for stage, s in re.findall(r"(\w+) \((\d+) s\)", plan)}
    side_by_side = max(limits["check"], limits["train"], limits["sample"])
    total = limits["wheels"] + side_by_side + limits["speed_bf16"] + limits["speed_fp16"]
    assert plan.endswith(f"at most {total} s") and total <= 480
    assert not (ROOT / "unused").exists()  # a dry run writes nothing


def test_a_failing_stage_says_why_and_the_next_one_runs_and_one_past_its_limit_is_ended_whole(tmp_path):
    """train cannot make its folder: FAILED, and why. check runs next; its first command ignores SIGTERM (pytest did,
    through a test's Trainer) and outlives the stage's limit: it is gone when the stage is reported ended, not left
    running beside the next, timed stage."""
    out, shims, pid_file = tmp_path / "out", tmp_path / "bin", tmp_path / "stubborn.pid"
    shims.mkdir()
    # The check stage's first command; gpu_report.py's own call of it is answered at once.
    stubborn = shims / "nvidia-smi"
    stubborn.write_text(
        f"#!/bin/bash\n[[ $* == *clocks.max.sm* ]] || exit 1\ntrap '' TERM\necho $$ > {pid_file}\nexec sleep 120\n"
    )
    stubborn.chmod(0o755)
    result = suite(
        out, "train", "check", first_on_path=shims, SUITE_WORK="/dev/null/work", SUITE_LIMITS="check=1"
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = stage_results(out)
    assert results["train"][0] == "FAILED" and "exit status 1: " in results["train"][2]
    assert "NotADirectoryError" in results["train"][2] or "FileNotFoundError" in results["train"][2]
    assert "| train | FAILED |" in (out / "gpu.md").read_text()
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    assert results["check"] == ["FAILED", results["check"][1], "ran past its 1 s limit: ended"]
    assert sorted(path.name for path in out.rglob("*")) == [
        "details.tar.gz",
        "gpu.md",
        "suite.log",
        "summary.md",
    ]
    assert "logs/check.log" in details(out)


def test_an_unknown_stage_is_refused(tmp_path):
    result = suite(tmp_path / "out", "fp32")
    assert result.returncode == 2 and "unknown stage fp32" in result.stdout + result.stderr


def test_calls_of_one_session_merge_into_one_report_naming_the_gpu(tmp_path):
    """A stage rerun in a second call joins the first call's report (gpu_report.py --merge), here on the CPU: the
    later stage's files replace the earlier's, every summary row stays, and the machine is the first call's."""
    header = "| stage | result | seconds | reason or note |\n| --- | --- | ---: | --- |\n"
    first, second = tmp_path / "call1", tmp_path / "call2"
    (first / "details").mkdir(parents=True)
    (first / "details" / "machine.md").write_text("NVIDIA H200 (143771 MiB), 16 CPU cores; torch 2.11.0\n")
    (first / "details" / "train.md").write_text("## train.py on the GPU\n\n- ran past its limit\n")
    (first / "summary.md").write_text(header + "| train | FAILED | 170 | ran past its 170 s limit: ended |\n")
    packed = tmp_path / "packed" / "details"
    packed.mkdir(parents=True)
    (packed / "train.md").write_text("## train.py on the GPU\n\n- kill -9 + resume: max|diff| 0\n")
    (packed / "machine.md").write_text("no GPU\n")
    second.mkdir()
    with tarfile.open(second / "details.tar.gz", "w:gz") as tar:
        tar.add(packed, arcname="details")
    (second / "summary.md").write_text(header + "| train | OK | 72 |  |\n")
    merged = tmp_path / "merged"
    subprocess.run(
        [sys.executable, "benchmarks/gpu/gpu_report.py", str(merged), "--merge", str(first), str(second)],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    report = (merged / "gpu.md").read_text()
    assert "Machine: NVIDIA H200 (143771 MiB), 16 CPU cores; torch 2.11.0." in report
    assert "max|diff| 0" in report and "ran past its limit" not in report
    assert report.index("| train | FAILED | 170 |") < report.index("| train | OK | 72 |")


@pytest.mark.parametrize("steps", [1, 5, 30])
def test_on_cuda_a_path_timed_over_fewer_steps_than_a_chunk_still_gives_its_steps(monkeypatch, steps):
    """On CUDA the step clock synchronizes once per chunk of steps; a path timed over fewer steps than a chunk (the
    sampling stage's one round) still gives step times, not an empty list."""
    from benchmarks.speed import speed_paths

    synchronized = []
    monkeypatch.setattr(speed_paths.torch.cuda, "synchronize", lambda: synchronized.append(1))
    clock = speed_paths.StepClock(speed_paths.torch.device("cuda"), warmup=1, steps=steps)
    for _ in range(1 + steps):
        clock.tick()
    clock.tick()
    times = clock.per_step()
    assert times and len(times) == max(1, steps // 10) and len(synchronized) < 2 + steps
