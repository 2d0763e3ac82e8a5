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


@pytest.mark.parametrize(
    "file, refused",
    [
        ("data:\n  init_args:\n    batch_size: 0\n", "data.batch_size 0 is out of range (must be >= 1)"),
        ("data:\n  batch_size: 0\n", "data.batch_size 0 is out of range (must be >= 1)"),  # no init_args
        ("trainer:\n  accumulate_grad_batches: 0\n", "trainer.accumulate_grad_batches 0 is out of range"),
        (
            "model:\n  network:\n    init_args:\n      in_channels: 5\n",
            "model.network.in_channels 5: the data sets it",
        ),
    ],
    ids=["class_range", "class_range_without_init_args", "trainer_range", "set_by_the_data"],
)
def test_a_check_after_the_parse_names_the_config_file_that_set_the_value(
    file, refused, tmp_path, monkeypatch, capsys
):
    """The checks made once the command line has parsed (a class's range, the Trainer's, the settings the data
    decides) say a value a config file gave as that file's key, as the parse's own refusals do; a flag given after
    the file wins, and is named."""
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(file)
    assert train_line(["--config", "run.yaml"], capsys).startswith(f"run.yaml: {refused}")
    key, value = refused.split(" ")[:2]
    flag_after = ["--config", "run.yaml", f"--{key}", value.removesuffix(":")]
    assert train_line(flag_after, capsys).startswith(f"--{refused}")
