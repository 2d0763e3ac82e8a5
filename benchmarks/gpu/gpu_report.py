"""OUT/gpu.md from what benchmarks/gpu/gpu_suite.sh's stages left in OUT: the machine, the versions, the date, the
targets PASS/MISS, the training speed of every path, the correctness checks and each stage's result, in the form
of benchmarks/results/gpu.md (copy it there).

    python benchmarks/gpu/gpu_report.py OUT [--seconds S] [--plan TEXT]
    python benchmarks/gpu/gpu_report.py MERGED --merge OUT1 OUT2 ...  # several calls' OUTs, here on any machine

--merge: the calls of one session (a stage rerun alone in a second call, say) into one gpu.md: every OUT's
details (a later call's stage replaces an earlier one's), their summaries' rows one after another, and the machine
line the first call wrote (details/machine.md) rather than this machine's.

Reads OUT/summary.md and OUT/details/ (or, once packed, OUT/details.tar.gz): train.md, sample.md, speed_bf16/,
speed_fp16/, compile/ and sampling/ (speed.md, speed.json).
Imports no torch: the versions come from the installed packages' metadata, the GPU from nvidia-smi.
"""

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

from benchmarks import provenance

ROOT = Path(__file__).resolve().parents[2]
SPEED_STAGES = ("speed_bf16", "speed_fp16", "compile")  # compile: cold and warm, a call of its own


def stage_label(stage: str, speed: dict) -> str:
    """The stage and the precision it ran (a CPU runs 16-mixed as bf16-mixed)."""
    return f"{stage} ({speed['precision']})"


def run_quietly(*command: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=ROOT)
        if result.returncode == 0:
            return result.stdout.strip()
    return ""


def machine() -> str:
    """The GPU (nvidia-smi: name, memory, driver) or, without one, the CPU; and its cores."""
    gpu = run_quietly("nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader")
    cores = f"{os.cpu_count()} CPU cores"
    if gpu:
        name, memory, driver = (part.strip() for part in gpu.splitlines()[0].split(","))
        return f"{name} ({memory}, driver {driver}), {cores}"
    cpu = "a CPU"
    with contextlib.suppress(OSError):
        cpu = next(
            (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")), cpu,
        )  # fmt: skip
    return f"no GPU (nvidia-smi: none): {cpu}, {cores}"


def versions() -> str:
    found = []
    for package in ("torch", "lightning", "jsonargparse", "diffusers"):
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package} not installed")
    cuda = re.search(r"\+cu(\d+)(\d)$", importlib.metadata.version("torch"))
    return ", ".join(found) + (f" (CUDA {cuda[1]}.{cuda[2]})" if cuda else "")


def commit() -> str:
    revision = provenance.commit()
    return (
        f"commit {revision}"
        if revision != "unknown"
        else "commit unknown (the copy has no .git: SUITE_COMMIT names it)"
    )


def demoted(markdown: str) -> list[str]:
    """A stage's own markdown under this file's headings (## -> ###)."""
    return [("#" + line) if line.startswith("## ") else line for line in markdown.strip().splitlines()]


def speed_rows(stage: str, speed: dict) -> list[str]:
    """One row per path and train.py run: ms/step, images/s, share of the peak, peak memory."""
    label, batch, flops, peak = (
        stage_label(stage, speed),
        speed["batch"],
        speed["flops"],
        speed.get("peak_tflops"),
    )
    rows = []

    def row(name: str, seconds: float, memory: int, graphs: str = "-") -> None:
        tflops = flops / seconds / 1e12
        share = f"{tflops / peak:.1%}" if peak else "-"
        rows.append(
            f"| {label} | {name} | {seconds * 1000:.2f} | {batch / seconds:,.0f} | {share} "
            f"| {memory / 2**30:.2f} GiB | {graphs} |"
        )

    for report in speed["train_py"]:
        graphs = f"{report['graphs_compiled']} ({report['graphs_compiled_after_warmup']})"
        row(
            f"`{report['label']}` as users run it",
            report["median_ms"] / 1000,
            report["peak_memory_bytes"],
            graphs,
        )
    for path in speed["paths"]:
        if path["times"]:
            name = f"{path['name']} ({path['note']})" if path["note"] else path["name"]
            row(name, statistics.median(path["times"]), path["peak_bytes"])
    rows += [f"| {label} | {line} | | | | | |" for line in speed["problems"] + speed.get("skipped", [])]
    return rows


def report(out: Path, seconds: int | None, plan: str) -> str:
    details = out / "details"
    if (
        not details.is_dir() and (out / "details.tar.gz").is_file()
    ):  # written again from a packed call's files
        unpacked = Path(tempfile.mkdtemp(prefix="gpu_report_"))
        with tarfile.open(out / "details.tar.gz") as tar:
            tar.extractall(unpacked, filter="data")
        details = unpacked / "details"
    speeds, sampling = {}, None
    for stage in SPEED_STAGES:
        with contextlib.suppress(OSError, ValueError):
            speeds[stage] = json.loads((details / stage / "speed.json").read_text())
    with contextlib.suppress(OSError, ValueError):
        sampling = json.loads((details / "sampling" / "speed.json").read_text())
    quick = " QUICK MODE (SUITE_QUICK=1, a tiny UNet): the commands, not the numbers." if os.environ.get(
        "SUITE_QUICK"
    ) == "1" else ""  # fmt: skip
    # Where the stages ran (kept in the details, so a report merged elsewhere names the GPU, not this machine).
    machine_file = details / "machine.md"
    if not machine_file.is_file():
        machine_file.write_text(f"{machine()}; {versions()}; {commit()}\n")
    where = machine_file.read_text().strip()
    device = next((s["device"] for s in [*speeds.values(), sampling] if s), where.split(" (")[0])
    call = f"one call of {seconds} s" if seconds is not None else "the suite"
    lines = [
        f"# The project on one GPU: {device} ({time.strftime('%Y-%m-%d', time.gmtime())})",
        "",
        f"Machine: {where}. `bash benchmarks/gpu/gpu_suite.sh OUT`: {call}"
        + (f" (plan: {plan})" if plan else "")
        + f".{quick}",
    ]
    if speeds:
        first = next(iter(speeds.values()))
        lines += [
            "",
            f"## Targets (the CIFAR-10 recipe, {first['num_params']:,} parameters, batch {first['batch']}, "
            f"{first['flops'] / first['batch'] / 1e9:.2f} GFLOP per image, synthetic data)",
            "",
            "| stage (precision) | target | value | result |",
            "| --- | --- | ---: | --- |",
        ]
        for stage, speed in speeds.items():
            for target in speed["targets"]:
                result = "PASS" if target["pass"] else "MISS"
                lines.append(
                    f"| {stage_label(stage, speed)} | {target['target']} | {target['value']} | {result} |"
                )
        peak = f"{first['peak_tflops']:g}" if first.get("peak_tflops") else "-"
        lines += [
            "",
            "## Training speed",
            "",
            f"| stage (precision) | path | ms / step | images / s | share of {peak} TFLOP/s | peak memory "
            "| graphs compiled (after warm-up) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for stage, speed in speeds.items():
            lines += speed_rows(stage, speed)
        lines += [
            "",
            "`train.py` rows: a process of its own as users run it, the median step of its StepTimer; peak memory "
            "since its fit started. Plain loops and diffusers: interleaved in one process, the median step over "
            "rounds; peak memory while the path ran. Each stage's own table is below.",
        ]
    if sampling:
        lines += [
            "",
            f"## Sampling speed (the CIFAR-10 recipe's network, {sampling['num_params']:,} parameters; issue 25)",
            "",
            "| target | value | result |",
            "| --- | ---: | --- |",
            *(
                f"| {t['target']} | {t['value']} | {'PASS' if t['pass'] else 'MISS'} |"
                for t in sampling["targets"]
            ),
        ]
    summary = out / "summary.md"
    lines += ["", "## Stages", ""] + (
        summary.read_text().strip().splitlines() if summary.is_file() else ["(none)"]
    )
    for name in ("train.md", "sample.md"):
        if (details / name).is_file():
            lines += ["", *demoted((details / name).read_text())]
    for stage in [*speeds, *(["sampling"] if sampling else [])]:
        lines += ["", *demoted((details / stage / "speed.md").read_text())]
    text = "\n".join(lines) + "\n"
    (out / "gpu.md").write_text(text)
    return text


def merge(merged: Path, outs: list[Path]) -> None:
    """The calls' OUTs into MERGED: details unpacked one over another, the summaries' rows in call order."""
    details = merged / "details"
    details.mkdir(parents=True, exist_ok=True)
    rows = []
    for out in outs:
        with tempfile.TemporaryDirectory() as unpacked:
            if (out / "details.tar.gz").is_file():
                with tarfile.open(out / "details.tar.gz") as tar:
                    tar.extractall(unpacked, filter="data")
            source = out / "details" if (out / "details").is_dir() else Path(unpacked) / "details"
            for path in sorted(source.rglob("*")) if source.is_dir() else []:
                target = details / path.relative_to(source)
                if path.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                elif not (path.name == "machine.md" and target.is_file()):  # the first call's machine line
                    target.write_bytes(path.read_bytes())
        if (out / "summary.md").is_file():
            rows += [line for line in (out / "summary.md").read_text().splitlines()[2:] if line.strip()]
    header = "| stage | result | seconds | reason or note |\n| --- | --- | ---: | --- |\n"
    (merged / "summary.md").write_text(header + "".join(f"{row}\n" for row in rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=int, help="the call's wall time")
    parser.add_argument("--plan", default="", help="the stages and their limits")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="CALL_OUT", help="merge these calls' OUTs")
    args = parser.parse_args()
    if args.merge:
        merge(args.out, args.merge)
    report(args.out, args.seconds, args.plan)
    print(f"written to {args.out / 'gpu.md'}")
