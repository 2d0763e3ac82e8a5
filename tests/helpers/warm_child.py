"""What a command forked by warm.py does in its own process: become `python SCRIPT|-m MODULE|-c CODE ...` as an
interpreter would have started it (warm.py's docstring says what that sets right), run it, and end as an interpreter
ends. Standard library only at import: the forkserver imports this module beside the training stack.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing.connection
import os
import runpy
import signal
import sys
import time


def run_forked(form: list[str], unbuffered: bool, cwd: str, env: dict[str, str], path: list[str],
               out: multiprocessing.connection.Connection | None, err: multiprocessing.connection.Connection | None,
               new_session: bool, group: int | None, executable: str) -> None:  # fmt: skip
    """In the forked process: become `python <form>` started in `cwd` with `env`, then run it. `group`: the process
    group to join (0: a new one this process leads). `executable`: sys.executable, the relay's `python` (what the
    command starts with it starts warm too)."""
    if new_session:
        os.setsid()
    if group is not None:
        _join_group(group)
    _fresh_signal_handlers()
    for connection, fd in ((out, 1), (err, 2)):
        if connection is not None:
            os.dup2(connection.fileno(), fd)
    for connection in {id(c): c for c in (out, err) if c is not None}.values():
        connection.close()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.executable = executable
    _fresh_standard_streams(unbuffered or bool(env.get("PYTHONUNBUFFERED")))
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0))))
    first = {"-m": os.getcwd(), "-c": ""}.get(form[0], os.path.dirname(os.path.abspath(form[0])))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *path]
    code: object = 0
    try:
        if form[0] == "-m":
            sys.argv = ["-m", *form[2:]]
            runpy.run_module(form[1], run_name="__main__", alter_sys=True)
        elif form[0] == "-c":
            sys.argv = ["-c", *form[2:]]
            exec(compile(form[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = list(form)
            runpy.run_path(form[0], run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
    except KeyboardInterrupt:  # as an interpreter does: the traceback, then ended by SIGINT itself
        _print_exception()
        _at_exit()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        _print_exception()
        code = 1
    _at_exit()
    raise SystemExit(code)


def _join_group(group: int) -> None:
    """setpgid, once the leader (forked just before) has made its group: it may not have run yet."""
    deadline = time.monotonic() + 30
    while True:
        try:
            os.setpgid(0, group)
            return
        except PermissionError:  # no such group in this session yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _fresh_signal_handlers() -> None:
    """An interpreter's at its start: the forkserver's were inherited from the pytest worker when it started, and a
    test may have been ignoring SIGINT then (a command that ignores Ctrl-C never ends in the interrupt tests)."""
    for number in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # Python ignores these two at its start
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _fresh_standard_streams(unbuffered: bool) -> None:
    """sys.stdout and sys.stderr as an interpreter makes them for the new fds 1 and 2 (the forkserver's were made
    for its own, under its own flags: pytest-xdist's workers run -u): block-buffered on a pipe or file,
    line-buffered on a terminal; stderr line-buffered; -u: neither."""
    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        old = getattr(sys, name)
        old.flush()
        binary = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115 (the stream lives on)
        line_buffering = not unbuffered and (fd == 2 or os.isatty(fd))
        stream = io.TextIOWrapper(binary, encoding=old.encoding, errors=errors, line_buffering=line_buffering,
                                  write_through=unbuffered)  # fmt: skip
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _print_exception() -> None:
    """The traceback an interpreter prints: from the command's first frame (not this file's, nor runpy's)."""
    kind, error, frames = sys.exc_info()
    while frames is not None and frames.tb_frame.f_code.co_filename in (
        __file__,
        runpy.__file__,
        "<frozen runpy>",
    ):
        frames = frames.tb_next
    sys.excepthook(kind, error.with_traceback(frames), frames)


def _at_exit() -> None:
    """What an interpreter does at its end (multiprocessing's child ends with os._exit, which does none of it)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
