"""Checks that more than one command makes before any time is spent."""

import os
import tempfile
from pathlib import Path

from diffusion.errors import UserError


def check_writable_folder(path: str | os.PathLike, flag: str) -> None:
    """Raise UserError unless `path` is a folder this process can write into, or could create.

    Nothing is created: the nearest existing ancestor is tested by writing a temporary file there.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a folder", "pass a folder (it is created if missing)")
    existing = next(p for p in [path, *path.absolute().parents] if p.exists())
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is a file, not a folder", "pass a path through folders")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise UserError(
            f"{flag} {path}: cannot write into {existing} ({err.strerror or err})",
            "pick a folder you can write to",
        ) from err


def cpu_mixed_precision_note(precision: str, training: bool) -> str | None:
    """What `--precision` 16-mixed or bf16-mixed means on a CPU (None for other precisions), for train.py and
    the sample CLI. Lightning has no fp16 autocast on a CPU: it runs 16-mixed as bf16-mixed (no GradScaler).
    Training steps under CPU autocast run about 10x slower than 32-bit; a sampling forward in bf16 took 0.5-0.8x
    the 32-bit time at batch 16-256 on an AVX512-BF16 CPU (CPUs without bf16 instructions convert, slower)."""
    if "mixed" not in precision:
        return None
    substitute = " (16-mixed runs as bf16-mixed: fp16 autocast needs CUDA)" if precision == "16-mixed" else ""
    if training:
        return (
            f"precision={precision} on CPU runs about 10x slower than 32-bit{substitute}; mixed precision pays off "
            "on CUDA GPUs. For CPU runs use --precision 32."
        )
    return (
        f"--precision {precision} on a CPU runs the network in bf16{substitute}: about as fast as 32 or faster with "
        "bf16 instructions (AVX512-BF16, AMX), slower without; mixed precision is meant for CUDA GPUs"
    )
