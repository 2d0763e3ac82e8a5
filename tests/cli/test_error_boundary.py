"""One error boundary: only the project's user-error types end a command in one line (exit status 2); anything
else is a bug, said so in one line and followed by its traceback (exit status 1), whatever its type. A ValueError
or OSError planted deep inside a real command stands for a bug in this project or a library below it."""

import json
import pickle
import sys

import pytest
import torch
from helpers import QUICK, TINY_UNET, warm
from helpers.troubleshooting import matches_a_row
from helpers.user_errors import REPO, error_line

from diffusion.cli.reporting import BUG, one_line, reporting_user_errors
from diffusion.data import ImageDataModule
from diffusion.errors import InvalidValue, OutOfRange, UserError

# A command run in a fresh interpreter with one function replaced by `raise <error>`: Python itself prints the
# traceback and sets the exit status, as for a user.
PLANTED = """
import json, sys
from diffusion.errors import UserError
target, name, error, command, argv = json.loads(sys.argv[1])
module = __import__(target, fromlist=[name])
def planted(*args, **kwargs):
    raise eval(error)
setattr(module, name, planted)
__import__(command, fromlist=["main"]).main(argv)
"""


def run_planted(target: str, name: str, error: str, command: str, argv: list[str], cwd):
    payload = json.dumps([target, name, error, command, argv])
    return warm.run(
        [sys.executable, "-c", PLANTED, payload], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def planted_in_the_loss(error: str, tmp_path):
    """train.py with `error` raised by the loss of every training step: deep inside Lightning's loop, nothing of
    the user's input."""
    return run_planted(
        "diffusion.training.module",
        "diffusion_loss",
        error,
        "diffusion.cli.train",
        train_argv(tmp_path),
        tmp_path,
    )


def train_argv(save_dir) -> list[str]:
    return [*TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", str(save_dir)]


def sample_argv(user, out) -> list[str]:
    ckpt = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    return ["--ckpt", str(ckpt), "--num_samples", "2", "--steps", "2", "--out", str(out)]


def says_it_is_a_bug(stderr: str, planted: str) -> bool:
    lines = stderr.splitlines()
    return (
        BUG in lines
        and "Traceback (most recent call last):" in lines[lines.index(BUG) + 1 :]
        and (lines[-1] == planted)
    )


@pytest.mark.parametrize(
    ("error", "planted"),
    [
        ('ValueError("planted: a mistake in the code")', "ValueError: planted: a mistake in the code"),
        ('OSError(5, "planted: Input/output error")', "OSError: [Errno 5] planted: Input/output error"),
    ],
)
def test_a_library_error_deep_in_training_is_a_bug_with_its_traceback(error, planted, tmp_path):
    result = planted_in_the_loss(error, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert says_it_is_a_bug(result.stderr, planted), result.stderr[-3000:]


def test_a_library_error_deep_in_sampling_is_a_bug_with_its_traceback(user, tmp_path):
    error, planted = (
        'OSError(5, "planted: Input/output error")',
        "OSError: [Errno 5] planted: Input/output error",
    )
    result = run_planted(
        "diffusion.cli.sample", "generate_in_chunks", error, "diffusion.cli.sample", sample_argv(user, tmp_path / "o"),
        tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert says_it_is_a_bug(result.stderr, planted), result.stderr[-3000:]


def test_a_user_error_from_the_same_place_is_still_one_line(user, tmp_path):
    error = 'UserError("planted: what the user gave is wrong", "give something else")'
    for command, target, name, argv in [
        ("diffusion.cli.train", "diffusion.training.module", "diffusion_loss", train_argv(tmp_path)),
        (
            "diffusion.cli.sample",
            "diffusion.cli.sample",
            "generate_in_chunks",
            sample_argv(user, tmp_path / "o"),
        ),
    ]:
        result = run_planted(target, name, error, command, argv, tmp_path)
        assert result.returncode == 2, result.stderr[-3000:]
        assert (
            error_line(result.stderr) == "error: planted: what the user gave is wrong — give something else"
        )
        assert BUG not in result.stderr


def test_lightning_refusing_the_trainers_settings_during_fit_is_the_users(tmp_path):
    error = '__import__("lightning.fabric.utilities.exceptions", fromlist=["x"]).MisconfigurationException("planted")'
    result = planted_in_the_loss(error, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert error_line(result.stderr).startswith(
        "error: the Trainer refused these settings: planted — change the"
    )


def test_in_process_a_bug_passes_through_after_the_line_and_a_user_error_is_one_line(capsys):
    with pytest.raises(KeyError), reporting_user_errors([]):
        raise KeyError("planted")
    assert capsys.readouterr().err.strip() == BUG
    with pytest.raises(SystemExit) as exit_info, reporting_user_errors([]):
        raise InvalidValue("planted; with a semicolon", "fix it")
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err.strip() == "error: planted; with a semicolon — fix it"
    )  # no words rewritten


def test_a_batch_that_does_not_fit_the_gpu_is_said_by_its_type(capsys):
    with pytest.raises(SystemExit) as exit_info, reporting_user_errors([]):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; ...)")
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("error: the GPU ran out of memory — use a smaller batch") and matches_a_row(line)
    assert matches_a_row(BUG)


def test_a_user_error_names_options_by_parameter_in_python_and_by_flag_in_a_command():
    error = OutOfRange("batch_size", 0, ">= 1", "pass {--batch_size} 1 or more", ImageDataModule)
    assert str(error) == "batch_size=0 must be >= 1 — pass batch_size 1 or more"
    assert one_line(error) == "batch_size=0 must be >= 1 — pass --data.batch_size 1 or more"
    # A DataLoader worker's error crosses to the main process pickled, as itself (diffusion.data.split.FailedItem).
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is OutOfRange and (again.owner, again.name, again.fix) == (
        error.owner,
        "batch_size",
        error.fix,
    )
    assert one_line(again) == one_line(error)
    assert one_line(UserError("a", "b")) == "a — b" and REPO.is_dir()
