"""A resume keeps a run's post-hoc EMA profiles, also from a checkpoint copied out of its run folder (no config.yaml
beside it to compare with: the checkpoint's own EMA state says it was trained with them); a resume that would drop
or change them is refused in one line naming the flags that resume it, one with the same profiles goes on with
them. A `python -m diffusion.phema` output (a reconstruction as its EMA weights) is no training state to resume.

One tiny post-hoc run (4 steps, snapshots at 2 and 4) is made once and its checkpoint copied into each test."""

import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import QUICK, TINY_UNET, tiny_run
from helpers.user_errors import error_line, snapshot

from diffusion.cli import phema
from diffusion.cli.resumed_state import post_hoc_state
from diffusion.cli.train import main

POST_HOC = ["--ema.post_hoc", "true", "--ema.snapshot_every", "2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    save_dir = tmp_path_factory.mktemp("runs")
    tiny_run(save_dir, *POST_HOC)
    return save_dir / "digits" / "version_0"


@pytest.fixture
def copy(run, tmp_path) -> Path:
    """The run's last.ckpt copied out of its run folder: no config.yaml beside it."""
    (tmp_path / "x").mkdir()
    return Path(shutil.copy(run / "checkpoints" / "last.ckpt", tmp_path / "x" / "copy.ckpt"))


def resume(ckpt: Path, save_dir: Path, *extra: str):
    return main([
        *TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", str(save_dir), "--ckpt_path", str(ckpt),
        "--max_steps", "6", *extra,
    ])  # fmt: skip


def refused(ckpt: Path, tmp_path: Path, capsys, *extra: str) -> str:
    """The resume's one error line, exit status 2, the checkpoint's folder unchanged and no run started."""
    before = snapshot(ckpt.parent)
    with pytest.raises(SystemExit) as exit_info:
        resume(ckpt, tmp_path / "new", *extra)
    assert exit_info.value.code == 2
    assert snapshot(ckpt.parent) == before and not (tmp_path / "new").exists()
    return error_line(capsys.readouterr().err)


def test_a_copy_resumed_without_post_hoc_ema_is_refused_naming_the_flag(copy, tmp_path, capsys):
    line = refused(copy, tmp_path, capsys)
    assert line == (
        f"error: --ckpt_path {copy} belongs to a run trained with other settings: --ema.post_hoc True there, "
        "False here: this run would drop the post-hoc EMA profiles it holds — resume it with its "
        f"post-hoc EMA: --ema.post_hoc true, or start a new run from its weights: --model.init_from {copy} "
        "(without --ckpt_path)"
    )


def test_a_copy_resumed_with_other_profiles_is_refused_naming_its_own(copy, tmp_path, capsys):
    line = refused(copy, tmp_path, capsys, *POST_HOC, "--ema.sigma_rels", "[0.1]")
    assert re.search(
        r"--ema.sigma_rels \[0.05, 0.1\] there, \[0.1\] here: the post-hoc EMA profiles it holds are not these "
        r"— resume it with its post-hoc EMA: "
        r"--ema.post_hoc true --ema.sigma_rels \[0.05,0.1\], or ",
        line,
    ), line


def test_a_copy_resumed_with_its_post_hoc_ema_goes_on_with_its_profiles(copy, tmp_path):
    cli = resume(copy, tmp_path / "new", *POST_HOC)
    assert cli.trainer.global_step == 6
    last = torch.load(Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    state = post_hoc_state(last)
    assert state is not None and state["step"] == 6 and state["sigma_rels"] == [0.05, 0.1]


def test_in_its_run_folder_the_runs_config_names_the_difference(run, tmp_path, capsys):
    """The checkpoint's own state is read where no config.yaml records the post-hoc settings; in its folder the
    comparison with the run's config.yaml names every setting that differs, as before."""
    folder = tmp_path / "runs"
    shutil.copytree(run.parents[1], folder)
    ckpt = folder / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    line = refused(ckpt, tmp_path, capsys, "--model.lr", "0.01")
    assert re.match(
        rf"error: --ckpt_path {re.escape(str(ckpt))} belongs to a run trained with other settings: "
        r"--ema.post_hoc True there, False here; --model.lr \S+ there, 0.01 here — resume it with its own config: "
        r"--config ",
        line,
    ), line


def test_a_phema_output_is_refused_as_no_training_state(run, tmp_path, capsys):
    out = tmp_path / "x" / "phema.ckpt"
    out.parent.mkdir()
    phema.main(["--run", str(run), "--sigma_rel", "0.1", "--out", str(out)])
    capsys.readouterr()
    for extra in ([], POST_HOC):  # whatever the post-hoc settings
        line = refused(out, tmp_path, capsys, *extra)
        assert line == (
            f"error: --ckpt_path {out} is a post-hoc EMA reconstruction (python -m diffusion.phema, sigma_rel 0.1 "
            "at step 4), not a training state: its EMA weights are the reconstruction's, and a resumed run's EMA "
            f"would go on from them — resume the run's own checkpoint (in {run / 'checkpoints'}), or start a new "
            f"run from the reconstructed weights: --model.init_from {out} (without --ckpt_path)"
        )
    # the way it names: a new run from the reconstructed weights
    cli = main([*TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", str(tmp_path / "new"),
                "--model.init_from", str(out)])  # fmt: skip
    assert cli.trainer.global_step == 4
