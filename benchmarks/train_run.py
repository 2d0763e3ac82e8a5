"""Train a recipe as a user would, `python train.py ...` in a subprocess with its output in a log file."""

import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_training(command: list[str], log_path: Path, label: str) -> float:
    """Run `command` (a train.py command line) from the repo root; return its wall time in seconds.

    The log keeps the whole output; a failed run stops the benchmark with the log's last 30 lines.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{label}] training: {' '.join(command[1:])}  (log: {log_path})", flush=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        code = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"[{label}] training failed with exit code {code}:\n{tail}")
    return seconds
