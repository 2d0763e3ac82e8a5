"""Post-hoc EMA (Karras et al. 2024, "Analyzing and Improving the Training Dynamics of Diffusion Models", EDM2):
power-function EMA profiles tracked every optimizer step during training (`PostHocEMA`, which the `EMA` callback
runs with ``--ema.post_hoc true``), their snapshot files in the run folder, and the EMA of any length
reconstructed from them afterwards (`reconstruct`; the command: `python -m diffusion.phema`). The math of the
profiles and the solver: `diffusion.training.ema_profiles`.

A snapshot is one profile's averaged parameters at one optimizer step, written into ``<run>/post_hoc_ema/`` as
``step=<step, 9 digits>-sigma_rel=<sigma_rel>.pt``: a plain dict of tensors and numbers (loadable with
``weights_only=True``) holding ``step``, ``sigma_rel``, ``gamma`` and ``weights`` (the averaged parameters under
the module's state_dict names, float32 on the CPU).
"""

import math
import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from diffusion.errors import (
    CannotRead,
    InvalidValue,
    MissingFile,
    OutOfRange,
    UserError,
    WrongType,
    check_real,
    check_whole_number,
)
from diffusion.training.atomic_writes import RUN_ON_ANOTHER_DISK, remove_leftovers, save_atomically
from diffusion.training.checkpoint_files import check_finite, check_zip_checksums
from diffusion.training.divergence import check_weights
from diffusion.training.ema_profiles import Solution, check_sigma_rel, combine, gamma_of, solve, update_weight
from diffusion.training.run_folders import POST_HOC_EMA, post_hoc_ema_folder, run_folder

SNAPSHOT_NAME = re.compile(r"step=(\d+)-sigma_rel=([0-9.e-]+)\.pt")  # run_folders.SNAPSHOT_FILES globs it
LEFTOVERS = ".step=*.pt.*.tmp"  # the hidden temporary files of snapshot writes that were killed
GB = 1e9
POOR_FIT = 0.1  # a relative L2 error of the reconstructed profile worth a warning (PoorFit)


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


def _load(path: Path, verify: bool = False) -> dict[str, Any]:
    """A snapshot's contents; with `verify`, its checksums and that its weights are finite are checked (a read of
    the whole file, done where the weights are used)."""
    fix = "delete that file (the other snapshots still reconstruct), or restore it from a backup"
    try:
        if not zipfile.is_zipfile(path):
            raise CannotRead(f"post-hoc EMA snapshot {path} is truncated or not a PyTorch file", fix)
        if verify:
            check_zip_checksums(path, "post-hoc EMA snapshot", fix)
        contents = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except UserError:  # said already (CannotRead is an OSError too: it was said again inside its own words)
        raise
    except (pickle.UnpicklingError, EOFError, RuntimeError, OSError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CannotRead(f"post-hoc EMA snapshot {path} cannot be read ({first_line})", fix) from err
    if not isinstance(contents, dict) or not {"step", "sigma_rel", "gamma", "weights"} <= contents.keys():
        raise InvalidValue(f"{path} is not a post-hoc EMA snapshot of this project", fix)
    return contents


FOLDER_FIX = (
    "pass a run's post-hoc EMA folder, <run>/post_hoc_ema (written by a run trained with post_hoc true)"
)


def find_snapshots(folder: str | Path) -> list[Snapshot]:
    """The snapshots in `folder`, by (step, sigma_rel); hidden temporary files of killed writes are not. A folder
    that is not there, or a file, is refused (a mistyped path is no run without snapshots); an empty one gives []."""
    if not isinstance(folder, str | os.PathLike):
        raise WrongType("folder", folder, "a path", FOLDER_FIX)
    if not Path(folder).exists():
        raise MissingFile(f"folder={str(folder)!r} does not exist", FOLDER_FIX)
    if not Path(folder).is_dir():
        raise InvalidValue(
            f"folder={str(folder)!r} is a file, not a folder of post-hoc EMA snapshots", FOLDER_FIX
        )
    snapshots = []
    for path in sorted(Path(folder).glob("step=*-sigma_rel=*.pt")):
        if SNAPSHOT_NAME.fullmatch(path.name) and path.is_file():
            contents = _load(path)
            snapshots.append(
                Snapshot(path, int(contents["step"]), float(contents["sigma_rel"]), float(contents["gamma"]))
            )
    # a run folder: its snapshots are one level down
    if not snapshots and (Path(folder) / POST_HOC_EMA).is_dir():
        raise InvalidValue(
            f"folder={str(folder)!r} is a run folder, not its post-hoc EMA folder",
            f"pass {Path(folder) / POST_HOC_EMA}",
        )
    return sorted(snapshots, key=lambda s: (s.step, s.sigma_rel))


def read_weights(snapshot: Snapshot) -> dict[str, torch.Tensor]:
    weights = _load(snapshot.path, verify=True)["weights"]
    check_finite(
        weights,
        f"post-hoc EMA snapshot {snapshot.path}",
        "delete that file (the other snapshots still reconstruct)",
    )
    return weights


class PostHocEMA:
    """Power-function EMA profiles of the parameters (one per sigma_rel), tracked in float32 on the parameters'
    device whatever the training precision, and a snapshot of each every `snapshot_every` optimizer steps and
    at the end of training, written atomically by global rank 0 into ``<run>/post_hoc_ema/``.

    Every profile is updated once per optimizer step (not per micro-batch), with the step count as time, so
    accumulation, DDP (each rank holds the same profiles of the same synced weights) and resumption (the
    profiles and their step are in the checkpoint, `state_dict`) all see one clock. The update is one
    `torch._foreach_lerp_` per profile, with its weight computed on the host (no device sync).

    The snapshots must fit in `max_snapshot_gb`: at the start of training rank 0 prints how many there will be
    and their size; when the requested interval would take more, the interval is widened to the smallest
    multiple of `snapshot_every` that fits (said in that line). A budget that cannot hold one snapshot of each
    profile is refused before training.
    """

    def __init__(self, sigma_rels: Sequence[float], snapshot_every: int, max_snapshot_gb: float) -> None:
        fix = "pass ema.sigma_rels as a list of floats, e.g. [0.05, 0.1] (EDM2's)"
        if not isinstance(sigma_rels, list | tuple):  # a str would be read a character at a time
            raise WrongType("ema.sigma_rels", sigma_rels, "a list of numbers", fix)
        if not sigma_rels:
            raise InvalidValue("ema.sigma_rels is empty", "pass at least one, e.g. [0.05, 0.1] (EDM2's)")
        for sigma_rel in sigma_rels:  # checked as given: "0.1" or True is refused, not converted
            check_real("ema.sigma_rels: sigma_rel", sigma_rel, fix)
            check_sigma_rel(sigma_rel, "ema.sigma_rels: sigma_rel")
        sigma_rels = [float(s) for s in sigma_rels]
        if len({snapshot_name(1, s) for s in sigma_rels}) != len(sigma_rels):
            raise InvalidValue(
                f"ema.sigma_rels={sigma_rels} repeats a value", "pass distinct ones, e.g. [0.05, 0.1]"
            )
        # a fraction was stored as given (its snapshots at steps no count of steps reaches)
        check_whole_number("ema.snapshot_every", snapshot_every, 1, "pass a number of steps, e.g. 100")
        if not max_snapshot_gb > 0:
            raise OutOfRange(
                "ema.max_snapshot_gb", max_snapshot_gb, "> 0", "pass the GB the snapshots may take"
            )
        self.sigma_rels = sigma_rels
        self.gammas = [gamma_of(s) for s in sigma_rels]
        self.snapshot_every = snapshot_every
        self.max_snapshot_gb = max_snapshot_gb
        self.interval = snapshot_every  # widened in `on_train_start` when the budget asks for it
        self.folder: Path | None = None
        self.step = 0  # the optimizer step of the latest update (0: none yet)
        self.profiles: list[dict[str, torch.Tensor]] | None = None  # per sigma_rel: parameter name -> float32
        self._params: dict[str, torch.Tensor] | None = None
        # The profiles' tensors in the parameters' order, for the foreach update.
        self._targets: list[list[torch.Tensor]] | None = None

    def snapshot_bytes(self) -> int:
        """The size of one snapshot instant: every profile's parameters in float32."""
        assert self._params is not None
        return len(self.sigma_rels) * sum(p.numel() for p in self._params.values()) * 4

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.folder = post_hoc_ema_folder(run_folder(trainer))  # a collective under DDP: called on every rank
        # The Parameter objects: the strategy moves the module to its device by swapping their data.
        self._params = dict(pl_module.named_parameters())
        self.step, self.profiles, self._targets, self.interval = 0, None, None, self.snapshot_every
        instant = self.snapshot_bytes()
        if instant > self.max_snapshot_gb * GB:
            # Suggest what the requested interval takes over the whole run (10 instants when it is open-ended).
            instants = math.ceil(trainer.max_steps / self.snapshot_every) if trainer.max_steps > 0 else 10
            each = instant // len(self.sigma_rels)
            raise InvalidValue(
                f"{{EMA:--max_snapshot_gb}} {self.max_snapshot_gb:g} cannot hold one post-hoc EMA snapshot of each of "
                f"the {len(self.sigma_rels)} profiles ({len(self.sigma_rels)} x {size(each)})",
                f"pass {{EMA:--max_snapshot_gb}} {_round_up(instants * instant / GB)} (a snapshot every "
                f"{self.snapshot_every} steps) or at least {_round_up(instant / GB)}, or {{EMA:--post_hoc}} false",
            )
        if trainer.is_global_zero and self.folder.is_dir():
            remove_leftovers(self.folder, LEFTOVERS)

    def on_train_start(self, trainer: L.Trainer) -> None:
        total = trainer.max_steps if trainer.max_steps != -1 else int(trainer.estimated_stepping_batches)
        instant = self.snapshot_bytes()
        allowed = int(self.max_snapshot_gb * GB // instant)  # >= 1 (checked in setup)
        self.interval = self.snapshot_every * max(1, math.ceil(total / (allowed * self.snapshot_every)))
        count = math.ceil(total / self.interval)
        requested = math.ceil(total / self.snapshot_every) * instant
        widened = (
            f" (every {self.snapshot_every} would take {size(requested)})"
            if requested > count * instant
            else ""
        )
        shown = ", ".join(f"{s:g}" for s in self.sigma_rels)
        rank_zero_info(
            f"post-hoc EMA: profiles sigma_rel {shown}, a snapshot of each every {self.interval} steps{widened} and "
            f"at the last: {count * len(self.sigma_rels)} files, {size(count * instant)} in {self.folder} "
            f"(max_snapshot_gb {self.max_snapshot_gb:g}); every checkpoint holds the profiles too "
            f"(+{size(instant)})"
        )

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold the current parameters into every profile at optimizer step `step` (1-based)."""
        assert self._params is not None
        # Under true half precision the profiles still average in float32.
        sources = [p.detach() if p.dtype == torch.float32 else p.float() for p in self._params.values()]
        if self.profiles is None:  # every profile's first update copies the weights (beta = 0)
            self.profiles = [
                {name: s.clone() for name, s in zip(self._params, sources, strict=True)} for _ in self.gammas
            ]
            self._targets = [list(profile.values()) for profile in self.profiles]
            self.step = step
            return
        if self._targets is None:  # restored from a checkpoint, on the CPU: onto the parameters' device, once
            self.profiles = [self._on_device(profile) for profile in self.profiles]
            self._targets = [list(profile.values()) for profile in self.profiles]
        for targets, gamma in zip(self._targets, self.gammas, strict=True):
            torch._foreach_lerp_(targets, sources, update_weight(gamma, step, step - self.step))
        self.step = step

    def _on_device(self, profile: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        assert self._params is not None
        return {name: profile[name].to(param.device) for name, param in self._params.items()}

    def on_train_batch_end(self, trainer: L.Trainer) -> None:
        if trainer.global_step <= self.step:
            return  # no optimizer step since the last update (accumulating gradients)
        self.update(trainer.global_step)
        if self.step % self.interval == 0:
            self.write_snapshots(trainer)

    def on_train_end(self, trainer: L.Trainer) -> None:
        # The final step, when it is not a multiple of the interval (never twice: the name is the step's).
        if self.profiles is None or self.step != trainer.global_step or self.folder is None:
            return
        if not (self.folder / snapshot_name(self.step, self.sigma_rels[0])).exists():
            self.write_snapshots(trainer)

    def write_snapshots(self, trainer: L.Trainer) -> None:
        assert self.profiles is not None and self.folder is not None
        for profile in self.profiles:  # on every rank (they hold the same weights), so all stop together
            check_weights(profile, trainer, before="a post-hoc EMA snapshot")
        if not trainer.is_global_zero:
            return
        for sigma_rel, gamma, profile in zip(self.sigma_rels, self.gammas, self.profiles, strict=True):
            weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in profile.items()}
            contents = snapshot_contents(self.step, sigma_rel, gamma, weights)
            save_atomically(contents, self.folder / snapshot_name(self.step, sigma_rel), RUN_ON_ANOTHER_DISK)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sigma_rels": list(self.sigma_rels), "profiles": self.profiles}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if [float(s) for s in state["sigma_rels"]] != self.sigma_rels:
            raise InvalidValue(
                f"the checkpoint's post-hoc EMA tracks sigma_rel {state['sigma_rels']}, not {self.sigma_rels}",
                f"resume with {{EMA:--sigma_rels}} {list(state['sigma_rels'])}",
            )
        self.step, self.profiles, self._targets = int(state["step"]), state["profiles"], None


@dataclass(frozen=True)
class Reconstruction:
    """The parameters of the EMA of relative width `sigma_rel` at optimizer step `step`, the snapshots they
    combine and the solver's `Solution` (its relative L2 error over time says how well the profile is met)."""

    weights: dict[str, torch.Tensor]
    step: int
    sigma_rel: float
    snapshots: list[Snapshot]
    solution: Solution


class PoorFit(UserWarning):
    """The snapshots combine into a profile farther than `POOR_FIT` (relative L2 error) from the one asked for: the
    weights only approximate that EMA. `python -m diffusion.phema` says it in a line of its own."""


def snapshot_steps(snapshots: list[Snapshot]) -> list[int]:
    return sorted({snapshot.step for snapshot in snapshots})


def check_snapshots(snapshots: Any) -> None:
    """Refuse what is not a non-empty list of `Snapshot`s (what `find_snapshots` returns)."""
    fix = "pass the list find_snapshots(<run>/post_hoc_ema) returns"
    if not isinstance(snapshots, list | tuple):
        raise WrongType("snapshots", snapshots, "a list of Snapshot", fix)
    for index, snapshot in enumerate(snapshots):
        if not isinstance(snapshot, Snapshot):
            raise WrongType(f"snapshots[{index}]", snapshot, "a Snapshot", fix)
    if not snapshots:  # an empty folder's: who passed it knows which folder, not why it is empty
        raise InvalidValue(
            "snapshots=[]: no post-hoc EMA snapshots to reconstruct from "
            "(the folder find_snapshots read holds none)",
            "pass find_snapshots(<run>/post_hoc_ema) of a run trained with post_hoc true",
        )


def check_step(snapshots: list[Snapshot], step: int | None, owner: str | None = None) -> int:
    """`step` if snapshots were written at it, or by default the newest such step; `owner` COMMAND where it is
    a command's `--step` (a Python caller's: the argument `step`)."""
    check_snapshots(snapshots)
    steps = snapshot_steps(snapshots)
    if step is None:
        return steps[-1]
    # a plain int: it goes into checkpoints (weights_only loading takes no int subclass); never rounded
    step = check_whole_number("step", step, 1, "pass a step with snapshots, or None for the newest")
    if step not in steps:
        shown = ", ".join(map(str, steps[-5:]))
        raise InvalidValue(
            f"{{--step}} {step}: no snapshot was written at that step",
            f"pick a step with snapshots (the last ones: {shown}), or leave {{--step}} out for the newest",
            owner,
        )
    return step


def reconstruct(snapshots: list[Snapshot], sigma_rel: float, step: int | None = None) -> Reconstruction:
    """The EMA of relative width `sigma_rel` at `step` (a step with snapshots; default: the newest), from the
    snapshots up to that step, streamed from disk one at a time. A fit worse than `POOR_FIT` (its relative L2 error:
    `.solution.relative_error`) is warned of (PoorFit): few snapshots, or a sigma_rel far from the tracked ones."""
    check_sigma_rel(sigma_rel, "sigma_rel")
    step = check_step(snapshots, step)
    used = [snapshot for snapshot in snapshots if snapshot.step <= step]
    solution = solve([s.step for s in used], [s.gamma for s in used], step, gamma_of(sigma_rel))
    if solution.relative_error > POOR_FIT:
        tracked = ", ".join(f"{s:g}" for s in sorted({s.sigma_rel for s in used}))
        count = f"{len(used)} snapshot{'s' if len(used) != 1 else ''}"
        warnings.warn(
            PoorFit(
                f"the snapshots fit the profile of sigma_rel {sigma_rel:g} poorly (relative L2 error "
                f"{100 * solution.relative_error:.0f}%, from {count} of sigma_rel {tracked} up to step {step}): "
                "the weights only approximate that EMA — pass more snapshots (all that "
                "find_snapshots(<run>/post_hoc_ema) returns), or a sigma_rel nearer the tracked ones"
            ),
            stacklevel=2,
        )

    def weighted() -> Iterator[tuple[float, dict[str, torch.Tensor]]]:
        for coefficient, snapshot in zip(solution.coefficients.tolist(), used, strict=True):
            yield coefficient, read_weights(snapshot)

    return Reconstruction(combine(weighted()), step, float(sigma_rel), used, solution)


def size(num_bytes: float) -> str:
    return f"{num_bytes / GB:.3g} GB" if num_bytes >= 0.1 * GB else f"{num_bytes / 1e6:.3g} MB"


def _round_up(gb: float) -> str:
    """A budget to suggest: `gb` rounded up to two significant digits."""
    scale = 10 ** (math.floor(math.log10(gb)) - 1)
    return f"{math.ceil(gb / scale) * scale:.2g}"
