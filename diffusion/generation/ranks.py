"""Generation on one or many ranks: the sampling library the sample CLI, the callbacks and the notebook share.

The rule that makes any world size give the same samples lives here once: with W ranks, rank r draws
samples r, r + W, r + 2W, ... (`rank_indices`), each from its own per-sample seed (see
`DiffusionModule.initial_noise`; `module` is a DiffusionModule, or any `Sampleable`: what generation needs of a
module, declared), and `gather_in_order` puts the gathered shares back in index order.
Generation takes its sampler built (`module.sampler(options)`, `diffusion.core.sampling`) and only runs it: each
batch one call from the commands, `python -m diffusion.sample` -> `generate_in_chunks` -> the sampler's numbered
steps (`diffusion.core.samplers`); it never goes back to the module for options. Only `generate` given no sampler
asks the module for its own (`module.model_sampling.sampler()`, what the sample command without flags draws with).
Class labels follow the same rule: sample i has label `labels[i]` (`diffusion.data.labels.class_labels`) on any
rank.
Ranks exchange images as uint8 (`render.compact`, a quarter of float32's bytes: 50,000 256x256 RGB images
are 9.8 GB rather than 39 GB), vectors as float.

`network_precision` runs the network under autocast (`--precision bf16-mixed` in the sample CLI) while the
sampler's arithmetic stays float32.
"""

import math
import warnings
from collections import deque
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager
from typing import Protocol, cast, runtime_checkable

import lightning as L
import torch
from tqdm import tqdm

from diffusion.core.noise import Generators
from diffusion.core.samplers.contract import Denoiser, Sampler
from diffusion.core.sampling import SamplingOptions
from diffusion.errors import UserError
from diffusion.generation.arguments import (
    check_guidance_fits,
    check_guidance_has_labels,
    check_model_can_sample,
    check_module,
    check_result_fits_memory,
    check_sampler_and_switches,
    checked_counts,
    checked_labels,
    checked_seed,
    own_sampling,
    sampler_from_deprecated_options,
)
from diffusion.generation.render import compact

# Samples drawn at once on each device: a sampling loop's batch (the sample command's --batch_size, the grid and
# FID callbacks'); the per-sample seeds make the samples the same whatever it is.
SAMPLING_BATCH = 256


CHUNK_BYTES = 64 * 2**20  # samples a rank holds before they are gathered and written


class SamplesNotFinite(UserError, RuntimeError):
    """Sampling produced NaN or infinity (16-bit overflow, weights that diverged): nothing is written; said as one
    line by a command, and a RuntimeError too for Python callers of `generate`."""


@runtime_checkable
class Sampleable(Protocol):
    """What generation needs of a module, and all it uses (`DiffusionModule` is one; tests check that it is):
    each sample's initial noise and generators, the network as samplers see it, an evaluation mode, and the
    data's shape and units. The sampler comes built, from the caller (`generate` given none draws with a module's
    own, its `model_sampling`, which a DiffusionModule has and a bare Sampleable need not)."""

    sample_shape: tuple[int, ...]

    @property
    def normalization(self) -> dict[str, list[float]]: ...

    def initial_noise(
        self, num_samples: int, seed: int | None = None, indices: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, Generators]: ...

    def denoiser(self, num_samples: int, labels: torch.Tensor | None = None) -> Denoiser: ...

    def evaluating(self) -> AbstractContextManager[None]: ...


# What `check_module` looks for: Sampleable's members, read without calling them (isinstance would call them).
SAMPLEABLE_MEMBERS = sorted(
    {*Sampleable.__annotations__, *(name for name in vars(Sampleable) if name[0] != "_")}
)


def rank_indices(num_samples: int, rank: int, world_size: int, equal_shares: bool = False) -> torch.Tensor:
    """Indices r, r + W, ... below num_samples for rank r of W; with `equal_shares`, every rank gets
    ceil(num_samples / W) of them (the last few may lie beyond num_samples), as all_gather needs equal shapes."""
    if equal_shares:
        return torch.arange(math.ceil(num_samples / world_size)) * world_size + rank
    return torch.arange(rank, num_samples, world_size)


def generate_batches(
    module: Sampleable,
    indices: torch.Tensor | range,
    *,
    sampler: Sampler,
    seed: int = 0,
    batch_size: int = SAMPLING_BATCH,
    progress: bool = False,
    labels: torch.Tensor | None = None,
) -> Generator[torch.Tensor, None, None]:
    """Samples with the given indices in model units, `batch_size` at a time, on the module's device: `sampler`
    (e.g. `module.sampler(options)`) run on the module's network in eval mode.

    labels: the labels of samples 0..N-1 (`diffusion.data.labels.class_labels`); sample i gets labels[i] (an index
    beyond N, a padding sample of `rank_indices`, gets labels[i % N]).
    """
    starts = range(0, len(indices), batch_size)
    with module.evaluating():
        for start in tqdm(starts, desc="batches", disable=not progress or len(starts) == 1):
            batch = torch.as_tensor(indices[start : start + batch_size])
            batch_labels = None if labels is None else labels[batch % len(labels)]
            x_T, noise = module.initial_noise(len(batch), seed, batch)
            steps = sampler(module.denoiser(len(batch), batch_labels), x_T, noise, progress)
            yield deque(steps, maxlen=1)[0].x  # the last step's x is the sample; no intermediate x_t is kept


def generate(
    module: Sampleable,
    num_samples: int,
    *,
    sampler: Sampler | None = None,
    seed: int = 0,
    batch_size: int = SAMPLING_BATCH,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = False,
    uint8_images: bool = False,
    labels: torch.Tensor | None = None,
    options: SamplingOptions | None = None,
) -> torch.Tensor:
    """This rank's equal share of `num_samples` samples (see `rank_indices`), on the CPU, in model units.

    sampler: a built sampler (`module.sampler(SamplingOptions(...))`); None draws with the module's own, the
        sampler its checkpoint names (`module.sampler()`, as `python -m diffusion.sample` without flags).
    labels: the class of each of the `num_samples` samples of a class-conditional model (`class_labels`).
    options: deprecated, the form before `sampler=` (`module.sampler(options)` is drawn with, and a
        DeprecationWarning says so).

    With world_size 1 that is simply samples 0..num_samples-1. With `uint8_images`, images come back as
    uint8 (N, C, H, W) in 0..255 (`render.compact`), each batch converted as it is drawn, so no more than one
    batch of float images is ever held; vectors stay float in model units (images holding NaN or infinity are
    then refused: `render.NonFiniteSamples`). Every argument is checked before any sampling
    (`generation.arguments`), `num_samples` also against the machine's memory, which must hold the result
    (`generate_in_chunks` streams more).
    """
    check_module(module, SAMPLEABLE_MEMBERS)
    check_model_can_sample(module)
    sampler = sampler_from_deprecated_options(module, sampler, options)
    num_samples, seed, batch_size, rank, world_size = checked_counts(
        num_samples, seed, batch_size, rank, world_size
    )
    check_sampler_and_switches(module, sampler, {"progress": progress, "uint8_images": uint8_images})
    check_result_fits_memory(num_samples, world_size, tuple(module.sample_shape), uint8_images)
    if sampler is None:  # the checkpoint's own, as the sample command's without flags
        sampler = own_sampling(module).sampler()  # type: ignore[union-attr]  # checked: it has one
    else:
        check_guidance_fits(module, sampler)
    labels = checked_labels(module, labels, num_samples)
    check_guidance_has_labels(module, sampler, labels)
    indices = rank_indices(num_samples, rank, world_size, equal_shares=True)
    batches = generate_batches(
        module, indices, sampler=sampler, seed=seed, batch_size=batch_size, progress=progress, labels=labels
    )
    if uint8_images:
        batches = (compact(batch, module.normalization) for batch in batches)
    return torch.cat([batch.cpu() for batch in batches])


def generate_in_chunks(
    module: Sampleable,
    num_samples: int,
    *,
    sampler: Sampler,
    seed: int = 0,
    batch_size: int = SAMPLING_BATCH,
    rank: int = 0,
    world_size: int = 1,
    all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: bool = False,
    labels: torch.Tensor | None = None,
    chunk_bytes: int | None = None,
) -> Iterator[torch.Tensor]:
    """Samples 0..num_samples-1 in index order, a chunk at a time, on every rank (CPU; images as uint8 (N, C, H,
    W), vectors as float in model units): what `SamplesWriter` writes as they come, so memory holds a chunk
    (about `chunk_bytes` a rank, CHUNK_BYTES by default, at least a batch), never all samples. With W ranks, each
    draws its share (`rank_indices`) and a chunk is gathered with `all_gather` (Fabric's; None for one process).

    Raises UserError, on every rank, as soon as a chunk holds a value that is not finite (NaN or infinity).
    """
    seed = checked_seed(seed)
    per_rank = math.ceil(num_samples / world_size)
    indices = range(rank, per_rank * world_size, world_size)  # `rank_indices` with equal shares, never built
    sample_bytes = math.prod(module.sample_shape) * (1 if len(module.sample_shape) == 3 else 4)
    chunk = max(1, (chunk_bytes or CHUNK_BYTES) // sample_bytes // batch_size) * batch_size
    batches = generate_batches(
        module, indices, sampler=sampler, seed=seed, batch_size=batch_size, progress=progress, labels=labels
    )
    pending: list[torch.Tensor] = []
    finite, done = True, 0
    try:
        for batch in batches:
            batch_finite = bool(torch.isfinite(batch).all())
            finite = finite and batch_finite
            # A batch refused at the chunk's end is made finite meanwhile (`compact` would refuse it on this rank
            # alone): every rank reaches the chunk's all_gather, and all stop together.
            pending.append(compact(batch if batch_finite else batch.nan_to_num(), module.normalization).cpu())
            done += len(batch)
            if done % chunk and done < per_rank:
                continue
            local, pending = torch.cat(pending), []
            # This chunk's samples across ranks: first .. first + W * len(local) - 1.
            first = (done - len(local)) * world_size
            flags = torch.tensor([finite])
            if all_gather is not None:  # every rank learns of a non-finite sample on any, and stops with it
                flags = all_gather(flags)
            if not bool(flags.all()):
                raise SamplesNotFinite(
                    f"sampling produced values that are not finite (NaN or infinity) among samples {first} to "
                    f"{min(first + len(local) * world_size, num_samples) - 1}; nothing was written",
                    "sample at {command:--precision} 32 (16-bit can overflow), with another {command:--sampler}, "
                    "or from an earlier checkpoint",
                )
            count = min(len(local) * world_size, num_samples - first)
            if all_gather is None:
                yield local[:count]
            else:
                yield gather_in_order(local, count, all_gather)
    finally:  # its progress bar closed before an error is printed
        batches.close()


def gather_in_order(
    local: torch.Tensor, num_samples: int, all_gather: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Every rank's `generate` share, gathered with `all_gather` ((world, per_rank, ...) on every rank) and
    put in sample-index order: (num_samples, ...) on the CPU, in `local`'s dtype (uint8 images from
    `generate(..., uint8_images=True)` gather 1 byte a value)."""
    gathered = all_gather(local)
    if gathered.ndim == local.ndim:  # one process: all_gather returns its input
        return local[:num_samples].cpu()
    # Rank r's j-th sample is sample j * world + r: transposing to (per_rank, world) puts sample i at row i.
    return gathered.transpose(0, 1).reshape(-1, *gathered.shape[2:])[:num_samples].cpu()


def sample_across_ranks(
    module: L.LightningModule,
    num_samples: int,
    seed: int,
    sampler: Sampler,
    labels: torch.Tensor | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """During training: `num_samples` samples by `sampler` split over all ranks and gathered in index order on
    every rank: images as uint8 (N, C, H, W) (`render.compact`), vectors as float in model units
    (`render.save_preview` takes both). `progress`: a bar over the sampler's steps (rank zero's is enough)."""
    world = module.trainer.world_size
    # The DiffusionModule (this layer names it by the Sampleable protocol, not by its class in training/). One
    # batch: its floats are held anyway; made uint8 here, after `drawn_anyway`, to be gathered.
    sampleable = cast(Sampleable, module)
    local = generate(sampleable, num_samples, sampler=sampler, seed=seed, batch_size=num_samples,
                     rank=module.global_rank, world_size=world, labels=labels, progress=progress)  # fmt: skip
    local = compact(drawn_anyway(local, "a sample grid"), sampleable.normalization)
    if world == 1:
        return local
    gather = cast(Callable[[torch.Tensor], torch.Tensor], module.all_gather)  # of one tensor: one tensor
    return gather_in_order(local.to(module.device), num_samples, gather)


def drawn_anyway(samples: torch.Tensor, what: str) -> torch.Tensor:
    """During training (a sample grid, a quality metric's samples): samples holding NaN or infinity, with a warning
    saying how many, made finite (NaN as 0, infinity as the largest float; clamped as pixels) rather than refused
    (`render.check_finite`): a preview is not worth ending a run for, and under DDP the rank that refused alone
    would leave the others waiting at the next collective. The weights' own NaN stops the run (checked before
    every validation)."""
    finite = torch.isfinite(samples)
    if bool(finite.all()):
        return samples
    count = int((~finite).flatten(1).any(1).sum())
    warnings.warn(
        f"{count} of the {len(samples)} samples of {what} hold values that are not finite (NaN or infinity), drawn "
        "clamped: the weights are finite, so a sampler's or 16-bit overflow is likely (sample in 32-bit precision)",
        stacklevel=2,
    )
    return samples.nan_to_num()
