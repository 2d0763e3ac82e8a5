"""A training that diverges (here: a learning rate of 1e4, which makes the toy MLP's loss NaN within a few steps)
stops with one line naming the step and the likely causes, exit status 2, at the first place that reads the loss
or the weights anyway: a logging step, a validation, a checkpoint save, a post-hoc EMA snapshot. No file holding
weights that are not finite is written, and the checkpoint of step 2 (finite) stays the run's last.ckpt."""

import re

import pytest
import torch
from helpers import QUICK, TINY_MLP, VALIDATING_EVERY_2
from helpers.user_errors import REPO, error_line

from diffusion.cli.train import main as train
from diffusion.training.loading import load_checkpoint

DIVERGING = [
    "--config", str(REPO / "configs" / "toy2d.yaml"), *TINY_MLP, *QUICK, *VALIDATING_EVERY_2, "--max_steps", "12",
    "--data.init_args.num_samples", "600", "--data.init_args.batch_size", "64",
    "--sample_grid.num_samples", "8", "--model.lr", "1e4",
]  # fmt: skip
CHECKED = {  # where the divergence is met: (flags, what the line says)
    "logging_step": (["--trainer.log_every_n_steps", "1"], r"the training loss of step (\d+) is nan, not finite"),
    "validation": (["--trainer.log_every_n_steps", "10"], r"at step (\d+), first network\..*before validation"),
    "checkpoint_save": (
        ["--trainer.log_every_n_steps", "10", "--trainer.val_check_interval", "100",
         "--checkpoint.every_n_train_steps", "2"],
        r"at step (\d+), first network\..*before a checkpoint save",
    ),
    "post_hoc_snapshot": (
        ["--trainer.log_every_n_steps", "10", "--trainer.val_check_interval", "100",
         "--checkpoint.every_n_train_steps", "2", "--ema.post_hoc", "true", "--ema.snapshot_every", "1"],
        r"at step (\d+), first network\..*before a post-hoc EMA snapshot",
    ),
}  # fmt: skip


def weights_finite(path) -> bool:
    contents = torch.load(path, map_location="cpu", weights_only=True)
    weights = contents.get("weights") or {**contents["state_dict"], **contents.get("current_model_state", {})}
    return all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())


@pytest.mark.parametrize(("flags", "expected"), CHECKED.values(), ids=CHECKED.keys())
def test_a_diverging_run_stops_in_one_line_and_keeps_its_last_finite_checkpoint(
    flags, expected, tmp_path, capsys
):
    with pytest.raises(SystemExit) as exit_info:
        train([*DIVERGING, "--trainer.logger.init_args.save_dir", str(tmp_path), *flags])
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    found = re.search(expected, line)
    assert found and line.startswith("error: training diverged"), line
    stopped_at = int(found[1])
    assert "lower --model.lr (now 10000)" in line and "check the data" in line
    run = tmp_path / "toy2d" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    assert f"its last checkpoint, {last}, holds finite weights and is kept" in line
    assert f"--model.init_from {last}" in line
    written = [*run.rglob("*.ckpt"), *run.rglob("*.pt")]
    assert written and all(weights_finite(path) for path in written), written
    assert 2 <= torch.load(last, weights_only=True)["global_step"] < stopped_at
    assert load_checkpoint(last).sample_shape == (2,)  # a usable model (loading refuses NaN weights)
