"""Running the commands the README and the guides print, for tests/test_documented_commands.py: how an entry of
its COMMANDS says a command runs (`Command`, `Output`), and `Runs`, which runs each once a session, in a folder of
its own, after the runs that write its inputs: in the test's process (its `main(argv)`), or, for the multi-device
ones, beside each other in processes of their own (Lightning's launcher; the two ranks of one torchrun job,
`documented_commands.py`)."""

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import sys
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins.environments.lightning import find_free_network_port

from helpers.ddp import run_in_session
from helpers.documented_checks import Ran

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


@dataclass(frozen=True)
class Output:
    """What the documented command `text` wrote at `path` (default: the path it is staged at) in its folder."""

    text: str
    path: str | None = None


@dataclass(frozen=True)
class Command:
    """How a printed command runs here.

    check: what the run must have written or returned, besides exit status 0.
    append: the flags after the printed ones (shorter, smaller; where `why` says so, the stand-in's).
    inputs: a path in the working folder -> the Output of the documented command that writes it (run first), or
        a maker of tests/helpers/documented_commands.py (a user's own file).
    placeholders: a printed word -> the path it stands for.
    launch: "in_process" (the command's main), "ranks" (both ranks of the torchrun job) or "lightning" (`python
        train.py` in a process of its own, which starts its second rank).
    env: for "ranks": the environment over torchrun's.
    context: what an in-process command runs inside (a stand-in).
    why: empty when only `append` shortens the command; else why it cannot run here as printed, and what stands in.
    """

    check: Callable[[Ran], None]
    append: tuple[str, ...] = ()
    inputs: dict[str, Output | Callable[[Path], None]] = field(default_factory=dict)
    placeholders: dict[str, str] = field(default_factory=dict)
    launch: str = "in_process"
    env: dict[str, str] = field(default_factory=dict)
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    why: str = ""


def command(check: Callable[[Ran], None], *append: str, **how: object) -> Command:
    return Command(check, append, **how)


LAUNCHES = {
    "in_process": "its main(argv), in the test's process",
    "lightning": "a process of its own, which starts its second rank",
    "ranks": "both ranks of a `torchrun --nproc_per_node 2` job (tests/helpers/documented_commands.py)",
}


def process_env() -> dict[str, str]:
    """A launch's environment: tests/ and the repository (its benchmarks package: SyntheticCIFAR10's class path)
    importable, one thread a process, none of the DDP settings a test in this process may have left."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE", "RANK")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), str(REPO), env.get("PYTHONPATH")]))
    return {**env, "OMP_NUM_THREADS": "1"}


def run_process(cmd: list[str], cwd: Path, timeout: float = 420) -> tuple[int | None, str]:
    """Run `cmd` in a session of its own; its exit status (None: killed after `timeout`) and output. Forked warm
    (helpers/warm.py), with what it starts (the rank Lightning's launcher starts, torchrun's workers): these tests
    are about what the printed commands do; tests/cli/test_launchers.py starts the launchers cold."""
    return run_in_session(cmd, cwd, process_env(), timeout, warm=True)


def section(output: str, text: str) -> str:
    """What the ranks of the torchrun job printed while they ran `text` (the worker heads each command's output)."""
    parts = [part.removeprefix(text) for part in output.split("==== ") if part.startswith(text)]
    return "".join(parts) or output


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One CPU thread, as under pytest-xdist (conftest) and in the processes the tests start: a tiny model's ops
    are too small for two, and with another process on the other core two OpenMP threads stall each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class Runs:
    """Each documented command run once a session, in a folder of its own, after the runs that write its inputs.

    commands: the entries, by the text as printed; printed: that text -> its argv as printed; mains: a program
    (`train.py`, `diffusion.sample`, ...) -> its `main(argv)`."""

    def __init__(
        self, tmp_path_factory: pytest.TempPathFactory, commands: dict[str, Command],
        printed: dict[str, list[str]], mains: dict[str, Callable],
    ) -> None:  # fmt: skip
        self.factory = tmp_path_factory
        self.commands, self.printed, self.mains = commands, printed, mains
        self.ran: dict[str, Ran] = {}
        self.made: dict[str, Path] = {}

    def argv(self, text: str) -> tuple[str, list[str]]:
        """The program and the argv a command runs with: the printed words, placeholders replaced, then `append`."""
        entry = self.commands[text]
        program, *args = self.printed[text]
        return program, [entry.placeholders.get(word, word) for word in args] + list(entry.append)

    def how(self, text: str) -> str:
        """How a command ran, for its test's report."""
        entry, (program, args) = self.commands[text], self.argv(text)
        shown = "python train.py" if program == "train.py" else f"python -m {program}"
        lines = [
            f"printed: {text}",
            f"ran as:  {shown} {shlex.join(args)}",
            f"         ({LAUNCHES[entry.launch]})",
        ]
        lines += [f"         {word} stands for {path}" for word, path in entry.placeholders.items()]
        return "\n".join([*lines, f"why:     {entry.why}"] if entry.why else lines)

    def __call__(self, text: str) -> Ran:
        if text not in self.printed:  # the entry of a command no document prints any more
            return Ran(None, None, error=f"no document prints `{text}` (its entry is stale)")
        if text not in self.ran:
            if self.commands[text].launch == "in_process":
                self.ran[text] = self.in_process(text)
            else:
                self.in_processes()
        return self.ran[text]

    def folder(self, text: str) -> Path:
        """A new working folder for `text`, the project's configs/ and the command's inputs in place."""
        folder = self.factory.mktemp(re.sub(r"\W+", "_", text)[:40])
        (folder / "configs").symlink_to(REPO / "configs")
        for path, source in self.commands[text].inputs.items():
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(source, Output):
                ran = self(source.text)
                if ran.code != 0:
                    raise RuntimeError(f"its input {path} comes from `{source.text}`, which failed")
                written = ran.folder / (source.path or path)
                (shutil.copytree if written.is_dir() else shutil.copy2)(written, target)
            else:  # a user's own file, made once a session
                if source.__name__ not in self.made:
                    self.made[source.__name__] = self.factory.mktemp("made") / Path(path).name
                    source(self.made[source.__name__])
                target.symlink_to(self.made[source.__name__])
        return folder

    def in_process(self, text: str) -> Ran:
        try:
            folder = self.folder(text)
        except RuntimeError as error:
            return Ran(None, None, error=str(error))
        program, args = self.argv(text)
        output = io.StringIO()
        with (
            contextlib.chdir(folder),
            contextlib.redirect_stdout(output),
            contextlib.redirect_stderr(output),
            one_thread(),
            self.commands[text].context(),
        ):
            try:
                return Ran(folder, 0, self.mains[program](args), output.getvalue())
            except SystemExit as exit_info:
                return Ran(folder, exit_info.code or 0, None, output.getvalue())
            except Exception:
                return Ran(folder, None, None, output.getvalue(), traceback.format_exc())

    def in_processes(self) -> None:
        """Every multi-process command: the "ranks" ones in the torchrun job, each "lightning" one beside it."""
        runs: dict[str, list[str]] = {}  # commands that differ in their launcher's words alone: one run
        for text, entry in self.commands.items():
            if entry.launch != "in_process" and text in self.printed:
                key = json.dumps([entry.launch, self.argv(text), entry.env, sorted(entry.inputs)])
                runs.setdefault(key, []).append(text)
        folders = {}
        for key, same in runs.items():
            try:
                folders[key] = self.folder(same[0])
            except RuntimeError as error:
                self.ran.update({text: Ran(None, None, error=str(error)) for text in same})
        ranks = {
            key: folder for key, folder in folders.items() if self.commands[runs[key][0]].launch == "ranks"
        }
        with ThreadPoolExecutor(max_workers=2) as pool:
            job = pool.submit(self.torchrun_job, ranks, runs)
            own = {
                key: pool.submit(run_process, [sys.executable, str(REPO / "train.py"), *self.argv(runs[key][0])[1]], folder)
                for key, folder in folders.items()
                if key not in ranks
            }  # fmt: skip
            for key, future in own.items():
                code, output = future.result()
                self.ran.update({text: Ran(folders[key], code, None, output) for text in runs[key]})
            job.result()

    def torchrun_job(self, folders: dict[str, Path], runs: dict[str, list[str]]) -> None:
        """The "ranks" commands in turn on the two ranks of one `torchrun --nproc_per_node 2` job."""
        if not folders:
            return
        job = self.factory.mktemp("torchrun_job") / "job.json"
        commands = [
            {"text": runs[key][0], "program": self.argv(runs[key][0])[0], "argv": self.argv(runs[key][0])[1],
             "folder": str(folder), "port": find_free_network_port(), "env": self.commands[runs[key][0]].env}
            for key, folder in folders.items()
        ]  # fmt: skip
        job.write_text(json.dumps(commands))
        code, output = run_process(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
             "helpers.documented_commands", str(job)], job.parent,
        )  # fmt: skip
        results = [Path(f"{job}.rank{rank}.json") for rank in (0, 1)]
        results = [json.loads(path.read_text()) if path.is_file() else None for path in results]
        for index, (key, folder) in enumerate(folders.items()):
            if None in results:
                status, error = None, f"the torchrun job ended (status {code}) without its ranks' results"
            else:
                mine = [rank[index] for rank in results]
                status = next((one["code"] for one in mine if one["code"] != 0), 0)
                error = "\n".join(one.get("error", "") for one in mine)
            printed = section(output, runs[key][0])
            self.ran.update({text: Ran(folder, status, None, printed, error) for text in runs[key]})
