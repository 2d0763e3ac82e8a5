"""Classifier-free guidance (Ho & Salimans 2022): the "no label" class and the guided network output that every
sampler calls.

`NO_LABEL` marks a sample without a class: unlabelled data, labels dropped in training so the network also learns
the unconditional model, and the unconditional half of a guided forward. The networks' class embeddings give it
a row of its own.
"""

import weakref
from typing import Any

import torch
from torch import nn

from diffusion.errors import InvalidValue, OutOfRange

NO_LABEL = -1


def call_network(
    network: nn.Module, x_t: torch.Tensor, t: torch.Tensor, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """`network(x_t, t[, labels])`: a network without classes is called as `model(x_t, t)`, so any keeps working."""
    return network(x_t, t) if labels is None else network(x_t, t, labels)


def guided_output(
    model: nn.Module,
    x: torch.Tensor,
    t: torch.Tensor,
    labels: torch.Tensor | None,
    guidance_scale: float = 1.0,
    learned_variance: bool = False,
) -> torch.Tensor:
    """The network output at (x, t), float32, with classifier-free guidance (Ho & Salimans 2022, Eq. 6):
    out = out_uncond + s (out_cond - out_uncond), both halves from one forward of the doubled batch.

    The output is guided in the space the network predicts (eps, x0 or v). Each of them is an affine function of
    eps at a fixed (x_t, t) with the same coefficients for both halves, so this is exactly eps-space guidance
    (`eps_uncond + s (eps_cond - eps_uncond)`) for every prediction type, and no conversion is needed.
    s = 1 and s = 0 need only one half: the conditional or the unconditional output (NO_LABEL).

    learned_variance: the output is 2C channels, the prediction then the variance's v
    (`diffusion.core.variance`). Only the prediction is guided; v is the conditional half's, as the
    classifier-free sampling of GLIDE (Nichol et al. 2022, built on improved-/guided-diffusion) does: the
    guided mean has no variance of its own, and the conditional one models the class being drawn.
    """
    if labels is None or guidance_scale == 1:
        return as_float(call_network(model, x, t, labels))
    unconditional = torch.full_like(labels, NO_LABEL)
    if guidance_scale == 0:
        return as_float(model(x, t, unconditional))
    both = as_float(
        model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([labels, unconditional]))
    )  # (2B, ...)
    conditional, unconditional_output = both.chunk(2)
    guided = unconditional_output + guidance_scale * (conditional - unconditional_output)
    if learned_variance:
        channels = x.shape[1]
        guided = torch.cat([guided[:, :channels], conditional[:, channels:]], dim=1)
    return guided


def as_float(output: object) -> torch.Tensor:
    """The network's output in float32, refused by name where it is no tensor (a tuple, a dict of outputs)."""
    if not isinstance(output, torch.Tensor):
        raise InvalidValue(
            f"the network returned a {type(output).__name__}, not a tensor of x_t's shape",
            "make model(x_t, t) return the prediction itself, one tensor of x_t's shape",
        )
    return output.float()


def labels_unlearnt(labels: torch.Tensor | None, num_classes: int, label_dropout: Any) -> None:
    """Refuse labels that ask a class-conditional model trained with label_dropout 0 for its unconditional
    prediction, which it never learnt (its "no label" row was never trained): None (every sample without a label)
    or NO_LABEL (-1) for some; as guidance, which takes that prediction too, is refused (`guidance_unlearnt`)."""
    if label_dropout != 0:
        return
    fix = f"pass a class 0..{num_classes - 1} for every sample (class_labels(n, module.num_classes): each in turn)"
    unlearnt = (
        "the unconditional prediction, which this model never learnt (it was trained with label_dropout 0)"
    )
    if labels is None:
        raise InvalidValue(
            "labels is unset: every sample would take the unconditional prediction, which this model never learnt "
            "(it was trained with label_dropout 0)",
            f"{fix}, or train with label_dropout 0.1-0.2",
        )
    unlabelled = int((labels == NO_LABEL).sum())
    if unlabelled:
        raise InvalidValue(
            f"labels holds {NO_LABEL} (no label) for {unlabelled} of the {len(labels)} samples: {unlearnt}",
            f"{fix}, or train with label_dropout 0.1-0.2",
        )


def unconditional_guidance(scale: float) -> OutOfRange:
    """Guidance asked of a model without classes, which would be ignored: refused, as `--guidance_scale` is."""
    return OutOfRange(
        "guidance_scale", scale, "unset (or 1) for an unconditional model (it has no classes to guide towards)",
        "leave guidance_scale unset, or load a class-conditional checkpoint",
    )  # fmt: skip


def guidance_unlearnt(scale: float, name: str = "guidance_scale", owner: type | None = None) -> InvalidValue:
    """Guidance (or unconditional sampling, 0) of a conditional model trained with label_dropout 0, which never
    learnt the unconditional prediction it takes (its "no label" row was never trained)."""
    return InvalidValue(
        f"{{--{name}}} {scale:g} asks for the unconditional prediction, which this model never learnt "
        "(it was trained with {DiffusionModule:--label_dropout} 0)",
        f"sample with {{--{name}}} 1 (or unset), or train with {{DiffusionModule:--label_dropout}} 0.1-0.2", owner,
    )  # fmt: skip


def guidance_without_labels(scale: float, labels: str, unset: str) -> InvalidValue:
    """Guidance (any scale but 1, and 0: unconditional) where no sample has a label: each would take the unconditional
    prediction for both halves, the samples of guidance_scale 0 at twice its cost, without a word."""
    return InvalidValue(
        f"guidance_scale={scale} guides each sample towards its label, and labels is unset",
        f"pass {labels}, {unset}",
    )


# The samplers a model built whose guidance scale is its own default (no option of the caller's set it), by id: a
# model's own guidance, asked without labels, samples unconditionally as it always did (the sample command without
# --class_label), while a sampler the caller built (by hand, or with `guidance_scale=`) guides, and needs labels,
# whatever its scale. By identity, not equality: a caller's sampler equal to the model's own is still the caller's.
_MODELS_OWN_GUIDANCE: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def mark_models_own_guidance(sampler: Any) -> None:
    """`sampler`'s guidance scale is its model's default (`ModelSampling.sampler` without a caller's scale)."""
    _MODELS_OWN_GUIDANCE[id(sampler)] = sampler


def guidance_is_the_models(sampler: Any) -> bool:
    """Whether `sampler` is one its model built with its own default guidance (`mark_models_own_guidance`)."""
    return _MODELS_OWN_GUIDANCE.get(id(sampler)) is sampler
