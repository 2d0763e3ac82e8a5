"""`python train.py ...` without paying for the imports again: commands forked from an interpreter that imported the
training stack once.

Importing what `train.py` needs (torch, Lightning, which imports torchmetrics, which imports torchvision's models,
scipy.signal and matplotlib) costs 7-9 s of CPU on the 2-core test machine, and about half of the suite's CPU went to such
imports: 130-odd launched processes, each importing the same modules (benchmarks/results/suite_time.md). Here a
multiprocessing forkserver imports them once per pytest worker, and each command is a fork of it: a process of its
own (its pid, its exit status, its signals, its output on a pipe, a session of its own when asked), starting with
the modules imported and nothing else done. `popen` and `run` take what subprocess.Popen and subprocess.run take
where tests use it; a command that is not `python SCRIPT`, `python -m MODULE` or `python -c CODE` runs cold.

What differs from a cold start, and is set right in the child (warm_child.py): os.environ (the command's), the
working directory, sys.argv, sys.path (the script's folder, the working directory for -m or '' for -c, PYTHONPATH's
entries, then the interpreter's own), the CPU threads (OMP_NUM_THREADS is read when torch loads), stdout and stderr
made anew (buffering, -u, PYTHONUNBUFFERED), an interpreter's signal handlers, and the atexit handlers, which run at
the end as at an interpreter's exit. What a fork cannot change: environment variables other libraries read while
being imported. A test of how a command starts (the launchers, what a fresh interpreter imports) launches cold:
subprocess itself.

Commands not started by a test: interpreter_folder()'s `python` (warm_client.py) stands in for a command forked warm
by a relay thread of the worker. First on PATH, bash's `python3 ...` (the GPU suite's stages) start warm; it is every
warm command's sys.executable, so what a warm command starts itself (the benchmarks' train.py, the ranks Lightning's
launcher starts) does too. `ranks=2` starts a command's DDP ranks warm, with the environment a launcher gives a rank
(Lightning then starts none): for the tests of what DDP does, not of how Lightning's launcher watches its ranks.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

if __package__:  # helpers.warm
    from .warm_child import run_forked
else:  # `import warm`, tests/helpers on sys.path without the helpers package (which imports the training stack)
    from warm_child import run_forked

# Imported once, in the forkserver: everything `train.py`, `python -m diffusion.sample` and `-m diffusion.evaluate`
# import before they start work.
PRELOAD = ["diffusion.cli.train", "diffusion.cli.sample", "diffusion.cli.evaluate", "tensorboard"]
INTERPRETER = sys.executable  # this one's, not a warm command's (the relay's `python`)
_started = threading.Lock()  # tests launch from thread pools: one forkserver all the same
_context = None
_interpreter_path: list[str] = []
_relay_folder: list[str] = []  # interpreter_folder()'s


def _forkserver() -> multiprocessing.context.BaseContext:
    """Started on first use, with that moment's environment (each command gets its own; only what libraries read
    while being imported comes from this one)."""
    global _context
    with _started:
        if _context is None:
            # sys.path of a fresh interpreter without PYTHONPATH: pytest's own entries must not reach the commands.
            bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            _interpreter_path[:] = json.loads(subprocess.run(
                [INTERPRETER, "-c", "import sys, json; print(json.dumps(sys.path[1:]))"], cwd="/", env=bare,
                capture_output=True, text=True, check=True,
            ).stdout)  # fmt: skip
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            _context = context
    return _context


def interpreter_folder() -> str:
    """A folder whose `python` and `python3` start `python ...` commands warm, through this process's relay."""
    with _started:
        if not _relay_folder:
            folder = tempfile.mkdtemp(prefix="warm-python-")
            address = os.path.join(folder, "relay")
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(address)
            listener.listen(64)
            client = Path(__file__).with_name("warm_client.py")
            words = " ".join(shlex.quote(str(w)) for w in (INTERPRETER, "-IS", client, address, INTERPRETER))
            Path(folder, "python").write_text(f'#!/bin/sh\nexec {words} "$@"\n')
            Path(folder, "python").chmod(0o755)
            Path(folder, "python3").symlink_to("python")
            threading.Thread(target=_relay, args=(listener,), daemon=True).start()
            atexit.register(shutil.rmtree, folder, True)
            _relay_folder.append(folder)
    return _relay_folder[0]


def python() -> str:
    """interpreter_folder()'s `python`: `sys.executable` for what a test runs in its own process (speed.main(...)) to
    start its `sys.executable ...` commands warm."""
    return os.path.join(interpreter_folder(), "python")


def _relay(listener: socket.socket) -> None:
    while True:  # a thread per command: commands run side by side
        connection, _ = listener.accept()
        threading.Thread(target=_relay_one, args=(connection,), daemon=True).start()


def _relay_one(connection: socket.socket) -> None:
    """One command of warm_client.py's: forked warm, in a session of its own, with the client's working directory,
    environment, stdout and stderr; its pid sent back, then its exit status. The client gone first (killed):
    the command's process group is killed."""
    with connection:
        # The request's length with the client's stdout and stderr, then the request.
        header, fds, _, _ = socket.recv_fds(connection, 4, 2)
        try:
            size, body = (struct.unpack("!I", header)[0] if len(header) == 4 else 1), b""
            while len(body) < size and (chunk := connection.recv(size - len(body))):
                body += chunk
            if len(body) < size or len(fds) != 2:  # the client ended before its request did
                return
            request = json.loads(body)
            cmd = [INTERPRETER, *request["args"]]
            form = _warm_form(cmd)
            if form is None:
                connection.sendall(b'{"cold": true}\n')
                return
            process = WarmProcess(cmd, *form, cwd=request["cwd"], env=request["env"], stdout=fds[0], stderr=fds[1],
                                  start_new_session=True)  # fmt: skip
        finally:
            for fd in fds:  # the command holds its own copies
                os.close(fd)
        connection.sendall(json.dumps({"pid": process.pid}).encode() + b"\n")
        ended = process._processes[0].sentinel
        if connection not in multiprocessing.connection.wait([connection, ended]) or connection.recv(1):
            connection.sendall(json.dumps({"status": process.wait()}).encode() + b"\n")
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _warm_form(cmd: list[str]) -> tuple[list[str], bool] | None:
    """(`-m MODULE ARGS` | `SCRIPT ARGS` | `-c CODE ARGS`, unbuffered) for `python [-u] ...`; None otherwise."""
    interpreters = [
        INTERPRETER,
        *(os.path.join(folder, "python") for folder in _relay_folder),
    ]  # no relay started
    if not cmd or os.path.realpath(cmd[0]) not in {os.path.realpath(path) for path in interpreters}:
        return None
    rest, unbuffered = list(cmd[1:]), False
    if rest[:1] == ["-u"]:
        rest, unbuffered = rest[1:], True
    if not rest or (rest[0].startswith("-") and rest[0] not in ("-m", "-c")):
        return None
    return rest, unbuffered


class WarmProcess:
    """subprocess.Popen's face (pid, poll, wait, communicate, send_signal, kill, returncode) for a forked command.

    ranks > 1: the command's DDP ranks, each forked warm with the environment a launcher gives a rank (`LOCAL_RANK`,
    `NODE_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), as torchrun or a cluster starts them and as Lightning's
    launcher sets them for the ranks it starts (Lightning then starts none: the processes are made outside). They
    share the output pipes, as the ranks Lightning's launcher starts share rank 0's, and one process group led by rank
    0 (`pid`), asked for or not; no session (a group cannot span sessions), so start_new_session is that group here.
    The exit status is the first rank's that is not 0, in rank order."""

    def __init__(self, cmd: list[str], form: list[str], unbuffered: bool, *, cwd: str | Path | None = None,
                 env: dict[str, str] | None = None, stdout: int | IO | None = None, stderr: int | IO | None = None,
                 text: bool = False, start_new_session: bool = False, ranks: int = 1) -> None:  # fmt: skip
        context = _forkserver()
        self.args, self.returncode, self._text = cmd, None, text
        self._pipes: dict[str, int] = {}
        ends: dict[str, multiprocessing.connection.Connection | None] = {"out": None, "err": None}
        for name, target in (("out", stdout), ("err", stderr)):
            if target == subprocess.PIPE:
                read, write = os.pipe()
                self._pipes[name] = read
                ends[name] = multiprocessing.connection.Connection(write, readable=False)
            elif target == subprocess.STDOUT and name == "err":
                ends["err"] = ends["out"]
            elif target is not None and target != subprocess.DEVNULL:
                fd = target if isinstance(target, int) else target.fileno()
                ends[name] = multiprocessing.connection.Connection(os.dup(fd), readable=False)
            elif target == subprocess.DEVNULL:
                ends[name] = multiprocessing.connection.Connection(
                    os.open(os.devnull, os.O_WRONLY), readable=False
                )
        environment = dict(os.environ if env is None else env)
        executable = python()
        self._processes: list[multiprocessing.process.BaseProcess] = []
        for rank, rank_environment in enumerate(_rank_environments(environment, ranks)):
            group = None if ranks == 1 else (0 if rank == 0 else self._processes[0].pid)
            process = context.Process(
                target=run_forked,
                args=(form, unbuffered, str(cwd or os.getcwd()), rank_environment, _interpreter_path, ends["out"],
                      ends["err"], start_new_session and ranks == 1, group, executable),
            )  # fmt: skip
            process.start()
            self._processes.append(process)
        for end in {id(e): e for e in ends.values() if e is not None}.values():
            end.close()  # the children hold their copies: the pipes end when they (and what they start) exit
        self.pid = self._processes[0].pid
        self._output: dict[str, list[bytes]] = {name: [] for name in self._pipes}
        self._readers = [
            threading.Thread(target=self._drain, args=(name,), daemon=True) for name in self._pipes
        ]
        for reader in self._readers:
            reader.start()

    def _drain(self, name: str) -> None:
        with os.fdopen(self._pipes[name], "rb") as pipe:
            while chunk := pipe.read1(65536):
                self._output[name].append(chunk)

    def poll(self) -> int | None:
        if self.returncode is None and not any(process.is_alive() for process in self._processes):
            for process in self._processes:
                process.join()
            self.returncode = next((p.exitcode for p in self._processes if p.exitcode), 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        for process in self._processes:
            process.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Like Popen's: waits for the pipes' end (every process holding them has exited) and the exit status."""
        for reader in self._readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(timeout)
        return self._read("out"), self._read("err")

    def _read(self, name: str) -> str | bytes | None:
        if name not in self._output:
            return None
        data = b"".join(self._output[name])
        return data.decode(errors="replace") if self._text else data

    def send_signal(self, signal_number: int) -> None:
        """To every rank still running, as a signal to their process group would reach them."""
        for process in self._processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal_number)

    def terminate(self) -> None:
        for process in self._processes:
            process.terminate()

    def kill(self) -> None:
        for process in self._processes:
            process.kill()


def _rank_environments(env: dict[str, str], ranks: int) -> list[dict[str, str]]:
    """One rank's environment per rank; a single process keeps the command's own."""
    if ranks == 1:
        return [env]
    from lightning.fabric.plugins.environments.lightning import find_free_network_port

    shared = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(find_free_network_port()), "NODE_RANK": "0",
              "WORLD_SIZE": str(ranks)}  # fmt: skip
    return [{**env, **shared, "LOCAL_RANK": str(rank)} for rank in range(ranks)]


def popen(cmd: list[str], *, ranks: int = 1, **kwargs: Any) -> WarmProcess | subprocess.Popen:
    """subprocess.Popen(cmd, **kwargs), forked warm where `cmd` is `python SCRIPT|-m MODULE|-c CODE ...`; `ranks`:
    as many DDP ranks of it (WarmProcess)."""
    warm = _warm_form([str(part) for part in cmd])
    if warm is None:
        if ranks != 1:
            raise ValueError(f"only a `python ...` command starts as {ranks} warm ranks: {cmd}")
        return subprocess.Popen(cmd, **kwargs)
    return WarmProcess([str(part) for part in cmd], *warm, ranks=ranks, **kwargs)


def run(cmd: list[str], *, capture_output: bool = False, timeout: float | None = None, check: bool = False,
        **kwargs: Any) -> subprocess.CompletedProcess:  # fmt: skip
    """subprocess.run(cmd, ...), forked warm where `cmd` is `python SCRIPT|-m MODULE|-c CODE ...`."""
    if capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process = popen(cmd, **kwargs)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result
