"""A command stopped while it is still starting (importing torch and the rest, before its `main` runs) ends with
one line and exit status 130 / 143, as a command stopped later does: no KeyboardInterrupt traceback from inside
an import, no silent SIGTERM death (`diffusion/starting.py`).

Each entry point runs cold, as users start it (`python -m diffusion.X`, `python train.py`), with a
`sitecustomize` on PYTHONPATH whose import hook holds the first import of torch: it says so on stderr and waits.
The test sends the signal once it has read that line, so the signal always arrives inside the import (no
sleeping, no racing on timing); the hook's wait ends by itself after ten minutes, far past the test's timeout.
"""

import os
import signal
import subprocess
import sys

import pytest
from helpers.user_errors import REPO, error_line

HELD = "held: importing torch"

SITECUSTOMIZE = f"""
import sys, time

class HoldTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            sys.stderr.write({HELD!r} + "\\n")
            sys.stderr.flush()
            time.sleep(600)
        return None

sys.meta_path.insert(0, HoldTorch())
"""

ENTRY_POINTS = {
    "sample": ["-m", "diffusion.sample"],
    "export": ["-m", "diffusion.export"],
    "evaluate": ["-m", "diffusion.evaluate"],
    "phema": ["-m", "diffusion.phema"],
    "prepare": ["-m", "diffusion.prepare"],
    "train": [str(REPO / "train.py")],
}


def stopped_while_importing(command: list[str], signal_name: str, tmp_path) -> tuple[int, str]:
    """(exit status, stderr) of `python *command --help` sent `signal_name` while it imports torch."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    process = subprocess.Popen(
        [sys.executable, *command, "--help"], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a shell starts it, not ignoring ^C
    )  # fmt: skip
    try:
        assert process.stderr is not None
        before = process.stderr.readline()  # the hook's line once it holds the import ("" at an early exit)
        assert before == f"{HELD}\n", before + process.stderr.read()[-3000:]  # nothing said before it
        process.send_signal(getattr(signal, signal_name))
        _, stderr = process.communicate(timeout=120)  # a loaded machine's exit, not the hook's wait
    finally:
        process.kill()
        process.wait()
    return process.returncode, stderr


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("entry_point", sorted(ENTRY_POINTS))
def test_a_command_stopped_while_starting_says_one_line(entry_point, signal_name, tmp_path):
    status, stderr = stopped_while_importing(ENTRY_POINTS[entry_point], signal_name, tmp_path)
    assert status == 128 + getattr(signal, signal_name), stderr[-3000:]
    assert error_line(stderr) == (
        f"error: stopped by {signal_name} while starting — nothing was written; run the command again"
    )
    assert set(os.listdir(tmp_path)) <= {"sitecustomize.py", "__pycache__"}  # nothing written


def test_the_handlers_are_back_once_the_command_is_imported():
    """Imported by a user's code (not as the program), an entry point changes no handler; run as the program, the
    handlers it found are back before the command's `main` takes over."""
    script = (
        "import signal, runpy\n"
        "before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)\n"
        "import diffusion.sample\n"
        "assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before\n"
        "from diffusion.starting import stopping_while_starting, stopped_while_starting\n"
        "with stopping_while_starting('__main__'):\n"
        "    assert signal.getsignal(signal.SIGINT) is stopped_while_starting\n"
        "    assert signal.getsignal(signal.SIGTERM) is stopped_while_starting\n"
        "assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "with stopping_while_starting('__main__'):\n"
        "    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"  # a background job's ^C stays ignored
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert process.returncode == 0, process.stderr[-3000:]


def test_every_entry_point_is_tested_here():
    """A new `python -m diffusion.X` (a module of the package's top that runs as the program) joins the list."""
    top = [
        path for path in (REPO / "diffusion").glob("*.py") if 'if __name__ == "__main__"' in path.read_text()
    ]
    assert sorted(path.stem for path in top) == sorted(name for name in ENTRY_POINTS if name != "train")
    for path in [*top, REPO / "train.py"]:
        assert "with stopping_while_starting(__name__):" in path.read_text(), path
