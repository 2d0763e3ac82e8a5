"""The sampling loop's evaluation compiled once (a sampler's `compile` option): the network with guidance, the
parameterisation and clipping (`diffusion.core.samplers.contract.evaluate`) as one graph of fixed shapes, which
every step of every batch of one size replays. On a CUDA GPU the graph is captured as a CUDA graph (torch.compile's
mode "reduce-overhead"), so a step launches one graph rather than a few hundred kernels; the outputs are copied
out of the graph's memory before the next replay overwrites it (multistep samplers keep the last step's x_0).

Compiled functions are made once per process and device type (`compiled`); torch.compile then traces once for each
network, schedule, batch size and set of options, and runs the cached graph from there on. `compiling_with`
chooses another backend within a block: the tests' aot_eager on a CPU (Inductor's C++ takes minutes on two cores)
and a backend counting the graphs it is handed; a CPU benchmark's eager.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

_BACKEND: list[str | Callable | None] = [None]  # None: Inductor, with CUDA graphs on CUDA
_COMPILED: dict[tuple, Callable] = {}


@contextmanager
def compiling_with(backend: str | Callable) -> Iterator[None]:
    """Within the block, compile the sampling path with `backend` (a torch.compile backend's name or callable)."""
    _BACKEND.append(backend)
    try:
        yield
    finally:
        _BACKEND.pop()


def compiled(function: Callable, device: torch.device) -> Callable:
    """`function` compiled for `device`'s type with fixed shapes (each batch size its own graph), made once."""
    backend = _BACKEND[-1]
    cuda_graphs = device.type == "cuda" and backend is None
    key = (function, device.type, backend)
    if key not in _COMPILED:
        settings: dict[str, Any] = {"mode": "reduce-overhead"} if cuda_graphs else {}
        graph = torch.compile(function, dynamic=False, backend=backend or "inductor", **settings)
        _COMPILED[key] = _copying_outputs(graph) if cuda_graphs else graph
    return _COMPILED[key]


def _copying_outputs(graph: Callable) -> Callable:
    """A CUDA graph's outputs live in memory its next replay overwrites: each call marks a new step and copies
    them out."""

    def run(*args: Any) -> tuple:
        torch.compiler.cudagraph_mark_step_begin()
        return tuple(None if out is None else out.clone() for out in graph(*args))

    return run
