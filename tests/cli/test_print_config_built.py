from pathlib import Path

import pytest
from test_parse_errors_of_train import train_line


@pytest.mark.parametrize(
    "flags",
    [
        ["--data.image_size", "9"],  # against the network: checked once both are built
        ["--ckpt_path", "missing.ckpt"],  # the checkpoint to resume
        ["--checkpoint.dirpath", "a_file/ckpts"],  # an output folder under a file
    ],
    ids=["image_size", "resume", "output_folder"],
)
def test_print_config_refuses_what_the_built_run_would_refuse(flags, tmp_path, monkeypatch, capsys):
    """Checks made once the classes are built run under --print_config too: no config printed for a run that
    would stop, and the same line."""
    monkeypatch.chdir(tmp_path)
    Path("a_file").write_text("")
    refused = train_line(flags, capsys)
    assert train_line(["--print_config", *flags], capsys) == refused
