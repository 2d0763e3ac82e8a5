"""Two samples into one --out: the second is refused at once, naming the running one (pid, host, start), with or
without --overwrite, and the first writes its samples whole (they shared OUT/samples.partial/, and one of them died
after its sampling with a bug's traceback); a finished or killed sample leaves the folder free (the lock is the
kernel's)."""

import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import warm
from helpers.user_errors import error_line

from diffusion.cli import sample
from diffusion.cli.sample import SAMPLE_LOCK

# A sample whose writer waits, once it has its first samples, for the file `release` (--out held meanwhile).
WAITING = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from diffusion.generation import render\n"
    "writing = render.SamplesWriter.write\n"
    "def waiting(self, samples):\n"
    "    Path(sys.argv[1], 'writing').touch()\n"
    "    while not Path(sys.argv[1], 'release').exists():\n"
    "        time.sleep(0.05)\n"
    "    return writing(self, samples)\n"
    "render.SamplesWriter.write = waiting\n"
    "from diffusion.cli.sample import main\n"
    "main(sys.argv[2:])\n"
)


def arguments(checkpoint: Path, out: Path, num_samples: int = 6) -> list[str]:
    return ["--ckpt", str(checkpoint), "--num_samples", str(num_samples), "--batch_size", "2", "--steps", "2",
            "--sampler", "ddim", "--out", str(out), "--device", "cpu"]  # fmt: skip


def waiting_sample(argv: list[str], signals: Path):
    signals.mkdir()
    first = warm.popen([sys.executable, "-c", WAITING, str(signals), *argv], stderr=-1, stdout=-1, text=True)
    deadline = time.monotonic() + 120
    while not (signals / "writing").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
        time.sleep(0.05)
    return first


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_second_sample_into_an_out_being_written_is_refused_naming_the_first(
    overwrite, digits_checkpoint, tmp_path, capsys
):
    out = tmp_path / "new" / "samples"
    first = waiting_sample(arguments(digits_checkpoint, out), tmp_path / "signals")
    try:
        started = time.monotonic()
        with pytest.raises(SystemExit) as exited:
            sample.main([*arguments(digits_checkpoint, out, 4), "--seed", "2", *overwrite])
        assert time.monotonic() - started < 10  # at once: before its checkpoint is read
        line = error_line(capsys.readouterr().err)
        assert exited.value.code == 2
        assert line.startswith(
            f"error: --out {out} is being written by another sample (pid {first.pid} on host "
            f"{socket.gethostname()}, started {time.strftime('%Y-%m-%d ')}"
        ), line
        assert line.endswith(") — wait for it to finish, or pass another --out"), line
    finally:
        (tmp_path / "signals" / "release").touch()
        output, error = first.communicate(timeout=120)
    assert first.returncode == 0, error[-3000:]
    assert output.startswith(f"wrote 6 samples to {out / 'samples.npz'}"), output
    assert sorted(p.name for p in out.iterdir()) == ["grid.png", "samples.npz"]  # no lock, no partial folder
    with np.load(out / "samples.npz") as written:
        assert written["arr_0"].shape == (6, 8, 8, 1)  # the first's, whole

    # Finished, it holds the folder no more: the next sample replaces its files
    sample.main([*arguments(digits_checkpoint, out, 4), "--overwrite"])
    with np.load(out / "samples.npz") as written:
        assert written["arr_0"].shape == (4, 8, 8, 1)
    assert sorted(p.name for p in out.iterdir()) == ["grid.png", "samples.npz"]


def test_a_sample_killed_while_writing_does_not_block_the_next(digits_checkpoint, tmp_path):
    out = tmp_path / "samples"
    first = waiting_sample(arguments(digits_checkpoint, out), tmp_path / "signals")
    first.kill()
    first.wait(timeout=30)
    assert (out / SAMPLE_LOCK).exists()  # left by the killed sample, locked by no one
    sample.main(arguments(digits_checkpoint, out, 4))  # its samples.partial/ replaced
    assert sorted(p.name for p in out.iterdir()) == ["grid.png", "samples.npz"]


def test_a_refused_sample_leaves_no_folder_it_made(digits_checkpoint, tmp_path, capsys):
    """--out is made to hold its lock before the checks: a sample refused after it (here its --ckpt) takes it away."""
    with pytest.raises(SystemExit) as exited:
        sample.main([*arguments(tmp_path / "missing.ckpt", tmp_path / "a" / "b")])
    assert exited.value.code == 2, capsys.readouterr().err[-3000:]
    assert sorted(tmp_path.iterdir()) == []
