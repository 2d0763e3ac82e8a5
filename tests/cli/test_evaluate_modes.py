"""`python -m diffusion.evaluate` has two modes, sample quality (--samples, --reference: FID, KID, IS) and --nll
(the bits/dim of a checkpoint), with options of their own. Round 11a's U4: an option of the other mode was "not an
option of this command" (it is one: of the other mode), the mode never named, and `--nll false` was itself "not
an option". U5: the failed Inception download's fix named the Python API's arguments on the command line."""

import importlib.util
import re

import pytest
from helpers.user_errors import run_in_process

from diffusion.cli import evaluate


def quality(user) -> list[str]:
    samples = str(user / "samples" / "samples.npz")
    return ["--samples", samples, "--reference", samples, "--features", "pixels", "--device", "cpu"]


def nll(user) -> list[str]:
    return ["--nll", "--ckpt", str(user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt")]


OF_NLL = (
    r"is an option of --nll \(bits/dim of a checkpoint\), and this is a sample-quality run — add --nll, or "
)
OF_QUALITY = r"is an option of sample quality \(FID, KID, IS\), not of --nll \(bits/dim\) — drop "


@pytest.mark.parametrize(
    ("mode", "flags", "expected"),
    [
        ("quality", ["--ckpt", "x.ckpt"], rf"^error: --ckpt {OF_NLL}drop --ckpt$"),
        ("quality", ["--split", "val"], rf"^error: --split {OF_NLL}drop --split$"),
        ("quality", ["--data.path", "x.npz"], rf"^error: --data.path {OF_NLL}drop --data.path$"),
        ("nll", ["--samples", "s.npz"], rf"^error: --samples {OF_QUALITY}--nll, or drop --samples$"),
        ("nll", ["--data_root", "data"], rf"^error: --data_root {OF_QUALITY}--nll, or drop --data_root$"),
        # the switch's bad value chose no mode: said first (it was "--samples is not an option of this command")
        ("quality", ["--nll", "maybe"], r"^error: --nll maybe is not a valid bool — pass true or false$"),
        ("nll", ["--nll", "maybe"], r"^error: --nll maybe is not a valid bool — pass true or false$"),
    ],
)
def test_an_option_of_the_other_mode_names_its_mode(mode, flags, expected, user, capsys):
    args = [*(quality(user) if mode == "quality" else nll(user)), *flags]
    line = run_in_process(evaluate.main, args, user, capsys)
    assert re.search(expected, line), line


def test_a_config_files_option_of_the_other_mode_is_said_as_its_key(user, tmp_path, capsys):
    ckpt = nll(user)[-1]
    (tmp_path / "n41.yaml").write_text(f"nll: true\nckpt: {ckpt}\nnum_images: 4\nreference: digits\n")
    line = run_in_process(evaluate.main, ["--config", str(tmp_path / "n41.yaml")], user, capsys)
    file = re.escape(str(tmp_path / "n41.yaml"))
    assert re.search(
        rf"^error: {file}: reference {OF_QUALITY}nll from {file}, or drop reference from {file}$", line
    )
    (tmp_path / "q.yaml").write_text(f"ckpt: {ckpt}\n")
    line = run_in_process(evaluate.main, [*quality(user), "--config", str(tmp_path / "q.yaml")], user, capsys)
    assert re.search(rf"^error: {re.escape(str(tmp_path / 'q.yaml'))}: ckpt {OF_NLL}drop ckpt from ", line), (
        line
    )


def test_nll_false_is_the_sample_quality_mode(user, tmp_path, capsys):
    assert "fid" in evaluate.main([*quality(user), "--nll", "false"])
    (tmp_path / "off.yaml").write_text("nll: false\n")
    assert "fid" in evaluate.main([*quality(user), "--config", str(tmp_path / "off.yaml")])


@pytest.mark.skipif(importlib.util.find_spec("torch_fidelity") is None, reason="the fid extra")
def test_a_failed_inception_download_names_the_flags(user, capsys, monkeypatch):
    import torch_fidelity.feature_extractor_inceptionv3 as fidelity

    def offline(*args, **kwargs):
        raise OSError("<urlopen error [Errno -2] Name or service not known>")

    monkeypatch.setattr(fidelity, "load_state_dict_from_url", offline)
    args = [*quality(user)[:4], "--features", "inception", "--metrics", "fid", "--device", "cpu"]
    line = run_in_process(evaluate.main, args, user, capsys)
    assert line.endswith(
        "downloaded from GitHub on first use — offline, pass --inception_weights PATH (a local copy), or "
        "--features pixels"
    ), line
