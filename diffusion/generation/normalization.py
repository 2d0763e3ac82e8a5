"""The normalization that maps samples from model units to data units ({"shift": [...], "scale": [...]}: data =
model * scale + shift, per channel or per feature), checked where it is given: exactly those keys, every shift
finite and every scale finite and > 0. Moved out of `diffusion.generation.render`, which re-exports
`check_normalization` for its callers."""

from collections.abc import Mapping

import torch

from diffusion.core.noise import WrongDtype
from diffusion.errors import InvalidValue, OutOfRange, WrongType


def check_samples_and_normalization(x: object, normalization: object) -> None:
    """Samples as a tensor, and the normalization as the module's (a dict of per-channel `shift` and `scale`)."""
    if not isinstance(x, torch.Tensor):
        raise WrongType(
            "x", x, "a tensor of samples", "pass what generate returns (torch.as_tensor(x) for arrays)"
        )
    # A bool's or an int's values are no model units (and an int tensor truncated a scale of 0.5 to 0)
    if not x.is_floating_point():
        raise WrongDtype(
            "x", x, "a floating-point tensor of samples in model units",
            "pass what generate returns (float); uint8 images are pixels already",
        )  # fmt: skip
    if not isinstance(normalization, Mapping):
        raise WrongType(
            "normalization", normalization, "a dict of 'shift' and 'scale'", "pass module.normalization"
        )
    check_normalization_keys(normalization, "normalization", "pass module.normalization")


def check_normalization_keys(normalization: Mapping, name: str, fix: str) -> None:
    """Exactly the keys `shift` and `scale`: a missing one named (a dict of a typo was said to be "a dict, not a
    dict of 'shift' and 'scale'"), and any other key refused, naming it, rather than ignored ('offset', a second
    shift misspelt)."""
    missing = [key for key in ("shift", "scale") if key not in normalization]
    unknown = [repr(key) for key in normalization if key not in ("shift", "scale")]
    clauses = ["no " + " and no ".join(missing)] if missing else []
    if unknown:
        clauses.append(f"keys other than shift and scale ({', '.join(unknown)})")
    if clauses:
        raise InvalidValue(f"{name} has {', and '.join(clauses)}", fix)


NORMALIZATION_FIX = (
    "pass module.normalization of a trained model (the data module's: data = model * scale + shift, per "
    "channel)"
)


def check_normalization(
    normalization: Mapping, name: str = "normalization", fix: str = NORMALIZATION_FIX
) -> dict[str, list[float]]:
    """Every `shift` a finite number and every `scale` a finite number > 0: a scale of 0 made every image one colour,
    NaN or infinity NaN images, a negative one inverted images (white drawn black), without a word; no data
    module gives one (images' is 0.5, vectors' a spread). `name`: how the message names the mapping. Returned as
    plain lists of floats (what a checkpoint stores), from lists, tuples, tensors or numpy arrays alike."""
    check_normalization_keys(normalization, name, fix)
    plain: dict[str, list[float]] = {}
    for key in ("shift", "scale"):
        given = normalization[key]
        try:
            values = torch.as_tensor(given, dtype=torch.float64).flatten().cpu()
        except (TypeError, ValueError, RuntimeError) as error:  # text, nested lists of other lengths, None
            raise WrongType(f"{name}[{key!r}]", given, "a list of numbers, one per channel", fix) from error
        bad = ~torch.isfinite(values)
        if key == "scale":
            bad |= values <= 0
        if bool(bad.any()):
            index = int(bad.nonzero()[0, 0])
            value, requirement = float(values[index]), "a finite number"
            if key == "scale":  # 0, NaN and infinity said as before; a negative scale in its own words
                negative = value < 0
                requirement = (
                    "> 0 (a negative one inverts every sample)" if negative else f"{requirement} other than 0"
                )
            raise OutOfRange(f"{name}[{key!r}][{index}]", value, requirement, fix)
        plain[key] = values.tolist()
    return plain
