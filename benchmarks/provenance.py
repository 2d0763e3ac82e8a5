"""Where and from what a results file's figures came: the date, the commit and the machine (the CPU's model, the
cores this process may use and its widest vector extension, or the GPU). Every benchmark writes this line at the
top of its results, so a figure the README quotes can be traced to a command of a commit on a kind of machine."""

import os
import subprocess
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def cpu_kind() -> str:
    """'AMD EPYC 7B13, 2 cores, AVX2': the model, the cores this process may use, and the widest vector extension
    (AVX-512 machines run the CPU recipes about 3x faster than AVX2-only ones), with AVX512-BF16 and AMX if there."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    extras = [name for flag, name in (("avx512_bf16", "AVX512-BF16"), ("amx_tile", "AMX")) if flag in flags]
    return f"{model}, {len(os.sched_getaffinity(0))} cores, {' + '.join([widest, *extras])}"


def commit() -> str:
    """The short hash of HEAD, marked when the tree has uncommitted changes (SUITE_COMMIT where there is no .git)."""
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT, timeout=30).returncode != 0
    except (OSError, subprocess.SubprocessError):
        revision, dirty = "", False
    revision = revision or os.environ.get("SUITE_COMMIT", "")
    return (revision + (" (uncommitted changes)" if dirty else "")) if revision else "unknown"


# The tree as the benchmark found it, read when it imports this module: the pictures and tables a run writes into
# the tree (docs/*.png, earlier results files) before its results line must not mark its own commit as changed.
COMMIT_AT_START = commit()


def provenance(device: torch.device | str = "cpu") -> str:
    """'2026-11-27, commit 8c269a5, AMD EPYC 7B13, 2 cores, AVX2, torch 2.14.1': one results file's origin (the
    commit as the run started from it)."""
    device = torch.device(device)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_kind()
    return f"{time.strftime('%Y-%m-%d')}, commit {COMMIT_AT_START}, {machine}, torch {torch.__version__}"
