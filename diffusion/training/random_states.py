"""Every rank's random streams, saved in checkpoints so that a resumed run draws what the run left alone would
have drawn: torch's CPU and CUDA generators, numpy's and Python's (dropout and data augmentation draw from them).
Plain data only (tensors, ints, floats, dicts), so checkpoints load with weights_only=True. Only rank 0 writes
the checkpoint, so every rank's states are gathered into it while it is saved (`gather_from_ranks`)."""

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn


# ---- random states: plain data (tensors, ints, floats, dicts), so checkpoints load with weights_only=True ----
def global_random_states(device: torch.device) -> dict[str, Any]:
    """This process's global RNGs: torch's CPU generator, the device's CUDA generator, numpy's and Python's."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, python_state, gauss_next = random.getstate()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),  # type: ignore[attr-defined]
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": {"version": version, "state": torch.tensor(python_state, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }  # fmt: skip
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def restore_global_random_states(states: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(states["torch"])
    numpy_state = states["numpy"]
    np.random.set_state(
        ("MT19937", numpy_state["keys"].numpy().astype(np.uint32), numpy_state["pos"],
         numpy_state["has_gauss"], numpy_state["cached_gaussian"])
    )  # fmt: skip
    python_state = states["python"]
    random.setstate(
        (python_state["version"], tuple(python_state["state"].tolist()), python_state["gauss_next"])
    )
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


def gather_from_ranks(states: dict[str, Any], world_size: int) -> list[dict[str, Any]]:
    """Every rank's `states`, in rank order, on every rank. A collective: all ranks must call it, as they all
    run `on_save_checkpoint` when Lightning saves (only rank 0 then writes the file)."""
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [states]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, states)
    return gathered


def resumed_states(
    checkpoint: dict[str, Any], rank: int, world_size: int
) -> tuple[dict[str, Any] | None, int]:
    """(this rank's random states in the checkpoint, or None, the checkpoint's step) for a fit resuming from it.

    None, with the step, when the checkpoint was saved by another number of processes (with a warning); (None,
    0) when it holds no states (written before they were saved)."""
    if "random_states" not in checkpoint:
        return None, 0
    states, step = checkpoint["random_states"], int(checkpoint.get("global_step", 0))
    if len(states) == world_size:
        return states[rank], step
    rank_zero_warn(
        f"resuming with {world_size} processes a checkpoint saved by {len(states)}: training "
        "continues, but noise, dropout and the rest of the interrupted epoch differ from the first run"
    )
    return None, step
