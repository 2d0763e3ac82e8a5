"""The processes a command runs on (`launch_ranks`), and closing the process group it opened.

A process that opened a process group closes it before the interpreter exits.

Lightning destroys an NCCL group at exit (an atexit handler) but leaves a gloo group open. Gloo's worker threads
can then still hold tensors with Python references while the interpreter finalizes; freeing them takes the GIL of
an interpreter being torn down, and the process aborts ("terminate called without an active exception", exit
status -6) after its work succeeded, as `python -m diffusion.sample --devices 2` on a CPU can; torch's docs ask every process to call `destroy_process_group()` once communication is over.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from lightning.fabric import Fabric
from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

from diffusion.errors import CallerError, UserError

# The launchers Lightning finds on its own (its order), and the variables that point its own launcher at the
# other machines (Lightning's LightningEnvironment: the command started on each machine by hand).
CLUSTERS = (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment)
LAUNCH_VARIABLES = ("MASTER_ADDR", "NODE_RANK")


def check_other_machines_named(num_nodes: int, strategy: Any = None) -> None:
    """--num_nodes above 1 where nothing starts or names the other machines: no cluster launcher (torchrun, SLURM,
    LSF, MPI: the cluster environment of `strategy`, the Trainer's or Fabric's, or else those found here) and
    neither MASTER_ADDR nor NODE_RANK set. Every rank then waited for machines that never come, past SIGTERM."""
    environment: ClusterEnvironment | None = getattr(strategy, "cluster_environment", None)
    if num_nodes <= 1 or any(os.environ.get(name) for name in LAUNCH_VARIABLES):
        return
    if environment is None:
        if any(cluster.detect() for cluster in CLUSTERS):
            return
    elif type(environment) is not LightningEnvironment:  # a launcher's, or one the user chose (a plugin)
        return
    raise UserError(
        f"--num_nodes {num_nodes}: nothing starts or names the other machines (no torchrun, SLURM, LSF or MPI "
        "job, and neither MASTER_ADDR nor NODE_RANK is set), so this process would wait for them without end",
        f"start the command on each of the {num_nodes} machines under torchrun --nnodes {num_nodes} or srun, or "
        f"with MASTER_ADDR=<first machine> MASTER_PORT=<port> NODE_RANK=<0 to {num_nodes - 1}> (docs/scaling.md); "
        "on one machine, leave --num_nodes out and pass --devices",
    )


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
    check_other_machines_named(num_nodes, fabric.strategy)
    if argv is not None and not fabric.strategy.cluster_environment.creates_processes_externally:  # type: ignore[attr-defined]
        raise CallerError(
            f"--devices {devices} starts processes by re-running the command line: run `python -m {command} ...` "
            "(or under torchrun / srun) rather than main([...])"
        )
    fabric.launch()
    return Ranks(fabric, fabric.global_rank, fabric.world_size, fabric.device)
