"""An export's config.json `betas` must be the betas of its `hyper_parameters`' schedule (the one this package
samples with): a hand edit of one but not the other is refused, naming the file and the key, where it loaded and
sampled with the edit ignored. Exports of earlier versions (float32 betas, or none) load as before."""

import json

import pytest
import torch
from helpers.user_errors import run_in_process

from diffusion.cli import export, sample
from diffusion.errors import InvalidValue
from diffusion.training.loading import load_checkpoint


@pytest.fixture(scope="module")
def exported(digits_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "export"
    export.main(["--ckpt", str(digits_checkpoint), "--format", "safetensors", "--out", str(out)])
    return out


def edited(exported, tmp_path, betas) -> tuple:
    folder = tmp_path / "edited"
    folder.mkdir()
    for path in exported.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    config = json.loads((exported / "config.json").read_text())
    if betas is None:
        del config["betas"]
    else:
        config["betas"] = betas(config["betas"])
    (folder / "config.json").write_text(json.dumps(config))
    return folder, config


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda betas: [0.5] * len(betas), "config.json: betas[0] is 0.5, but the schedule of its hyper_parameters has"),
        (lambda betas: betas[:-1], "config.json: betas holds 999 values, but the schedule of its hyper_parameters has 1000"),
        (lambda betas: "linear", "config.json: betas is 'linear', not a list of numbers"),
    ],
    ids=["values", "length", "not_a_list"],
)  # fmt: skip
def test_betas_that_disagree_with_the_schedule_are_refused_naming_the_file_and_key(
    edit, expected, exported, tmp_path, capsys
):
    folder, _ = edited(exported, tmp_path, edit)
    with pytest.raises(InvalidValue, match="export the checkpoint again") as refused:
        load_checkpoint(folder)
    assert f"{folder / 'config.json'}: " in str(refused.value) and expected in str(refused.value)
    out = tmp_path / "samples"
    args = [
        "--ckpt",
        str(folder),
        "--num_samples",
        "2",
        "--steps",
        "2",
        "--sampler",
        "ddim",
        "--out",
        str(out),
    ]
    line = run_in_process(sample.main, args, tmp_path, capsys)
    assert line.startswith(f"error: {folder / 'config.json'}: ") and expected in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    "edit",
    [lambda betas: torch.tensor(betas, dtype=torch.float32).double().tolist(), None],
    ids=["float32_betas", "no_betas"],
)
def test_exports_of_earlier_versions_load_as_before(edit, exported, tmp_path):
    """Before 3967c58 an export wrote its buffers' float32 betas; an export without betas has nothing to check."""
    folder, _ = edited(exported, tmp_path, edit)
    assert torch.equal(load_checkpoint(folder).schedule.betas, load_checkpoint(exported).schedule.betas)
