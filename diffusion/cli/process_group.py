"""The processes a command runs on (`launch_ranks`), and closing the process group it opened.

A process that opened a process group closes it before the interpreter exits.

Lightning destroys an NCCL group at exit (an atexit handler) but leaves a gloo group open. Gloo's worker threads
can then still hold tensors with Python references while the interpreter finalizes; freeing them takes the GIL of
an interpreter being torn down, and the process aborts ("terminate called without an active exception", exit
status -6) after its work succeeded, as `python -m diffusion.sample --devices 2` on a CPU can; torch's docs ask every process to call `destroy_process_group()` once communication is over.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.distributed as dist
from lightning.fabric import Fabric

from diffusion.errors import CallerError


def process_group_is_open() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextmanager
def closing_process_group() -> Iterator[None]:
    """Destroy the default process group on leaving, on success or error, if it was opened inside: a group the
    caller opened before (their own torchrun script) stays theirs."""
    opened_by_caller = process_group_is_open()
    try:
        yield
    finally:
        if not opened_by_caller and process_group_is_open():
            dist.destroy_process_group()


class Ranks(NamedTuple):
    """The processes a command runs on: `fabric` is None for one process on `device`."""

    fabric: Fabric | None
    rank: int
    world_size: int
    device: str | torch.device


def launch_ranks(
    devices: int, num_nodes: int, accelerator: str, device: str, argv: list[str] | None, command: str
) -> Ranks:
    """One process, or `devices` x `num_nodes` DDP processes launched by Lightning Fabric (gloo on CPUs, NCCL on
    GPUs). Fabric starts the other ranks by re-running sys.argv, which is not `argv` when a caller passes one to
    `main([...])`: that is refused unless a launcher (torchrun, srun) started the processes."""
    if devices == 1 and num_nodes == 1:
        return Ranks(None, 0, 1, device)
    fabric = Fabric(accelerator=accelerator, devices=devices, num_nodes=num_nodes, strategy="ddp")
    if argv is not None and not fabric.strategy.cluster_environment.creates_processes_externally:  # type: ignore[attr-defined]
        raise CallerError(
            f"--devices {devices} starts processes by re-running the command line: run `python -m {command} ...` "
            "(or under torchrun / srun) rather than main([...])"
        )
    fabric.launch()
    return Ranks(fabric, fabric.global_rank, fabric.world_size, fabric.device)
