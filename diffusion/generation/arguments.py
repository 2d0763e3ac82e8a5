"""`generate`'s arguments, checked as the sample command checks its flags: each refused by the name the caller wrote,
with its fix, before any sampling time is spent; nothing rounded, cycled or ignored without a word (a fraction of a
sample, fewer labels than samples, guidance asked of a model without classes).

`options=SamplingOptions(...)`, the form before `sampler=` took a built sampler, keeps working for a while with a
DeprecationWarning that names the new form, and draws the same samples.
"""

import inspect
import math
import warnings
from collections.abc import Iterable
from os import PathLike
from typing import Any

import torch

from diffusion.core.guidance import guidance_is_the_models, labels_unlearnt
from diffusion.core.samplers.contract import Sampler
from diffusion.core.sampling import (
    ModelSampling,
    SamplingOptions,
    check_options,
    guidance_unlearnt,
    guidance_without_labels,
    unconditional_guidance,
)
from diffusion.errors import GIB, InvalidValue, OutOfRange, WrongType, check_whole_number, machine_memory

OPTIONS_DEPRECATED = "generate(module, n, options=...) is deprecated; pass sampler=module.sampler(options)"


def own_sampling(module: Any) -> ModelSampling | None:
    """What a module says of its own sampling (a DiffusionModule's `model_sampling`), or None when it says nothing:
    its default sampler, and whether it has classes."""
    found = getattr(module, "model_sampling", None)
    return found if isinstance(found, ModelSampling) else None


def check_module(module: Any, members: Iterable[str]) -> None:
    """A model where `module` goes, one with all of `members` (Sampleable's): a path is the commonest slip (load it
    first). The members are looked up without running them (a module's `normalization` raises when it has none,
    which is no reason to call it no model)."""
    if isinstance(module, str | PathLike):
        raise WrongType(
            "module", module, "a model", f"load it first: generate(load_checkpoint({str(module)!r}), ...)"
        )
    if not all(_has(module, member) for member in members):
        raise WrongType(
            "module", module, "a model (a DiffusionModule, or any Sampleable)",
            "pass what load_checkpoint returns, or the DiffusionModule being trained",
        )  # fmt: skip


def _has(thing: Any, member: str) -> bool:
    try:
        inspect.getattr_static(thing, member)
    except AttributeError:
        return False
    return True


def check_model_can_sample(module: Any) -> None:
    """A module whose weights and noise schedule can be sampled with, refused before any sampling otherwise:
    its weights hold values, all finite (not on the meta device, no NaN or infinity: `check_weights_readable`);
    its noise schedule's coefficients are float32 and finite; its weights are not 16-bit, as sampling draws its
    noise and runs the schedule in float32: one converted with `.half()` or `.to(torch.bfloat16)` ended in torch's
    dtype error at its first layer, and its schedule's coefficients are rounded too (a tiny model's
    `.half().float()` then sampled NaN). 16-bit speed is the network's alone, under autocast
    (`diffusion.generation.precision.network_precision`, the sample command's --precision). A bare `Sampleable`
    (not a torch module) is its own to check."""
    if not isinstance(module, torch.nn.Module):
        return  # a bare Sampleable: its tensors are its own to type
    check_weights_readable(module)
    # The schedule's buffers (float32, whatever its network holds) say a conversion of the whole module; the weights
    # in 16 bits, one of its network alone. A network may keep float64 tensors of its own and cast its inputs.
    schedule = getattr(module, "schedule", None)
    coefficients = dict(schedule.named_buffers()) if isinstance(schedule, torch.nn.Module) else {}
    coefficients = {name: t for name, t in coefficients.items() if t.is_floating_point()}
    converted = [t.dtype for t in coefficients.values() if t.dtype != torch.float32]
    converted += [p.dtype for p in module.parameters() if p.dtype in (torch.float16, torch.bfloat16)]
    # At zero terminal SNR (alpha_bar_T = 0) 1 / sqrt(alpha_bar_T) is +inf by right, at the last timestep only.
    ends_at_zero = bool(getattr(schedule, "zero_terminal_snr", False))
    broken = [name for name, t in coefficients.items() if not schedule_values_fine(t, ends_at_zero)]
    if broken and not converted:  # `.half().float()`: the schedule's rounded coefficients overflowed to inf
        raise InvalidValue(
            f"module's noise schedule holds inf or NaN ({broken[0]}): its coefficients were rounded by a conversion "
            "to 16 bits and back (.half().float()), or edited, and every sample would be NaN",
            "load or build the model again in float32 (load_checkpoint(path), or DiffusionModule(...))",
        )
    found = converted[0] if converted else None
    if found is not None:
        name = str(found).removeprefix("torch.")
        method = {torch.float16: ".half()", torch.bfloat16: ".bfloat16()", torch.float64: ".double()"}
        raise InvalidValue(
            f"module is in {name} (converted with {method.get(found, f'.to(torch.{name})')})"
            ", and sampling takes a float32 model: it draws the noise and runs the noise schedule in float32",
            "load or build the model again in float32 (module.float() would not restore the schedule's digits "
            "the conversion rounded off); for 16-bit speed run the network alone under autocast: with "
            "diffusion.generation.precision.network_precision(module, 'bf16-mixed'): generate(module, ...)",
        )


def schedule_values_fine(values: torch.Tensor, ends_at_zero: bool) -> bool:
    """Whether a schedule's coefficients are finite, but for a +inf at its last timestep when it `ends_at_zero`."""
    if ends_at_zero and values.ndim == 1 and len(values):
        return bool(values[:-1].isfinite().all()) and not bool(values[-1].isnan() or values[-1] == -math.inf)
    return bool(values.isfinite().all())


def check_weights_readable(module: torch.nn.Module) -> None:
    """A module whose weights hold values, all finite (`check_model_can_sample`'s first step): one moved to the meta
    device ended in torch's NotImplementedError, and one whose weights are NaN (a diverged run's checkpoint)
    sampled NaN without a word. One pass over the weights, one device sync: little beside any sampling."""
    parameters = dict(module.named_parameters())
    on_meta = next((name for name, p in parameters.items() if p.is_meta), None)
    if on_meta is not None:
        raise InvalidValue(
            f"module is on the meta device ({on_meta}), whose tensors hold no values to sample with",
            "load the checkpoint onto the CPU or a GPU: load_checkpoint(path) (or map_location='cuda')",
        )
    if not parameters:
        return
    device = next(iter(parameters.values())).device
    finite = torch.stack([p.detach().isfinite().all().to(device) for p in parameters.values()])
    if not bool(finite.all()):
        first = list(parameters)[int((~finite).nonzero()[0, 0])]
        raise InvalidValue(
            f"module's weights hold NaN or infinity (first {first}): a diverged run's checkpoint?",
            "load an earlier checkpoint of the run, or its other weights (load_checkpoint(path, weights='ema' "
            "or 'raw')), and look at the training's loss",
        )


def sampler_from_deprecated_options(module: Any, sampler: Sampler | None, options: Any) -> Sampler | None:
    """The sampler of the deprecated `options=` (with a warning naming the new form), else `sampler` as given."""
    if options is None:
        return sampler
    warnings.warn(OPTIONS_DEPRECATED, DeprecationWarning, stacklevel=3)
    if sampler is not None:
        raise TypeError(
            "generate() got both sampler= and options= — pass sampler= alone: sampler=module.sampler(options)"
        )
    check_options(options, "options", "options=SamplingOptions(...)")
    sampling = own_sampling(module)
    if sampling is None:
        raise WrongType("module", module, "a model with its own sampling options", "pass sampler= instead")
    return sampling.sampler(options)


SEED_LIMIT = 2**64  # torch takes a seed modulo 2**64 (-1 is 2**64 - 1), and so does the counter-based noise


def checked_seed(seed: Any, draws: str = "sample i's noise is a function of (seed, i)") -> int:
    """`seed` as an int, refused unless a whole number in [0, 2**64): torch and the per-sample noise take a seed
    modulo 2**64, so a larger one (or a negative one) would draw the samples of another seed without a word.
    `draws`: what the seed draws, said in the fix."""
    fix = f"pass a seed from 0 to {SEED_LIMIT - 1}: {draws}"
    number = check_whole_number("seed", seed, fix=fix)
    if not 0 <= number < SEED_LIMIT:
        raise OutOfRange("seed", seed, "a whole number in [0, 2**64 - 1]", fix)
    return number


def checked_counts(
    num_samples: Any, seed: Any, batch_size: Any, rank: Any, world_size: Any
) -> tuple[int, int, int, int, int]:
    """`generate`'s counts as ints (a numpy integer too), refused unless each is a whole number in its range."""
    counts = (
        check_whole_number(
            "num_samples", num_samples, 1, "pass how many samples to draw, e.g. generate(module, 64)"
        ),
        checked_seed(seed),
        check_whole_number("batch_size", batch_size, 1, "pass how many samples to draw at once"),
        check_whole_number("rank", rank, 0, "pass this process's rank, 0..world_size-1"),
        check_whole_number("world_size", world_size, 1, "pass the number of ranks sampling together"),
    )
    if counts[3] >= counts[4]:
        raise OutOfRange(
            "rank", rank, f"< world_size={world_size}", "pass this process's rank, 0..world_size-1"
        )
    return counts


def check_result_fits_memory(
    num_samples: int, world_size: int, sample_shape: tuple[int, ...], uint8_images: bool
) -> None:
    """`generate` returns this rank's share in one tensor: refused, before any sampling, when that tensor alone
    would take more than the machine's memory (uint8 images 1 byte a value, anything else float32's 4), which
    would end in torch's allocation error after the time spent sampling, or in the indices' before any."""
    total = machine_memory()
    per_rank = math.ceil(num_samples / world_size)
    needed = per_rank * math.prod(sample_shape) * (1 if uint8_images and len(sample_shape) == 3 else 4)
    if total is not None and needed > total:
        share = "" if world_size == 1 else f" (this rank's {per_rank} of {world_size} ranks' shares)"
        raise InvalidValue(
            f"num_samples={num_samples}: generate returns the samples{share} in one tensor of "
            f"{needed / GIB:,.1f} GiB, more than this machine's {total / GIB:,.1f} GiB of memory",
            "draw them a chunk at a time with generate_in_chunks(module, num_samples, sampler=...) (what the "
            "sample command does), or pass fewer num_samples",
        )


def check_sampler_and_switches(module: Any, sampler: Any, switches: dict[str, Any]) -> None:
    """A built sampler, or None for a module that names its own; True or False for each switch."""
    if sampler is None and own_sampling(module) is None:
        raise WrongType(
            "sampler", sampler, "a sampler (this module names no sampler of its own)",
            "pass one: sampler=SAMPLERS['ddim'](steps=50)",
        )  # fmt: skip
    if sampler is not None and not isinstance(sampler, Sampler):
        if isinstance(sampler, SamplingOptions):
            fix = "build it for the model: sampler=module.sampler(options)"
        elif isinstance(sampler, str):
            fix = f"build one: sampler=module.sampler(SamplingOptions(sampler={sampler!r}))"
        else:
            fix = "pass module.sampler(SamplingOptions(...)), or leave it unset for the model's own"
        raise WrongType("sampler", sampler, "a sampler", fix)
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise WrongType(name, value, "True or False", f"pass {name}=True or {name}=False")


def check_guidance_fits(module: Any, sampler: Sampler) -> None:
    """Guidance of a model without classes would be ignored, and one trained with label_dropout 0 never learnt the
    unconditional prediction it takes: refused, as the sample command refuses them (in the sampler the caller
    built; the module's own is its checkpoint's to answer for)."""
    sampling = own_sampling(module)
    if sampling is not None and not sampling.conditional and sampler.guidance_scale != 1:
        raise unconditional_guidance(sampler.guidance_scale)
    # a sampler built by hand: module.sampler refuses it too
    if sampling is not None and sampling.label_dropout == 0 and sampler.guidance_scale != 1:
        raise guidance_unlearnt(sampler.guidance_scale)


def check_guidance_has_labels(module: Any, sampler: Sampler, labels: torch.Tensor | None) -> None:
    """Guidance (a scale but 0 and 1) by the sampler the caller built, of a conditional model, without labels: every
    sample has none, so both halves are the unconditional prediction and the samples are guidance 0's at twice its
    cost. Refused; the model's own scale (its checkpoint's, in a sampler `module.sampler()` built without a scale of
    the caller's) samples unconditionally as ever, and a sampler the caller built with that same scale is refused."""
    scale, sampling = getattr(sampler, "guidance_scale", 1), own_sampling(module)
    classes = getattr(module, "num_classes", None)
    if labels is not None or scale in (0, 1) or (sampling is None and classes is None):
        return
    if sampling is not None and (not sampling.conditional or guidance_is_the_models(sampler)):
        return
    raise guidance_without_labels(
        scale, f"labels=class_labels(num_samples, {classes or 'N'}), one class per sample",
        "or build the sampler without guidance_scale (0 for unconditional samples)",
    )  # fmt: skip


def checked_labels(module: Any, labels: Any, num_samples: int) -> torch.Tensor | None:
    """The labels as an int64 tensor, one whole number per sample: never truncated from fractions, never cycled
    when too few; refused for a model without classes. Their range is the module's to check (its `denoiser`)."""
    if labels is None:
        return None
    sampling = own_sampling(module)
    if sampling is not None and not sampling.conditional:
        raise OutOfRange(
            "labels", labels if isinstance(labels, list | tuple) and len(labels) <= 6 else "<labels>",
            "unset for an unconditional model (it has no classes)",
            "leave labels unset, or load a class-conditional checkpoint",
        )  # fmt: skip
    fix = "pass class_labels(num_samples, module.num_classes), or one int class per sample"
    if isinstance(labels, str | bytes) or not hasattr(labels, "__len__"):
        raise WrongType("labels", labels, "a sequence of class numbers", fix)
    try:
        tensor = torch.as_tensor(labels)
    except (TypeError, ValueError, RuntimeError) as error:
        raise WrongType("labels", labels, "a sequence of class numbers", fix) from error
    try:  # read here, on the CPU: a tensor on the meta device has a shape and no values
        tensor = tensor.cpu()
    except (RuntimeError, NotImplementedError) as error:
        raise InvalidValue(
            f"labels is a tensor on the {tensor.device} device, whose values cannot be read",
            f"{fix}, on the CPU",
        ) from error
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        if tensor.dtype.is_floating_point and bool((tensor == tensor.round()).all()):
            raise WrongType("labels", labels, "integers (they are stored as floats)", f"{fix}, as ints")
        raise OutOfRange("labels", _shown(tensor), "whole numbers (class indices)", fix)
    if tensor.shape != (num_samples,):
        raise OutOfRange(
            "labels", f"<{tuple(tensor.shape)} labels>", f"one label per sample, shape ({num_samples},)", fix
        )
    if sampling is not None and getattr(module, "num_classes", None) is not None:  # as guidance is refused
        labels_unlearnt(tensor, module.num_classes, sampling.label_dropout)
    return tensor.long()


def _shown(tensor: torch.Tensor) -> str:
    values = tensor.flatten()[:6].tolist()
    return f"{values}" if tensor.numel() <= 6 else f"{values[:-1]}, ... ({tensor.numel()} values)"
