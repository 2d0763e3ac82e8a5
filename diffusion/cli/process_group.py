"""A process that opened a process group closes it before the interpreter exits.

Lightning destroys an NCCL group at exit (an atexit handler) but leaves a gloo group open. Gloo's worker threads
can then still hold tensors with Python references while the interpreter finalizes; freeing them takes the GIL of
an interpreter being torn down, and the process aborts ("terminate called without an active exception", exit
status -6) after its work succeeded, as `python -m diffusion.sample --devices 2` on a CPU can; torch's docs ask every process to call `destroy_process_group()` once communication is over.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist


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
