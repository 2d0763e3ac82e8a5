"""A model's file edited by hand is refused in one line naming the file and the key, by the sample command as by
load_checkpoint: an export's config.json settings no model has (num_timesteps 'abc', a scale of 0, ...), a
checkpoint's normalization of scale 0, and an export's `betas` other than its `hyper_parameters`' schedule (the one
this package samples with; the edit was ignored). Exports of earlier versions (float32 betas, or none) load as
before."""

import json
import re
from pathlib import Path

import pytest
import torch
from helpers.user_errors import run_in_process

from diffusion.cli import export, sample
from diffusion.errors import InvalidValue, UserError
from diffusion.models import UNet
from diffusion.training.exported import CONFIG, write_export
from diffusion.training.loading import load_checkpoint
from diffusion.training.module import DiffusionModule


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


GOOD_SAMPLE = ["--sampler", "ddim", "--steps", "2", "--num_samples", "2"]


def _tiny_export(folder: Path, change) -> Path:
    """An export of a tiny image model (random weights) whose config.json's hyper_parameters `change` edits."""
    init_args = {"in_channels": 1, "channels": 8, "channel_mult": [1, 2], "num_res_blocks": 1}
    torch.manual_seed(0)
    module = DiffusionModule(
        UNet(**init_args), sample_shape=(1, 8, 8), normalization={"shift": [0.5], "scale": [0.5]},
        beta_schedule="cosine", num_timesteps=10,
    )  # fmt: skip
    folder.mkdir()
    write_export(module, {"class_path": "diffusion.models.UNet", "init_args": init_args}, folder, "ema")
    config = json.loads((folder / CONFIG).read_text())
    change(config["hyper_parameters"])
    (folder / CONFIG).write_text(json.dumps(config))
    return folder


EDITED_EXPORTS = {  # an export's config.json edited by hand: what the sample command says of it
    # int() of it ended in a ValueError traceback, while load_checkpoint refused the same file
    "num_timesteps_text": (
        lambda h: h.update(num_timesteps="abc"),
        r"config.json: num_timesteps='abc' is a str, not a whole number >= 2 — correct it in config.json's "
        r"hyper_parameters, or export the checkpoint again \(python -m diffusion.export\)$",
    ),
    "num_timesteps_null": (lambda h: h.update(num_timesteps=None), r"config.json: num_timesteps=None is a"),
    # a scale of 0 wrote samples of one colour, NaN ones NaN, exit status 0
    "scale_0": (
        lambda h: h["normalization"].update(scale=[0.0]),
        r"config.json: normalization\['scale'\]\[0\]=0.0 must be a finite number other than 0 — correct it",
    ),
    "shift_nan": (
        lambda h: h["normalization"].update(shift=[float("nan")]),
        r"config.json: normalization\['shift'\]\[0\]=nan must be a finite number — correct it",
    ),
    # a comparison of a str with an int in class_labels, a traceback
    "num_classes_text": (
        lambda h: h["network"]["init_args"].update(num_classes="abc"),
        r"config.json: network.init_args.num_classes='abc' is a str, not a whole number >= 1 — correct it",
    ),
    # a KeyError or an AttributeError traceback
    "no_network": (
        lambda h: h.pop("network"),
        r"config.json: hyper_parameters has no network \(every export writes network, sample_shape, .*\) — put it "
        r"back",
    ),
    # a misspelled sampling option: said as the dict's key, but without the file (round 11's V3 fix)
    "sampling_key_misspelled": (
        lambda h: h.update(sampling={"sampler": "ddim", "step": 2}),
        r"config.json: sampling has no option 'step' \(SamplingOptions has .*\) — correct it in config.json",
    ),
    "sample_shape_text": (
        lambda h: h.update(sample_shape=[1, "a", 8]),
        r"config.json: sample_shape\[1\]='a' is a str, not a whole number >= 1 — correct it",
    ),
}


@pytest.mark.parametrize(("change", "expected"), EDITED_EXPORTS.values(), ids=EDITED_EXPORTS.keys())
def test_sample_refuses_an_edited_export_in_one_line_naming_its_file(change, expected, tmp_path, capsys):
    folder = _tiny_export(tmp_path / "export", change)
    args = ["--ckpt", str(folder), "--out", str(tmp_path / "out"), *GOOD_SAMPLE, "--device", "cpu"]
    line = run_in_process(sample.main, args, tmp_path, capsys)
    assert re.search(rf"^error: \S*export/{expected}", line), line
    with pytest.raises(UserError, match=expected):
        load_checkpoint(folder)  # the loader's check, the same line


def test_sample_refuses_a_checkpoint_whose_normalization_has_a_scale_of_0(
    user, tmp_path, capsys, monkeypatch
):
    """A checkpoint's normalization with a scale of 0 wrote samples of one colour, exit status 0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(good, weights_only=False)
    checkpoint["hyper_parameters"]["normalization"] = {"shift": [0.5], "scale": [0.0]}
    torch.save(checkpoint, tmp_path / "edited.ckpt")
    args = ["--ckpt", str(tmp_path / "edited.ckpt"), "--out", str(tmp_path / "out"), *GOOD_SAMPLE]
    line = run_in_process(sample.main, args, tmp_path, capsys)
    expected = r"edited.ckpt: normalization\['scale'\]\[0\]=0.0 must be a finite number other than 0 — use"
    assert re.search(rf"^error: \S*{expected}", line), line
    with pytest.raises(UserError, match=expected):
        load_checkpoint(tmp_path / "edited.ckpt")
