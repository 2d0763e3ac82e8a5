"""torch.compile as this project calls it, for its two graphs: the network's training step (`compile_graph`,
called by `diffusion.training`) and a sampler's evaluation (`compiled`, a sampler's `compile` option). Both come
through here, the one place that turns the project's settings into torch.compile's and that tests and CPU
benchmarks point at another backend (`compiling_with`: Inductor's C++ code generation takes minutes on two cores).

The settings, and why:
- `mode`: torch.compile's. "reduce-overhead" replays each graph as a CUDA graph: one launch where eager or
  default-mode code launches a few hundred kernels from Python. A GPU step of a CIFAR-size UNet is launch-bound
  (the GPU idled ~60% of a compiled step on an H200), so the training graph takes it on CUDA (docs/gpu.md).
  CUDA graphs exist only on CUDA: elsewhere the mode is "default".
- `channels_last`: Inductor lays the whole graph out NHWC (its `force_layout_optimization`). Left to itself,
  Inductor keeps a UNet's training graph NCHW (it refuses its layout optimisation for any 3x3 convolution that
  halves the channels, as after every skip concatenation) and cuDNN then transposes around each convolution.
  Parameters keep their layout: under autocast Inductor writes each weight's half-precision copy in the layout
  the graph wants, so checkpoints, the optimizer state and the EMA are untouched.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch

CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]

_BACKEND: list[str | Callable | None] = [None]  # None: Inductor
_COMPILED: dict[tuple, Callable] = {}


@contextmanager
def compiling_with(backend: str | Callable) -> Iterator[None]:
    """Within the block, compile with `backend` (a torch.compile backend's name or callable) instead of Inductor."""
    _BACKEND.append(backend)
    try:
        yield
    finally:
        _BACKEND.pop()


def mode_for(device: torch.device, mode: CompileMode | None = None) -> CompileMode:
    """`mode`, or where it is None the mode that pays on `device`: CUDA graphs on CUDA, "default" elsewhere."""
    if mode is not None:
        return mode
    return "reduce-overhead" if device.type == "cuda" else "default"


def inductor_options(mode: CompileMode, channels_last: bool = False) -> dict[str, Any]:
    """torch.compile's `options` for `mode` and the layout (torch.compile takes a mode or options, not both)."""
    options = dict(torch._inductor.list_mode_options(mode))
    if channels_last:
        options["force_layout_optimization"] = True
    return options


def compile_graph(
    function: Callable, mode: CompileMode = "default", channels_last: bool = False, dynamic: bool = False
) -> Callable:
    """`function` compiled with fixed shapes (`dynamic` False: each shape its own graph, the fastest kernels)."""
    backend = _BACKEND[-1]
    # Inductor's options; a backend given as a callable (the tests' counting ones) is handed them too, to show.
    inductor = backend in (None, "inductor")
    options = inductor_options(mode, channels_last) if inductor or callable(backend) else {}
    return torch.compile(function, dynamic=dynamic, backend=backend or "inductor", options=options or None)


def compiled(function: Callable, device: torch.device) -> Callable:
    """A sampler's evaluation `function` compiled for `device`'s type with fixed shapes, made once per process:
    torch.compile then traces once for each network, schedule, batch size and set of options, and runs the cached
    graph from there on. On CUDA its graph is a CUDA graph, whose outputs are copied out before the next replay
    overwrites them (multistep samplers keep the last step's x_0)."""
    backend = _BACKEND[-1]
    key = (function, device.type, backend)
    if key not in _COMPILED:
        mode = mode_for(device)
        graph = compile_graph(function, mode)
        cuda_graphs = inductor_options(mode).get("triton.cudagraphs", False) and backend in (None, "inductor")
        _COMPILED[key] = _copying_outputs(graph) if cuda_graphs else graph
    return _COMPILED[key]


def _copying_outputs(graph: Callable) -> Callable:
    """Each call marks a new step and copies the graph's outputs out of the memory its next replay overwrites."""

    def run(*args: Any) -> tuple:
        torch.compiler.cudagraph_mark_step_begin()
        return tuple(None if out is None else out.clone() for out in graph(*args))

    return run
