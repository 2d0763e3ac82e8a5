"""Post-hoc EMA snapshot files, and the weights of any EMA length reconstructed from them.

A snapshot is one power-function EMA profile's averaged parameters at one optimizer step, written by
`diffusion.training.callbacks.EMA` (``--ema.post_hoc true``) into ``<run>/post_hoc_ema/`` as
``step=<step, 9 digits>-sigma_rel=<sigma_rel>.pt``: a plain dict of tensors and numbers (loadable with
``weights_only=True``) holding ``step``, ``sigma_rel``, ``gamma`` and ``weights`` (the averaged parameters under
the module's state_dict names, float32 on the CPU). The math is `diffusion.training.post_hoc_ema`'s.
"""

import pickle
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diffusion.errors import UserError
from diffusion.training.post_hoc_ema import Solution, check_sigma_rel, combine, gamma_of, solve

SNAPSHOT_NAME = re.compile(r"step=(\d+)-sigma_rel=([0-9.e-]+)\.pt")
LEFTOVERS = ".step=*.pt.*.tmp"  # the hidden temporary files of snapshot writes that were killed


def snapshot_name(step: int, sigma_rel: float) -> str:
    return f"step={step:09d}-sigma_rel={sigma_rel:g}.pt"


def snapshot_contents(step: int, sigma_rel: float, gamma: float, weights: dict[str, torch.Tensor]) -> dict:
    return {"step": step, "sigma_rel": sigma_rel, "gamma": gamma, "weights": weights}


@dataclass(frozen=True)
class Snapshot:
    path: Path
    step: int
    sigma_rel: float
    gamma: float


def _load(path: Path) -> dict[str, Any]:
    fix = "delete that file (the other snapshots still reconstruct), or restore it from a backup"
    try:
        if not zipfile.is_zipfile(path):
            raise UserError(f"post-hoc EMA snapshot {path} is truncated or not a PyTorch file", fix)
        contents = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, EOFError, RuntimeError, OSError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"post-hoc EMA snapshot {path} cannot be read ({first_line})", fix) from err
    if not isinstance(contents, dict) or not {"step", "sigma_rel", "gamma", "weights"} <= contents.keys():
        raise UserError(f"{path} is not a post-hoc EMA snapshot of this project", fix)
    return contents


def find_snapshots(folder: str | Path) -> list[Snapshot]:
    """The snapshots in `folder`, by (step, sigma_rel); hidden temporary files of killed writes are not."""
    snapshots = []
    for path in sorted(Path(folder).glob("step=*-sigma_rel=*.pt")):
        if SNAPSHOT_NAME.fullmatch(path.name) and path.is_file():
            contents = _load(path)
            snapshots.append(
                Snapshot(path, int(contents["step"]), float(contents["sigma_rel"]), float(contents["gamma"]))
            )
    return sorted(snapshots, key=lambda s: (s.step, s.sigma_rel))


def read_weights(snapshot: Snapshot) -> dict[str, torch.Tensor]:
    return _load(snapshot.path)["weights"]


@dataclass(frozen=True)
class Reconstruction:
    """The parameters of the EMA of relative width `sigma_rel` at optimizer step `step`, the snapshots they
    combine and the solver's `Solution` (its relative L2 error over time says how well the profile is met)."""

    weights: dict[str, torch.Tensor]
    step: int
    sigma_rel: float
    snapshots: list[Snapshot]
    solution: Solution


def snapshot_steps(snapshots: list[Snapshot]) -> list[int]:
    return sorted({snapshot.step for snapshot in snapshots})


def check_step(snapshots: list[Snapshot], step: int | None) -> int:
    """`step` if snapshots were written at it, or by default the newest such step."""
    if not snapshots:
        raise UserError(
            "no post-hoc EMA snapshots to reconstruct from",
            "train with --ema.post_hoc true (snapshots go to <run>/post_hoc_ema/)",
        )
    steps = snapshot_steps(snapshots)
    if step is None:
        return steps[-1]
    step = int(step)  # a plain int: it goes into checkpoints (weights_only loading takes no int subclass)
    if step not in steps:
        shown = ", ".join(map(str, steps[-5:]))
        raise UserError(
            f"--step {step}: no snapshot was written at that step",
            f"pick a step with snapshots (the last ones: {shown}), or leave --step out for the newest",
        )
    return step


def reconstruct(snapshots: list[Snapshot], sigma_rel: float, step: int | None = None) -> Reconstruction:
    """The EMA of relative width `sigma_rel` at `step` (a step with snapshots; default: the newest), from the
    snapshots up to that step, streamed from disk one at a time."""
    check_sigma_rel(sigma_rel, "--sigma_rel")
    step = check_step(snapshots, step)
    used = [snapshot for snapshot in snapshots if snapshot.step <= step]
    solution = solve([s.step for s in used], [s.gamma for s in used], step, gamma_of(sigma_rel))

    def weighted() -> Iterator[tuple[float, dict[str, torch.Tensor]]]:
        for coefficient, snapshot in zip(solution.coefficients.tolist(), used, strict=True):
            yield coefficient, read_weights(snapshot)

    return Reconstruction(combine(weighted()), step, float(sigma_rel), used, solution)
