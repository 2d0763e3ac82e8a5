"""tests/helpers/warm.py's commands are what `python ...` would be: the same probe, run cold (subprocess) and warm
(forked from the forkserver), reports the same facts, prints the same, exits the same way. The tests that launch
warm rely on it."""

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import warm

PROBE = """
import atexit, json, os, sys
import __main__
atexit.register(lambda: print("atexit ran", flush=True))
facts = {
    "argv": sys.argv, "cwd": os.getcwd(), "path": sys.path, "name": __name__,
    "spec": getattr(__main__.__spec__, "name", None), "probe": os.environ.get("PROBE"),
    "session_leader": os.getpgid(0) == os.getpid(), "write_through": sys.stdout.write_through,
}
if os.environ.get("THREADS"):
    import torch
    facts["threads"] = torch.get_num_threads()
print(json.dumps(facts))
print("to stderr", file=sys.stderr)
if os.environ.get("FAIL"):
    def deeper():
        raise ValueError("the probe failed")
    deeper()
if os.environ.get("WAIT"):
    import time
    print("waiting", flush=True)
    with open("ready", "w") as ready:
        ready.write(str(os.getpid()))
    time.sleep(60)
sys.exit(3)
"""


@pytest.fixture
def probe(tmp_path):
    lib, work = tmp_path / "lib", tmp_path / "work"
    lib.mkdir()
    work.mkdir()
    (lib / "probe_module.py").write_text(PROBE)
    (tmp_path / "probe.py").write_text(PROBE)
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTHONUNBUFFERED")}
    environment.update(PYTHONPATH=str(lib), PROBE="set for this command")
    return {"script": str(tmp_path / "probe.py"), "work": work, "env": environment}


def both(cmd: list[str], **kwargs) -> list[subprocess.CompletedProcess]:
    """The command cold, then warm."""
    return [
        launch(cmd, capture_output=True, text=True, timeout=120, **kwargs)
        for launch in (subprocess.run, warm.run)
    ]


@pytest.mark.parametrize("form", ["script", "-m", "-c", "-u script"])
def test_a_warm_command_sees_what_a_cold_one_sees(probe, form):
    head = {"script": [probe["script"]], "-m": ["-m", "probe_module"], "-c": ["-c", PROBE],
            "-u script": ["-u", probe["script"]]}[form]  # fmt: skip
    env = {**probe["env"], "THREADS": "1"} if form == "script" else {**probe["env"], "OMP_NUM_THREADS": "1"}
    cold, hot = both([sys.executable, *head, "a", "--b"], cwd=probe["work"], env=env)
    assert cold.returncode == hot.returncode == 3
    assert cold.stderr == hot.stderr == "to stderr\n"
    facts, atexit_line = cold.stdout.splitlines()
    assert atexit_line == "atexit ran" and hot.stdout.splitlines()[1] == atexit_line
    assert json.loads(hot.stdout.splitlines()[0]) == json.loads(facts)
    assert json.loads(facts)["probe"] == "set for this command"


@pytest.mark.parametrize("form", ["script", "-m", "-c"])
def test_python_from_the_warm_folder_is_the_python_it_stands_for(probe, form):
    """bash's `python ...` with warm.interpreter_folder() first on PATH: forked warm, the command sees, prints and
    ends as the interpreter would, except that it leads a process group of its own; what is not a command
    (`python -V`) runs cold."""
    head = {"script": [probe["script"]], "-m": ["-m", "probe_module"], "-c": ["-c", PROBE]}[form]
    results = []
    for folder in (os.path.dirname(sys.executable), warm.interpreter_folder()):
        results.append(subprocess.run(
            ["bash", "-c", 'python -V && python "$@"', "bash", *head, "a", "--b"], cwd=probe["work"],
            env={**probe["env"], "PATH": os.pathsep.join((folder, os.environ["PATH"]))}, capture_output=True,
            text=True, timeout=120,
        ))  # fmt: skip
    cold, hot = results
    assert cold.returncode == hot.returncode == 3 and cold.stderr == hot.stderr == "to stderr\n"
    version, facts, atexit_line = cold.stdout.splitlines()
    assert hot.stdout.splitlines()[::2] == [version, atexit_line] and version.startswith("Python ")
    cold_facts, hot_facts = json.loads(facts), json.loads(hot.stdout.splitlines()[1])
    assert not cold_facts.pop("session_leader") and hot_facts.pop("session_leader")
    assert hot_facts == cold_facts


def test_what_a_warm_command_starts_with_sys_executable_starts_warm(probe):
    """sys.executable in a warm command is the warm folder's `python`: what the command starts with it (the
    benchmarks' train.py, the ranks Lightning's launcher starts) is forked warm too, its exit status passed back."""
    nested = "import sys; print('torch' in sys.modules); sys.exit(5)"
    code = f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', {nested!r}]).returncode)"
    cold, hot = both([sys.executable, "-c", code], cwd=probe["work"], env=probe["env"])
    assert (cold.returncode, cold.stdout) == (5, "False\n")
    assert (hot.returncode, hot.stdout) == (5, "True\n")


def test_a_failure_prints_the_same_traceback_and_exits_1(probe):
    cold, hot = both([sys.executable, probe["script"]], cwd=probe["work"], env={**probe["env"], "FAIL": "1"})
    assert cold.returncode == hot.returncode == 1
    assert "ValueError: the probe failed" in cold.stderr and "in deeper" in cold.stderr
    assert hot.stderr == cold.stderr
    assert hot.stdout.splitlines()[1:] == cold.stdout.splitlines()[1:] == ["atexit ran"]


def running(pid: int) -> bool:
    """Not ended (a zombie has ended; its parent has yet to read its status)."""
    with contextlib.suppress(FileNotFoundError):
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    return False


def _through_the_warm_python(cmd: list[str], **kwargs) -> subprocess.Popen:
    """`cmd` with warm.interpreter_folder()'s `python` for the interpreter: a process standing in for the command."""
    return subprocess.Popen([warm.python(), *cmd[1:]], **kwargs)


@pytest.mark.parametrize("how", ["interrupted", "killed with its session"])
def test_signals_end_a_warm_command_as_they_end_a_cold_one(probe, how):
    """Cold, warm, and through the warm folder's `python` (the signal reaches the process standing in for the
    command, which passes it on or, killed, has the command's group killed)."""
    endings = []
    ready = probe["work"] / "ready"
    for launch in (subprocess.Popen, warm.popen, _through_the_warm_python):
        process = launch(
            [sys.executable, probe["script"]], cwd=probe["work"], env={**probe["env"], "WAIT": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while (
            not (ready.exists() and ready.read_text())
            and process.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        command = int(ready.read_text())
        ready.unlink()
        if how == "interrupted":
            process.send_signal(signal.SIGINT)
        else:
            os.killpg(process.pid, signal.SIGKILL)
        endings.append((process.communicate(timeout=60)[0], process.returncode))
        while running(command) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(command), f"{launch}: the command outlived its end"
    assert endings[0] == endings[1] == endings[2]
    output, code = endings[0]
    if how == "interrupted":  # the traceback, atexit's line, then ended by SIGINT, as an interpreter does
        assert code == -signal.SIGINT and output.endswith("KeyboardInterrupt\natexit ran\n")
    else:
        assert code == -signal.SIGKILL and output.endswith("waiting\n")


def test_ctrl_c_ends_a_command_whatever_the_forkserver_started_with(tmp_path):
    """The forkserver keeps the signal handlers of the moment it started (a test may be ignoring SIGINT then); each
    command starts with an interpreter's own. Run in a process of its own, whose forkserver imports nothing."""
    script = tmp_path / "ignoring.py"
    script.write_text(f"""
import signal, subprocess, sys, time
sys.path.insert(0, {str(Path(__file__).parent / "helpers")!r})
import warm  # not through the helpers package, which imports the training stack
warm.PRELOAD = []
if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warm.run([sys.executable, "-c", "pass"], check=True)  # the forkserver starts now
    command = warm.popen([sys.executable, "-c", "import time; open('ready', 'w').close(); time.sleep(60)"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while command.poll() is None and not __import__("os").path.exists("ready"):
        time.sleep(0.05)
    command.send_signal(signal.SIGINT)
    print(command.wait(timeout=30))
""")
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == str(-signal.SIGINT), result.stderr[-2000:]


RANKS_PROBE = """
import json, os, sys
import torch
from lightning.fabric import Fabric
fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
ranks_sum = fabric.all_reduce(torch.tensor(fabric.global_rank + 1.0), reduce_op="sum")
group = fabric.all_gather(torch.tensor([os.getpid(), os.getpgrp()]))  # every rank's (pid, process group)
print(json.dumps({
    "rank": fabric.global_rank, "world_size": fabric.world_size, "ranks_sum": ranks_sum.item(),
    "one_group_led_by_rank_0": bool((group[:, 1] == group[0, 0]).all()), "argv": sys.argv[1:],
    "env": {k: os.environ.get(k) for k in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "PROBE")},
}), flush=True)
# As train.py does (closing_process_group): exiting with gloo's group alive aborted about one run in twelve here
# ("terminate called without an active exception", exit status -6).
torch.distributed.destroy_process_group()
"""


def test_warm_ranks_are_the_ranks_lightnings_launcher_starts(probe, tmp_path):
    """`warm.popen(..., ranks=2)` against the same DDP command started by Lightning's own launcher (rank 0 cold,
    which starts rank 1): each rank's place in the world, its launcher's environment, one process group, one
    output."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_PROBE)
    outputs = []
    for launch in (subprocess.Popen, functools.partial(warm.popen, ranks=2)):
        process = launch(
            [sys.executable, str(script), "an argument"],
            cwd=probe["work"],
            env=probe["env"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            output = process.communicate(timeout=120)[0]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        assert process.returncode == 0, output
        outputs.append(
            sorted((json.loads(line) for line in output.splitlines()), key=lambda rank: rank["rank"])
        )
    cold, warm_ranks = outputs
    assert warm_ranks == cold
    assert [rank["rank"] for rank in cold] == [0, 1] and all(rank["ranks_sum"] == 3 for rank in cold)
    assert all(rank["one_group_led_by_rank_0"] and rank["env"]["PROBE"] for rank in cold)
