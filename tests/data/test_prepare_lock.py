"""Two prepares into one --out: the second is refused at once, naming the running one (pid, host, start), and the
first writes its set whole; a prepare killed by SIGKILL leaves the folder free (the lock is the kernel's)."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.user_errors import error_line

from diffusion.cli.prepare import main as prepare
from diffusion.data.prepared import PREPARE_LOCK, open_prepared

# A prepare whose sample writers wait for the file `release` (the lock held meanwhile), saying "writing" once.
WAITING = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from diffusion.data import preparing\n"
    "writing = preparing.SampleWriter._item\n"
    "def waiting(self, *entry):\n"
    "    Path(sys.argv[2], 'writing').touch()\n"
    "    while not Path(sys.argv[2], 'release').exists():\n"
    "        time.sleep(0.05)\n"
    "    return writing(self, *entry)\n"
    "preparing.SampleWriter._item = waiting\n"
    "from diffusion.cli.prepare import main\n"
    "main(['--out', sys.argv[1], '--num_workers', '1'])\n"
)


def waiting_prepare(out: Path, signals: Path) -> subprocess.Popen:
    signals.mkdir()
    first = subprocess.Popen(
        [sys.executable, "-c", WAITING, str(out), str(signals)], stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not (signals / "writing").exists():
        assert first.poll() is None and time.monotonic() < deadline, (
            first.stderr.read()[-3000:] if first.stderr else ""
        )
        time.sleep(0.05)
    return first


def test_a_second_prepare_into_an_out_being_written_is_refused_naming_the_first(tmp_path, capsys):
    out = tmp_path / "set"
    first = waiting_prepare(out, tmp_path / "signals")
    try:
        with pytest.raises(SystemExit) as exited:
            prepare(["--out", str(out), "--num_workers", "1"])
        line = error_line(capsys.readouterr().err)
        assert exited.value.code == 2
        started = time.strftime("%Y-%m-%d ")
        assert line.startswith(
            f"error: --out {out} is being written by another prepare (pid {first.pid} on host "
            f"{socket.gethostname()}, started {started}"
        ), line
        assert line.endswith(") — wait for it to finish, or pass another --out"), line
    finally:
        (tmp_path / "signals" / "release").touch()
        _, error = first.communicate(timeout=120)
    assert first.returncode == 0, error[-3000:]
    assert open_prepared(str(out)).counts == {"train": 1707, "val": 90}  # the first's set, whole
    assert not (out / PREPARE_LOCK).exists()


def test_a_prepare_killed_by_sigkill_does_not_block_the_next(tmp_path):
    out = tmp_path / "set"
    first = waiting_prepare(out, tmp_path / "signals")
    first.kill()
    first.wait(timeout=30)
    assert (out / PREPARE_LOCK).exists()  # left by the killed prepare, locked by no one
    prepare(["--out", str(out), "--num_workers", "1", "--overwrite"])  # its unfinished files replaced
    assert open_prepared(str(out)).counts == {"train": 1707, "val": 90}
    assert sorted(p.name for p in Path(out).iterdir()) == ["prepared.json", "train", "val"]
