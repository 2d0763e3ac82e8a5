"""StepTimer: how fast a real `train.py` run trains, measured inside it (progress bar, logging, checkpoints and
the strategy included), without waiting on the device at every step.

    python train.py --config configs/cifar10.yaml --max_steps 130 \
        --trainer.callbacks+=diffusion.training.callbacks.StepTimer \
        --trainer.callbacks.peak_tflops 790 --trainer.callbacks.path runs/speed.jsonl
"""

import contextlib
import copy
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from torch import nn

from diffusion.errors import InvalidValue, check_whole_number


class StepTimer(L.Callback):
    """Times `steps` optimizer steps after `warmup_steps` of this fit and reports them once, from rank 0: the
    median step time, images/s of the global batch, peak memory, TFLOP/s per device and, with `peak_tflops`,
    the share of that peak, and how many graphs torch.compile built (and how many of them after warm-up,
    when they cost timed steps).

    A step is the interval between the starts of two optimizer steps (all of its accumulated micro-batches).
    On CUDA each step start records an event in the stream, so nothing waits on the device until the window
    is over (one synchronize then); on a CPU, the host clock. Steps with a validation in them are left out of
    the median and kept in `mean_ms` (the window's wall time over its steps: validation, checkpoints and
    everything else a run does included).

    The FLOPs are counted once, on a copy of the network on the meta device (torch.utils.flop_counter:
    matmuls and convolutions, 2 per multiply-add; forward and backward; the optimizer and EMA are not
    counted). Peak memory: CUDA max_memory_allocated since the fit started, or the process's peak RSS on a
    CPU (Linux); rank 0's own under DDP.

    Args:
        warmup_steps: untimed optimizer steps first (compilation, cuDNN autotuning, allocator growth).
        steps: timed optimizer steps; fewer if the run ends first (reported at its end).
        peak_tflops: the device's peak for the utilisation figure, e.g. 790 (bf16 matrix products measured
            on an H200).
        path: a file to append the report to as one JSON line (parents created).
        label: a name for this run in the report.
        profile_steps: after the timed steps, profile this many more (CUDA; `KernelProfile`): the share of the
            wall time the GPU runs kernels and the kernel kinds that take it, in the report's "profile".
    """

    def __init__(
        self,
        warmup_steps: int = 10,
        steps: int = 100,
        peak_tflops: float | None = None,
        path: str | None = None,
        label: str = "train.py",
        profile_steps: int = 0,
    ) -> None:
        # counts, each named: a fractional one was stored as given and timed a rounded number of steps
        window = "pass warmup_steps >= 0, steps >= 1 and profile_steps >= 0"
        warmup_steps = check_whole_number("warmup_steps", warmup_steps, fix=f"{window}, as ints")
        steps = check_whole_number("steps", steps, fix=f"{window}, as ints")
        profile_steps = check_whole_number("profile_steps", profile_steps, fix=f"{window}, as ints")
        if warmup_steps < 0 or steps < 1 or profile_steps < 0:
            raise InvalidValue(
                f"StepTimer warmup_steps={warmup_steps}, steps={steps}, profile_steps={profile_steps}", window
            )
        if peak_tflops is not None and peak_tflops <= 0:
            raise InvalidValue(
                f"StepTimer peak_tflops={peak_tflops}", "pass the device's peak in TFLOP/s, e.g. 790"
            )
        self.warmup_steps, self.steps, self.peak_tflops = warmup_steps, steps, peak_tflops
        self.path, self.label, self.profile_steps = path, label, profile_steps
        self.report: dict[str, Any] | None = None
        self._clock = time.perf_counter  # the host clock (a test's own clock in tests)
        self._reset()

    def _reset(self) -> None:
        self._marks: list[tuple[float, Any]] = []  # (host time, CUDA event or None) at each timed step start
        self._first_timed_step: int | None = None  # the global step the window starts at
        self._validated: set[int] = set()  # intervals (index of their first mark) with a validation in them
        self._started = 0  # optimizer steps started in this fit
        self._last_global_step: int | None = None
        self._batch = 0  # per-device micro-batch size
        self._flops_per_sample: float | None = None
        self._graphs_at: dict[str, int] = {}
        self._train_started: float | None = None
        self._warmup_seconds: float | None = None  # train start to the first timed step: compiling included
        self._profile: KernelProfile | None = None
        self._profiled = 0  # optimizer steps started under the profiler
        self.report = None

    # ---- hooks ----------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._reset()
            # Here, before the module's setup compiles the network and the strategy wraps it.
            self._flops_per_sample = count_flops_per_sample(pl_module)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        reset_peak_memory(pl_module.device)
        self._graphs_at["fit"] = graphs_compiled()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._train_started = self._clock()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._written or trainer.global_step == self._last_global_step:
            return  # reported already, or a later micro-batch of the same optimizer step
        self._last_global_step = trainer.global_step
        if self.report is not None:  # timed: profiling the steps after the window
            self._profiled += 1
            if self._profiled > self.profile_steps:
                self._write_with_profile()
            return
        if self._started == self.warmup_steps:
            self._batch = len(batch[0])
            self._first_timed_step = trainer.global_step
            self._graphs_at["window"] = graphs_compiled()
            if self._train_started is not None:
                self._warmup_seconds = self._clock() - self._train_started
        if self._started >= self.warmup_steps:
            self._mark(pl_module.device)
        self._started += 1
        if len(self._marks) == self.steps + 1:
            self._finish(trainer, pl_module)
            if self.profile_steps:
                self._profile = KernelProfile(pl_module.device)
                self._profile.start()
                self._profiled = 1
            else:
                self._write(self.report)  # type: ignore[arg-type]  # _finish made it

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._marks and self.report is None:
            self._validated.add(len(self._marks) - 1)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.report is None and self._marks:
            self._mark(pl_module.device)  # closes the last step
            self._finish(trainer, pl_module)
            self._write(self.report)  # type: ignore[arg-type]  # _finish made it
        elif self.report is not None and not self._written:
            self._write_with_profile()  # the run ended within the profiled steps

    @property
    def _written(self) -> bool:
        return self.report is not None and "profile" in self.report

    # ---- measuring ------------------------------------------------------------------------------------
    def _mark(self, device: torch.device) -> None:
        event = None
        if device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self._marks.append((self._clock(), event))

    def step_seconds(self) -> list[float]:
        """Seconds of each timed step, in order (CUDA: between the events; waits for the last one)."""
        if self._marks and self._marks[-1][1] is not None:
            self._marks[-1][1].synchronize()
            return [
                a[1].elapsed_time(b[1]) / 1000 for a, b in zip(self._marks, self._marks[1:], strict=False)
            ]
        return [b[0] - a[0] for a, b in zip(self._marks, self._marks[1:], strict=False)]

    def _finish(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        seconds = self.step_seconds()
        self.report = self._summary(trainer, pl_module, seconds)

    def _write_with_profile(self) -> None:
        assert self.report is not None and self._profile is not None
        self.report["profile"] = self._profile.stop(steps=self._profiled - 1)
        self._write(self.report)

    def _summary(
        self, trainer: L.Trainer, pl_module: L.LightningModule, seconds: list[float]
    ) -> dict[str, Any]:
        device = pl_module.device
        plain = [s for i, s in enumerate(seconds) if i not in self._validated] or seconds
        median = statistics.median(plain) if plain else float("nan")
        accumulate = trainer.accumulate_grad_batches
        per_device = self._batch * accumulate  # samples per optimizer step on this device
        flops = None if self._flops_per_sample is None else self._flops_per_sample * per_device
        tflops = None if flops is None else flops / median / 1e12
        window = self._graphs_at.get("window", graphs_compiled())
        return {
            "label": self.label,
            "device": device_name(device),
            "torch": torch.__version__,
            "precision": str(trainer.precision),
            "world_size": trainer.world_size,
            "batch_per_device": self._batch,
            "accumulate_grad_batches": accumulate,
            "global_batch": per_device * trainer.world_size,
            "warmup_steps": self.warmup_steps,
            "first_timed_step": self._first_timed_step,
            "timed_steps": len(seconds),
            "steps_with_validation": len(self._validated),
            "median_ms": median * 1000,
            "mean_ms": statistics.fmean(seconds) * 1000 if seconds else float("nan"),
            "images_per_s": per_device * trainer.world_size / median,
            "peak_memory_bytes": peak_memory(device),
            "gflop_per_image": None if self._flops_per_sample is None else self._flops_per_sample / 1e9,
            "tflops_per_device": tflops,
            "peak_tflops": self.peak_tflops,
            "utilisation": None if tflops is None or self.peak_tflops is None else tflops / self.peak_tflops,
            "graphs_compiled": graphs_compiled() - self._graphs_at.get("fit", 0),
            "graphs_compiled_after_warmup": graphs_compiled() - window,
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "warmup_seconds": self._warmup_seconds,
        }

    def _write(self, report: dict[str, Any]) -> None:
        report.setdefault("profile", None)  # written: nothing more to do in this fit
        self._write_on_rank_zero(report)

    @rank_zero_only
    def _write_on_rank_zero(self, report: dict[str, Any]) -> None:
        rank_zero_info(summary_line(report))
        if self.path:
            path = Path(self.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as file:
                file.write(json.dumps(report) + "\n")


def summary_line(report: dict[str, Any]) -> str:
    """The report in one line for the run's log."""
    line = (
        f"StepTimer [{report['label']}]: {report['median_ms']:.2f} ms/step (median of {report['timed_steps']} "
        f"after {report['warmup_steps']} warm-up; mean {report['mean_ms']:.2f}), {report['images_per_s']:,.0f} "
        f"images/s at global batch {report['global_batch']}, peak memory {report['peak_memory_bytes'] / 2**30:.2f} "
        f"GiB, {report['precision']}"
    )
    if report["tflops_per_device"] is not None:
        line += f", {report['tflops_per_device']:.3g} TFLOP/s per device"
    if report["utilisation"] is not None:
        line += f" = {report['utilisation']:.1%} of {report['peak_tflops']:g}"
    line += f"; graphs compiled {report['graphs_compiled']} ({report['graphs_compiled_after_warmup']} after warm-up)"
    if report.get("warmup_seconds") is not None:
        line += f"; warm-up (compiling included) {report['warmup_seconds']:.1f} s"
    if report.get("profile"):
        profile = report["profile"]
        kinds = ", ".join(f"{kind} {share:.0%}" for kind, share, _ in profile["kinds"][:4])
        line += f"; GPU busy {profile['busy']:.0%} of {profile['steps']} profiled steps ({kinds})"
    return line


# ---- what is measured -----------------------------------------------------------------------------------
def count_flops_per_sample(module: nn.Module, batch: int = 2) -> float | None:
    """FLOPs of one training sample's forward and backward through `module.network`, counted on a meta copy
    (no memory, no arithmetic); None when the network cannot run on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode

    network = getattr(module, "network", None)
    shape = getattr(module, "sample_shape", None)
    if network is None or shape is None:
        return None
    try:
        meta = copy.deepcopy(network).to("meta")
        x = torch.zeros((batch, *shape), device="meta")
        t = torch.zeros(batch, dtype=torch.long, device="meta")
        args = (x, t) if getattr(network, "num_classes", None) is None else (x, t, t)
        with FlopCounterMode(display=False) as counter:
            meta.forward(*args).float().square().mean().backward()  # never a compiled call
    except Exception:  # a network the meta device cannot run: the report goes without FLOPs
        return None
    return counter.get_total_flops() / batch


def graphs_compiled() -> int:
    """Graphs torch.compile (Dynamo) has built in this process; 0 when it never ran."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")  # never imported just to read a counter
    return 0 if utils is None else int(utils.counters["stats"]["unique_graphs"])


def reset_peak_memory(device: torch.device) -> int:
    """Start a peak-memory window; returns the memory in use at its start."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := current RSS
    return _proc_status_bytes("VmRSS")


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _proc_status_bytes("VmHWM")


def _proc_status_bytes(field_name: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    import resource  # not Linux: the peak of the whole process

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    import platform

    model = platform.processor() or "CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {torch.get_num_threads()} threads"


# ---- where the device's time goes -----------------------------------------------------------------------
# Kernel kinds by name, first match wins (attention before convolution: cuDNN's fused attention is named cudnn_*).
KERNEL_KINDS = [
    ("attention", re.compile(r"flash|fmha|sdpa|attention", re.I)),
    ("layout conversion", re.compile(r"nchwToNhwc|nhwcToNchw", re.I)),
    ("convolution", re.compile(r"conv|implicit_gemm|fprop|dgrad|wgrad|cudnn", re.I)),
    ("matrix product", re.compile(r"gemm|cutlass|matmul|xmma", re.I)),
    ("optimizer", re.compile(r"multi_tensor_apply|fused_adam|adam", re.I)),
    ("Triton (Inductor's fused kernels)", re.compile(r"^triton_")),
    ("normalisation", re.compile(r"norm", re.I)),
    ("copy or fill", re.compile(r"memcpy|memset|copy|fill", re.I)),
    ("elementwise or reduction (ATen)", re.compile(r"elementwise|vectorized|reduce", re.I)),
]


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), "other")


def kernel_summary(kernels: list[tuple[str, float]], wall_seconds: float, steps: int) -> dict[str, Any]:
    """What a window of `steps` steps of `wall_seconds` spent in device kernels, from (name, seconds) per kernel
    run: `busy` (kernel time over wall time: the rest the device waited, for the host as a rule), the kinds'
    shares of kernel time (largest first, with ms per step) and the top kernels by name."""
    total = sum(seconds for _, seconds in kernels)
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for name, seconds in kernels:
        by_kind[kernel_kind(name)] = by_kind.get(kernel_kind(name), 0.0) + seconds
        by_name[name] = by_name.get(name, 0.0) + seconds
    share = lambda part: part / total if total else 0.0  # noqa: E731
    return {
        "steps": steps,
        "wall_ms_per_step": wall_seconds / steps * 1000,
        "kernel_ms_per_step": total / steps * 1000,
        "busy": total / wall_seconds if wall_seconds else 0.0,
        "kernels_per_step": len(kernels) / steps,
        "kinds": sorted(
            ((kind, share(t), t / steps * 1000) for kind, t in by_kind.items()), key=lambda k: -k[1]
        ),
        "top": sorted(((name[:120], share(t)) for name, t in by_name.items()), key=lambda k: -k[1])[:10],
    }


class KernelProfile:
    """torch.profiler over a window of steps on a CUDA device, summarised by `kernel_summary`; the window's wall
    time from CUDA events at its ends. Elsewhere (a CPU has no kernels to tell apart from the host's work) it
    measures nothing and `stop` returns None."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._profiler: torch.profiler.profile | None = None
        self._events: list[torch.cuda.Event] = []

    def start(self) -> None:
        if self.device.type != "cuda":
            return
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        self._profiler.__enter__()
        self._events = [torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)]
        self._events[0].record()

    def stop(self, steps: int) -> dict[str, Any] | None:
        if self._profiler is None or steps < 1:
            return None
        self._events[1].record()
        self._events[1].synchronize()
        self._profiler.__exit__(None, None, None)
        wall = self._events[0].elapsed_time(self._events[1]) / 1000
        kernels = [
            (event.name, event.time_range.elapsed_us() / 1e6)
            for event in self._profiler.events()
            if event.device_type == torch.autograd.DeviceType.CUDA
        ]
        return kernel_summary(kernels, wall, steps)
