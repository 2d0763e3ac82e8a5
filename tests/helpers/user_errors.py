"""What the user-error tests share: a user's folder of files to keep (the `user` fixture is in conftest.py), and
running a command that must fail with one line and leave that folder unchanged."""

from pathlib import Path

import pytest
import yaml

from diffusion.cli.parse_errors import flags_written
from helpers import QUICK, TINY_MLP, TINY_UNET

REPO = Path(__file__).parents[2]
CONFIGS = REPO / "configs"


def error_line(stderr: str) -> str:
    """The one `error:` line of a command's stderr, checked: the only one, the last line, no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr[-3000:]
    return errors[0]


def snapshot(folder: Path) -> dict[str, tuple[int, int] | str]:
    """Every file (its size and modification time) and folder under `folder`: what the user had. Any write to a
    file changes its mtime (nanoseconds, set by the kernel at the write) from the one it was made with, seconds
    earlier; hashing the user's checkpoints twice a test took longer than most of these tests."""
    return {
        str(path.relative_to(folder)): (stat.st_size, stat.st_mtime_ns) if path.is_file() else "/"
        for path in sorted(folder.rglob("*"))
        for stat in [path.stat()]
    }


def fill(flags: list[str], user: Path) -> list[str]:
    return [flag.format(user=user, configs=CONFIGS) for flag in flags]


def in_a_config_file(flags: list[str], folder: Path, name: str = "run.yaml") -> list[str]:
    """`--config FILE` for a file in `folder` that sets what `flags` set (each value read as YAML, as the parser
    reads a flag's)."""
    options = {}
    for key, values in flags_written(flags):
        options[key] = yaml.safe_load(values[0]) if len(values) == 1 else [yaml.safe_load(v) for v in values]
    (folder / name).write_text(yaml.safe_dump(options))
    return ["--config", str(folder / name)]


def train_args(flags: list[str], user: Path, save_dir: Path) -> list[str]:
    """The tiny quick run with `flags`; a --config first, since a config file overrides the flags before it."""
    flags = fill(flags, user)
    config = flags[:2] if flags[:1] == ["--config"] else []
    network = TINY_MLP if "toy2d" in "".join(config) else TINY_UNET
    save = ["--trainer.logger.init_args.save_dir", str(save_dir)]
    return [*config, *network, *QUICK, *save, *flags[len(config) :]]


def run_in_process(command, args: list[str], user: Path, capsys) -> str:
    """Run a command's main, check exit status 2, the one line and that the user's files are unchanged."""
    before = snapshot(user)
    with pytest.raises(SystemExit) as exit_info:
        command(args)
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert snapshot(user) == before
    return line


def refused_line(capsys, command, argv: list[str]) -> str:
    """A command's main refusing `argv`: exit status 2, and its one line (what stderr held before is dropped)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        command(argv)
    assert exit_info.value.code == 2
    return error_line(capsys.readouterr().err)
