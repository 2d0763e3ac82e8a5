"""Mixed precision: the DDPM trains under bf16-mixed and under fp16 with a GradScaler (also with 2-process
DDP), the noise schedule stays float32 and the loss is computed in float32, the GradScaler's state is saved
in checkpoints and restored on resume, and sampling under autocast returns float32 samples.

On CPU, Lightning 2.6 replaces `--precision 16-mixed` by bf16-mixed ("AMP with fp16 is not supported on
CPU"), so the fp16 + GradScaler runs here pass Lightning's own plugin, `MixedPrecision("16-mixed", "cpu")`,
which is what `--precision 16-mixed` builds on a GPU (there with device "cuda").
"""

import json
import math
import os
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import QUICK, TINY_UNET, VALIDATING_EVERY_2, warm
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from diffusion.cli.train import DiffusionCLI, with_default_config
from diffusion.core.sampling import SamplingOptions
from diffusion.training.loading import load_checkpoint

REPO = Path(__file__).parents[2]
MAX_STEPS = 2
# QUICK with two steps of batch 8: enough to show training works in a precision, and fp16 on a CPU
# is slow (~6 s per step at the recipe's batch 64 even for the tiny UNet).
FAST = [*TINY_UNET, *QUICK, "--max_steps", str(MAX_STEPS), "--accelerator", "cpu",
        "--data.init_args.batch_size", "8"]  # fmt: skip
FP16_PLUGIN = {"class_path": "lightning.pytorch.plugins.precision.MixedPrecision",
               "init_args": {"precision": "16-mixed", "device": "cpu"}}  # fmt: skip
PRECISIONS = {
    "32": ["--precision", "32"],
    "bf16-mixed": ["--precision", "bf16-mixed"],
    # Lightning refuses both a precision and a precision plugin: the recipe's `precision: 32` is unset.
    "16-mixed+GradScaler": ["--precision", "null", "--trainer.plugins", json.dumps(FP16_PLUGIN)],
}
# The dtype autocast gives the network's output: evidence that mixed precision really ran.
NETWORK_DTYPE = {"32": torch.float32, "bf16-mixed": torch.bfloat16, "16-mixed+GradScaler": torch.float16}


class Probe(L.Callback):
    """Records dtypes during training and the GradScaler's state when training starts (after a resume)."""

    def __init__(self) -> None:
        self.schedule_dtypes: set[torch.dtype] = set()
        self.q_sample_dtypes: set[torch.dtype] = set()
        self.network_dtypes: set[torch.dtype] = set()
        self.losses: list[torch.Tensor] = []
        self.scaler_at_start: dict | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        self.scaler_at_start = None if scaler is None else scaler.state_dict()
        schedule, q_sample = pl_module.schedule, pl_module.schedule.q_sample

        def recording_q_sample(*args, **kwargs) -> torch.Tensor:  # runs inside the autocast region
            x_t = q_sample(*args, **kwargs)
            self.q_sample_dtypes.add(x_t.dtype)
            return x_t

        schedule.q_sample = recording_q_sample  # instance attribute: this run only
        pl_module.network.register_forward_hook(lambda module, args, out: self.network_dtypes.add(out.dtype))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.schedule_dtypes |= {buffer.dtype for buffer in pl_module.schedule.buffers()}
        self.losses.append(outputs["loss"].detach())


def fit(args: list[str], probe: Probe | None = None) -> DiffusionCLI:
    cli = DiffusionCLI(with_default_config(args))
    if probe is not None:
        cli.trainer.callbacks.append(probe)
    cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=cli.config.ckpt_path)
    return cli


NO_OUTPUT = ["--trainer.logger", "false", "--trainer.limit_val_batches", "0"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_schedule_stays_float32_and_the_loss_is_float32(precision, tmp_path):
    probe = Probe()
    fit([*FAST, *PRECISIONS[precision], *NO_OUTPUT, "--trainer.default_root_dir", str(tmp_path)], probe)
    assert probe.network_dtypes == {NETWORK_DTYPE[precision]}
    assert probe.schedule_dtypes == {torch.float32}
    assert probe.q_sample_dtypes == {torch.float32}  # x_t is built from float32 schedule values
    assert {loss.dtype for loss in probe.losses} == {torch.float32}
    assert all(torch.isfinite(loss) for loss in probe.losses) and len(probe.losses) == MAX_STEPS


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_true_half_precision_is_rejected_naming_the_mixed_alternative(precision, tmp_path):
    with pytest.raises(ValueError, match=f"precision={precision} is not supported.* use precision .*-mixed"):
        fit([*FAST, "--precision", precision, *NO_OUTPUT, "--trainer.default_root_dir", str(tmp_path),
             "--max_steps", "1"], Probe())  # fmt: skip


def test_16_mixed_on_cpu_is_run_as_bf16_mixed_by_lightning():
    with pytest.warns(UserWarning, match="16-mixed runs as bf16-mixed"):
        cli = DiffusionCLI([*FAST, "--precision", "16-mixed", "--trainer.logger", "false"])
    assert cli.trainer.precision == "bf16-mixed"
    assert cli.trainer.precision_plugin.scaler is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the default accelerator is then the GPU")
def test_the_cpu_note_comes_with_the_default_accelerator_too():
    # A user on a machine without a GPU passes no --accelerator: auto is the CPU, and the note is due.
    default = [arg for arg in FAST if arg not in ("--accelerator", "cpu")]
    with pytest.warns(UserWarning, match="16-mixed runs as bf16-mixed"):
        DiffusionCLI([*default, "--precision", "16-mixed", "--trainer.logger", "false"])


def test_grad_scaler_state_is_checkpointed_and_restored_on_resume(tmp_path):
    args = [
        *FAST,
        *PRECISIONS["16-mixed+GradScaler"],
        *NO_OUTPUT,
        "--trainer.default_root_dir",
        str(tmp_path),
    ]
    fit(args)
    last = tmp_path / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=False)
    state = checkpoint["MixedPrecision"]  # Lightning stores the precision plugin's state_dict by class name
    assert state["scale"] > 0 and "_growth_tracker" in state
    # A state no fresh GradScaler has (it starts at 65536 with tracker 0), so restoring it is unmistakable.
    state.update(scale=512.0, _growth_tracker=3)
    edited = tmp_path / "edited.ckpt"
    torch.save(checkpoint, edited)

    probe = Probe()
    fit([*args, "--ckpt_path", str(edited), "--max_steps", str(MAX_STEPS + 1)], probe)
    assert probe.scaler_at_start["scale"] == 512.0 and probe.scaler_at_start["_growth_tracker"] == 3
    after = torch.load(last, weights_only=False)["MixedPrecision"]
    # One more step continued from the restored state: a finite step counts on, an overflow halves the scale.
    assert (after["scale"], after["_growth_tracker"]) in {(512.0, 4), (256.0, 0)}


def scalars(save_dir: Path, tag: str) -> list[float]:
    (run,) = save_dir.glob("*/version_*")
    events = EventAccumulator(str(run))
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


@pytest.mark.multiprocess
def test_two_process_ddp_trains_16_mixed_with_a_grad_scaler_to_a_finite_loss(tmp_path):
    # 16-mixed is the mixed precision with state across steps (the GradScaler's scale, which every rank must keep
    # alike: DDP averages the gradients before the scaler looks for infinities). bf16-mixed has none: autocast
    # works within each process, on gradients DDP reduces as in float32 (the DDP tests), so one launch is enough.
    precision = "16-mixed+GradScaler"
    cmd = [sys.executable, str(REPO / "train.py"), "--devices", "2", "--strategy", "ddp", *FAST, *VALIDATING_EVERY_2,
           *PRECISIONS[precision], "--trainer.log_every_n_steps", "1",
           "--trainer.logger.init_args.save_dir", str(tmp_path)]  # fmt: skip
    # One thread per process, as torchrun sets: two processes with two threads each thrash 2 cores.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = warm.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, ranks=2)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = scalars(tmp_path, "train/loss")
    assert len(losses) == MAX_STEPS and all(math.isfinite(loss) for loss in losses)
    assert all(math.isfinite(loss) for loss in scalars(tmp_path, "val/loss"))
    (last,) = tmp_path.glob("*/version_*/checkpoints/last.ckpt")
    checkpoint = torch.load(last, weights_only=False)
    assert all(torch.isfinite(value).all() for value in checkpoint["state_dict"].values())
    assert checkpoint["MixedPrecision"]["scale"] > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sampling_under_autocast_returns_float32_samples(dtype, digits_checkpoint):
    module = load_checkpoint(digits_checkpoint)
    options = {"seed": 0, "options": SamplingOptions(sampler="ddim", steps=3)}
    with torch.autocast("cpu", dtype=dtype):
        samples = module.sample(3, **options)
    assert samples.dtype == torch.float32 and samples.shape == (3, 1, 8, 8)
    # The same samples as in float32, up to the half-precision network's rounding.
    torch.testing.assert_close(samples, module.sample(3, **options), atol=0.05, rtol=0)
