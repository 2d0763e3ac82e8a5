"""The networks' checks of their constructor arguments and of the data's shape, raising the project's user errors of
the network's own options (`owner`): a Python caller reads the argument's name (`channels=8.5 must be a whole
number`), train.py the flag the user wrote. A count is never rounded (8.0 channels is refused, as the int flags
refuse it), and nothing reaches torch's layers to fail there with torch's words."""

from collections.abc import Iterable, Sequence
from numbers import Integral, Real
from typing import Any

from diffusion.errors import InvalidValue, OutOfRange, WrongType, check_whole_number, options_of

CLASSES = ">= 1 (or None for an unconditional network)"  # a network's num_classes, as ClassEmbedding says it
# Which network fits which data: the fix of a network given data of the other kind.
NETWORK_FOR = {
    "images": "a UNet ({DiffusionModule:--network} diffusion.models.UNet)",
    "vectors": "an MLP ({DiffusionModule:--network} diffusion.models.MLP)",
}


def whole(
    owner: type, name: str, value: Any, minimum: int | None = None, requirement: str | None = None
) -> int:
    """`value` as an int: WrongType unless a number, OutOfRange for a fraction or one below `minimum` (said as
    `>= minimum`, or `requirement`), each of `owner`'s option `name`."""
    with options_of(owner):
        number = check_whole_number(name, value, fix=f"pass {name} as an int")
    if minimum is not None and number < minimum:
        raise OutOfRange(name, value, requirement or f">= {minimum}", owner=owner)
    return number


def optional_whole(
    owner: type, name: str, value: Any, minimum: int, requirement: str | None = None
) -> int | None:
    """`whole`, or None for None (a setting that may be left unset)."""
    return None if value is None else whole(owner, name, value, minimum, requirement)


def whole_numbers(
    owner: type, name: str, values: Any, minimum: int, requirement: str, example: str
) -> tuple[int, ...]:
    """`values` as a tuple of ints: WrongType unless a sequence of numbers (naming the item that is not one),
    OutOfRange (said as `requirement`) for a float (even 2.0: never rounded) or an item below `minimum`."""
    fix = f"pass {name} as a list of ints, e.g. {example}"
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise _of(owner, WrongType(name, values, "a sequence of ints", fix))
    items = tuple(values)
    for index, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, Integral | float):
            raise _of(owner, WrongType(f"{name}[{index}]", item, "a whole number", fix))
        if isinstance(item, float) or item < minimum:  # never rounded, even 2.0, as `whole` refuses 2.0
            raise OutOfRange(name, list(items), requirement, fix, owner)
    return tuple(int(item) for item in items)


def fraction(owner: type, name: str, value: Any) -> float:
    """`value` as a float in [0, 1): WrongType unless a number, OutOfRange outside (NaN too)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise _of(owner, WrongType(name, value, "a number in [0, 1)", f"pass {name} as a float, e.g. 0.1"))
    number = float(value)
    if not 0.0 <= number < 1.0:
        raise OutOfRange(name, value, "in [0, 1)", owner=owner)
    return number


def check_vector_shape(owner: type, shape: Sequence[int], width: int) -> None:
    """One sample of `shape` is a vector of `width` features (D,), or InvalidValue saying which network fits."""
    shape = tuple(shape)
    name = owner.__name__
    if len(shape) != 1:
        raise InvalidValue(
            f"{name} is for vectors of shape ({width},), and the data's samples have shape {shape}"
            + (" (images)" if len(shape) == 3 else ""),
            f"train {'images' if len(shape) == 3 else 'this data'} with "
            + (NETWORK_FOR["images"] if len(shape) == 3 else "a network for its shape"),
            owner,
        )
    if shape[0] != width:
        raise InvalidValue(
            f"{name} is for vectors of {width} features, and the data's samples have {shape[0]}",
            f"build it with {{--in_channels}} {shape[0]} (train.py sets it from the data)",
            owner,
        )


def check_image_shape(owner: type, shape: Sequence[int], channels: int) -> None:
    """One sample of `shape` is an image of `channels` channels (C, H, W), or InvalidValue saying which network
    fits."""
    shape = tuple(shape)
    name = owner.__name__
    if len(shape) != 3:
        raise InvalidValue(
            f"{name} is for images of shape ({channels}, H, W), and the data's samples have shape {shape}"
            + (" (vectors)" if len(shape) == 1 else ""),
            f"train {'vectors' if len(shape) == 1 else 'this data'} with "
            + (NETWORK_FOR["vectors"] if len(shape) == 1 else "a network for its shape"),
            owner,
        )
    if shape[0] != channels:
        raise InvalidValue(
            f"{name} is for images of {channels} channel{'s' * (channels != 1)}, and the data's samples have "
            f"{shape[0]} (shape {shape})",
            f"build it with {{--in_channels}} {shape[0]} (train.py sets it from the data)",
            owner,
        )


def _of(owner: type, error: WrongType) -> WrongType:
    error.owner = owner
    return error
