"""`python benchmarks/speed/host_cost.py` (docs/speed.md's host-cost figures) runs both of its paths: its plain loop
had failed since the digits data became held on the device (the loader yields indices, gathered into a Batch by
the data module's on_after_batch_transfer, which a loop without a Trainer must call itself)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_host_cost_measures_both_paths(tmp_path):
    flags = ["--steps", "5", "--warmup", "2", "--rounds", "1", "--save_dir", str(tmp_path / "runs")]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/speed/host_cost.py"), *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = dict(re.findall(r"^\| (train\.py|plain loop) \| ([\d.]+) \|$", done.stdout, re.MULTILINE))
    assert set(rows) == {"train.py", "plain loop"} and all(float(ms) > 0 for ms in rows.values()), done.stdout
