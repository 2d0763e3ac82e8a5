"""StepTimer (diffusion.training.callbacks.step_timer) times the optimizer steps of a real train.py run after
its warm-up, leaves validation out of the median, and reports once (rank 0) with finite numbers.

The in-process runs drive the timer with a clock of its own: warm-up steps last 100 units, the others 1 and a
validation 50, so what the timer measured is exact (no timing on this machine's clock). They run on the CPU
whatever the machine has: the host clock is what the timer reads there, where on CUDA it reads events recorded in
the stream (the CUDA test below holds those to what they can guarantee)."""

import json
import math
import os
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import TINY_UNET, warm

from diffusion.cli.train import DiffusionCLI, fit
from diffusion.cli.training_run import DEFAULT_CONFIG
from diffusion.training.callbacks import StepTimer
from diffusion.training.callbacks.step_timer import count_flops_per_sample, kernel_kind, kernel_summary

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
TIMER = "--trainer.callbacks+=diffusion.training.callbacks.StepTimer"
HOST_CLOCK = ["--accelerator", "cpu"]  # where the timer reads its own clock: the fake one below


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class Advance(L.Callback):
    """Moves the clock by each step's (and validation's) length: 100 units for the first `slow` steps."""

    def __init__(self, clock: Clock, slow: int) -> None:
        self.clock, self.slow = clock, slow

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.clock.now += 100.0 if trainer.global_step <= self.slow else 1.0

    def on_validation_end(self, trainer, pl_module) -> None:
        self.clock.now += 50.0


def args(save_dir: Path, *extra: str) -> list[str]:
    return [
        "--config", str(DEFAULT_CONFIG), *TINY_UNET, "--data.init_args.batch_size", "8",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--sample_grid.num_samples", "2", "--sample_grid.sampling.steps", "2", "--model.warmup_steps", "1",
        "--trainer.logger.init_args.save_dir", str(save_dir), TIMER, "--trainer.callbacks.warmup_steps", "2",
        *extra,
    ]  # fmt: skip


def test_the_timer_skips_warm_up_leaves_validation_out_of_the_median_and_reports_finite_numbers(tmp_path):
    out = tmp_path / "speed.jsonl"
    cli = DiffusionCLI(
        args(tmp_path, "--trainer.callbacks.steps", "2", "--trainer.callbacks.path", str(out),
             "--max_steps", "6", "--trainer.val_check_interval", "3", *HOST_CLOCK),
    )  # fmt: skip
    timer = next(c for c in cli.trainer.callbacks if isinstance(c, StepTimer))
    timer._clock = clock = Clock()
    cli.trainer.callbacks.append(Advance(clock, slow=2))
    fit(cli)
    (line,) = out.read_text().splitlines()  # written once, when the window closed at step 4
    report = json.loads(line)
    assert report == timer.report
    assert report["first_timed_step"] == 2 and report["timed_steps"] == 2  # steps 2 and 3 (0-based)
    assert report["steps_with_validation"] == 1  # the validation after 3 steps sits in step 2's interval
    assert report["median_ms"] == 1000.0  # 1 unit: neither the warm-up nor the validation
    assert report["mean_ms"] == (51 + 1) / 2 * 1000  # the window's wall time: validation included
    assert report["global_batch"] == report["batch_per_device"] == 8 and report["images_per_s"] == 8.0
    assert report["gflop_per_image"] == pytest.approx(count_flops_per_sample(cli.model) / 1e9)
    assert report["tflops_per_device"] == pytest.approx(8 * report["gflop_per_image"] / 1e3)
    assert report["utilisation"] is None and report["graphs_compiled"] == 0
    assert report["peak_memory_bytes"] > 2**20
    assert report["warmup_seconds"] == 200.0  # the two warm-up steps: what compiling would cost shows here
    assert report["profile"] is None  # none asked for (and a CPU has no kernels to profile)
    assert all(math.isfinite(v) for v in report.values() if isinstance(v, float))


def test_profiled_steps_come_after_the_window_and_the_report_waits_for_them(tmp_path):
    out = tmp_path / "speed.jsonl"
    cli = DiffusionCLI(
        args(tmp_path, "--trainer.callbacks.steps", "2", "--trainer.callbacks.path", str(out),
             "--trainer.callbacks.profile_steps", "2", "--max_steps", "8", *HOST_CLOCK),
    )  # fmt: skip
    timer = next(c for c in cli.trainer.callbacks if isinstance(c, StepTimer))
    timer._clock = clock = Clock()
    cli.trainer.callbacks.append(Advance(clock, slow=2))
    written_at = []
    timer._write_on_rank_zero = lambda report: written_at.append(cli.trainer.global_step)
    fit(cli)
    assert written_at == [6]  # once: the window closed at step 4, then steps 4 and 5 were profiled
    assert timer.report["timed_steps"] == 2 and timer.report["median_ms"] == 1000.0
    assert timer.report["profile"] is None  # on a CPU: KernelProfile measures CUDA kernels only


def test_the_kernel_summary_tells_the_busy_share_and_the_kinds():
    kernels = [
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 0.004),
        ("void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16>", 0.002),
        ("triton_red_fused_native_group_norm_silu_0", 0.001),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop", 0.001),
        ("void at::native::multi_tensor_apply_kernel<FusedAdam>", 0.001),
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 0.001),
    ]
    summary = kernel_summary(kernels, wall_seconds=0.02, steps=2)
    assert summary["busy"] == pytest.approx(0.5) and summary["kernel_ms_per_step"] == pytest.approx(5.0)
    assert summary["wall_ms_per_step"] == pytest.approx(10.0) and summary["kernels_per_step"] == 3
    kinds = {kind: share for kind, share, _ in summary["kinds"]}
    assert kinds == pytest.approx({
        "convolution": 0.5, "layout conversion": 0.2, "Triton (Inductor's fused kernels)": 0.1,
        "attention": 0.1, "optimizer": 0.1,
    })  # fmt: skip
    assert summary["kinds"][0][0] == "convolution" and summary["top"][0][1] == pytest.approx(0.5)
    assert (
        kernel_kind("void at::native::vectorized_elementwise_kernel<4>") == "elementwise or reduction (ATen)"
    )


def test_a_run_shorter_than_the_window_reports_the_steps_it_timed_at_its_end(tmp_path):
    cli = DiffusionCLI(
        args(tmp_path, "--trainer.callbacks.peak_tflops", "2", "--max_steps", "5", *HOST_CLOCK)
    )
    timer = next(c for c in cli.trainer.callbacks if isinstance(c, StepTimer))
    timer._clock = clock = Clock()
    cli.trainer.callbacks.append(Advance(clock, slow=2))
    fit(cli)
    assert timer.report["timed_steps"] == 3 and timer.report["median_ms"] == 1000.0
    assert timer.report["utilisation"] == pytest.approx(timer.report["tflops_per_device"] / 2)


def test_a_bad_window_is_refused_with_a_fix():
    with pytest.raises(ValueError, match="pass warmup_steps >= 0, steps >= 1 and profile_steps >= 0"):
        StepTimer(steps=0)
    with pytest.raises(ValueError, match="profile_steps >= 0"):
        StepTimer(profile_steps=-1)
    with pytest.raises(ValueError, match="e.g. 790"):
        StepTimer(peak_tflops=0)


@pytest.mark.multiprocess
def test_under_ddp_rank_zero_alone_writes_the_report_of_the_global_batch(tmp_path):
    out = tmp_path / "speed.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    command = [
        sys.executable, str(ROOT / "train.py"),
        *args(tmp_path, "--trainer.callbacks.steps", "2", "--trainer.callbacks.path", str(out)),
        "--devices", "2", "--strategy", "ddp", "--accelerator", "cpu", "--max_steps", "5",
        "--trainer.val_check_interval", "5",
    ]  # fmt: skip
    result = warm.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, ranks=2)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    (line,) = out.read_text().splitlines()
    report = json.loads(line)
    assert report["world_size"] == 2 and report["global_batch"] == 16 and report["timed_steps"] == 2
    assert report["images_per_s"] == pytest.approx(16 / (report["median_ms"] / 1000))
    assert all(math.isfinite(v) for v in report.values() if isinstance(v, float))
    assert output.count("StepTimer [train.py]:") == 1


class OccupyTheDevice(L.Callback):
    """Queues `cycles` of GPU spinning after every batch: device time the host never waits for."""

    def __init__(self, cycles: int) -> None:
        self.cycles = cycles

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        torch.cuda._sleep(self.cycles)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_timer_reads_the_steps_off_cuda_events(tmp_path):
    """A host clock frozen at 0 would make every step 0 ms: the steps measured are the events' device time,
    at least the 4e7 cycles of spinning queued per step (10 ms even at 4 GHz; an H200 tops out at 1.98 GHz), and
    together no more than the host's own time for the whole run."""
    cli = DiffusionCLI(
        args(tmp_path, "--accelerator", "cuda", "--trainer.callbacks.steps", "3", "--max_steps", "9",
             "--trainer.callbacks.profile_steps", "2")
    )  # fmt: skip
    timer = next(c for c in cli.trainer.callbacks if isinstance(c, StepTimer))
    timer._clock = Clock()  # frozen: the host clock is not what CUDA steps are read from
    cli.trainer.callbacks.append(OccupyTheDevice(40_000_000))
    started = time.perf_counter()
    fit(cli)
    host_seconds = time.perf_counter() - started
    report = timer.report
    assert report["timed_steps"] == 3 and "CUDA" in report["device"]
    assert all(event is not None for _, event in timer._marks)
    assert report["median_ms"] >= 10.0
    assert report["mean_ms"] * report["timed_steps"] <= host_seconds * 1000
    assert report["peak_memory_bytes"] > 0 and report["images_per_s"] > 0
    # The profiled steps: the spinning kernel keeps the GPU busy most of each step, and it is their largest kind.
    profile = report["profile"]
    assert profile["steps"] == 2 and 0.5 < profile["busy"] <= 1.0, profile
    assert profile["kinds"][0][0] == "other" and profile["kernel_ms_per_step"] >= 10.0
