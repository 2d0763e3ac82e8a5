"""What every command's user errors share: the real commands, in processes of their own, print one line and no
traceback and change none of the user's files; without the default recipe train.py stops in one line, never
training the code's defaults; `DIFFUSION_DEBUG=1` / `--debug` bring the traceback back, and a bug keeps its own.
train.py's cases are in tests/cli/test_train_errors.py (the contract), the sample and evaluate CLIs' in
tests/cli/test_sample_evaluate_errors.py.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import warm
from helpers.user_errors import REPO, error_line, snapshot
from torch import nn

from diffusion.cli import sample
from diffusion.cli.reporting import one_line, reporting_user_errors
from diffusion.errors import UserError, WeightsDoNotFit, check_weights_fit


def test_debug_lets_the_exception_through(user, monkeypatch):
    args = ["--ckpt", str(user / "truncated.ckpt"), "--out", str(user / "new")]
    with pytest.raises(UserError, match="truncated"):
        sample.main([*args, "--debug"])
    monkeypatch.setenv("DIFFUSION_DEBUG", "1")
    with pytest.raises(UserError, match="truncated"):
        sample.main(args)


def test_a_bug_keeps_its_traceback_and_messages_become_one_line():
    with pytest.raises(TypeError), reporting_user_errors([]):
        raise TypeError("a bug in the code, not in the input")
    # Weights that do not fit a network are said from their keys, checked before torch's load_state_dict.
    layer = nn.Linear(2, 2)
    with pytest.raises(WeightsDoNotFit) as error:
        check_weights_fit(
            layer, {"weight": torch.zeros(3, 2), "extra": torch.zeros(1)}, "w.pt", "use its own"
        )
    assert one_line(error.value) == (
        "w.pt: these weights do not fit Linear (1 missing keys (e.g. bias), 1 unexpected keys (e.g. extra), "
        "1 of another shape (e.g. weight)) — use its own"
    )
    check_weights_fit(layer, layer.state_dict(), "w.pt", "use its own")  # weights that fit pass
    # torch's own report is no user error: nothing reads its words any more.
    with pytest.raises(RuntimeError), reporting_user_errors([]):
        layer.load_state_dict({"weight": torch.zeros(3, 2)})


def run_command(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return warm.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )  # fmt: skip


def test_real_commands_print_one_line_and_no_traceback(user, tmp_path):
    before = snapshot(user)
    result = run_command(["-m", "diffusion.sample", "--ckpt", str(user / "random.ckpt")], tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert re.search(r"^error: --ckpt .*random.ckpt is truncated", error_line(result.stderr))
    result = run_command([str(REPO / "train.py"), "--accumulate_grad_batches", "0"], tmp_path)
    assert result.returncode == 2 and "accumulate_grad_batches 0" in error_line(result.stderr)
    assert list(tmp_path.iterdir()) == [] and snapshot(user) == before  # no runs/, no samples/
    debug = run_command(
        ["-m", "diffusion.sample", "--ckpt", str(user / "random.ckpt")], tmp_path, DIFFUSION_DEBUG="1"
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "UnreadableCheckpoint" in debug.stderr


def test_without_the_default_recipe_no_arguments_stop_with_one_line(tmp_path):
    # The package installed without the project's configs/ folder: never train the code defaults instead.
    shutil.copytree(
        REPO / "diffusion", tmp_path / "site" / "diffusion", ignore=shutil.ignore_patterns("__pycache__")
    )
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", "from diffusion.cli.train import main; main()"], cwd=work, capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )  # fmt: skip
    assert result.returncode == 2
    assert re.search(
        r"default recipe .*configs/digits.yaml is missing.* — pass --config", error_line(result.stderr)
    )
    assert list(work.iterdir()) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_config_printed_where_there_is_no_room_is_one_line(tmp_path):
    """`--print_config > /dev/full` (a full disk under the output): jsonargparse's write failed with a traceback."""
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "diffusion.prepare", "--out", str(tmp_path / "set"), "--print_config"],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=300, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr) == (
        "error: --print_config: the config could not be written to the standard output (No space left on device) "
        "— write it where there is room: redirect the output to a file on another disk"
    )
    assert not (tmp_path / "set").exists()
