"""The networks' checks of their constructor arguments and of the data's shape, raising the project's user errors of
the network's own options (`owner`): a Python caller reads the argument's name (`channels=8.5 must be a whole
number`), train.py the flag the user wrote. A count is never rounded (8.0 channels is refused, as the int flags
refuse it), and nothing reaches torch's layers to fail there with torch's words."""

import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from numbers import Integral, Real
from typing import Any, Literal

import torch

from diffusion.errors import (
    InvalidValue,
    OutOfRange,
    WrongType,
    check_fits_memory,
    check_whole_number,
    options_of,
    parameter_name,
    said,
)

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
        number = check_whole_number(name, value, fix=f"pass {{--{name}}} as an int")
    if minimum is not None and number < minimum:
        raise OutOfRange(name, value, requirement or f">= {minimum}", owner=owner)
    return number


def optional_whole(
    owner: type, name: str, value: Any, minimum: int, requirement: str | None = None
) -> int | None:
    """`whole`, or None for None (a setting that may be left unset)."""
    return None if value is None else whole(owner, name, value, minimum, requirement)


def whole_numbers(
    owner: type, name: str, values: Any, minimum: int, requirement: str, example: str, distinct: bool = False
) -> tuple[int, ...]:
    """`values` as a tuple of ints: WrongType unless a sequence of numbers (naming the item that is not one),
    OutOfRange (said as `requirement`) for a float (even 2.0: never rounded) or an item below `minimum`; `distinct`:
    InvalidValue for an item given twice (a set of levels: the repeat would be taken as once, without a word)."""
    fix = f"pass {{--{name}}} as a list of ints, e.g. {example}"
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise _of(owner, WrongType(name, values, "a sequence of ints", fix))
    items = tuple(values)
    for index, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, Integral | float):
            raise _of(owner, WrongType(f"{name}[{index}]", item, "a whole number", fix))
        if isinstance(item, float) or item < minimum:  # never rounded, even 2.0, as `whole` refuses 2.0
            raise OutOfRange(name, list(items), requirement, fix, owner)
    numbers = tuple(int(item) for item in items)
    repeated = next((item for item in numbers if numbers.count(item) > 1), None)
    if distinct and repeated is not None:
        times = numbers.count(repeated)
        raise InvalidValue(
            f"{{--{name}}} {list(numbers)} has level {repeated} {'twice' if times == 2 else f'{times} times'}",
            f"name each level once, e.g. {{--{name}}} {sorted(set(numbers))}",
            owner,
        )
    return numbers


def fraction(owner: type, name: str, value: Any) -> float:
    """`value` as a float in [0, 1): WrongType unless a number, OutOfRange outside (NaN too)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise _of(
            owner, WrongType(name, value, "a number in [0, 1)", f"pass {{--{name}}} as a float, e.g. 0.1")
        )
    number = float(value)
    if not 0.0 <= number < 1.0:
        raise OutOfRange(name, value, "in [0, 1)", owner=owner)
    return number


def check_weights_fit_memory(owner: type, name: str, value: int, weights: int, what: str = "its") -> None:
    """Refuse (OutOfRange of `owner`'s option `name`, the size that sets it) a network whose float32 `weights`
    (a count, or a lower bound of it: `what` says which) no memory of this machine holds, before torch's
    allocation error (or an overflow of its storage size) from inside a layer."""
    with options_of(owner):
        check_fits_memory(name, value, 4 * weights, f"{what} {weights:,} weights", f"pass a smaller {name}")


# Set while a DiffusionModule checks its `sample_shape` argument against its network (`sample_shape_given`): the
# sample shape's misfits are then said to a Python caller of that argument, not of "the data".
_SHAPE_ARGUMENT: ContextVar[bool] = ContextVar("shape_argument", default=False)


@contextmanager
def sample_shape_given() -> Iterator[None]:
    """The shape the block's checks are given is DiffusionModule's `sample_shape` argument (`SampleShapeMisfit`)."""
    token = _SHAPE_ARGUMENT.set(True)
    try:
        yield
    finally:
        _SHAPE_ARGUMENT.reset(token)


class SampleShapeMisfit(InvalidValue):
    """A sample shape that does not fit the network, said by who reads it. A command reads `problem` and `fix`, of
    the data: train.py sets DiffusionModule's sample_shape from the data module (its flags' image size, its
    channels). A Python caller of DiffusionModule passed `sample_shape` itself, and reads `argument` (a problem and
    a fix naming it), where the shape was given as that argument (`sample_shape_given`)."""

    def __init__(self, problem: str, fix: str, owner: type, argument: tuple[str, str]) -> None:
        self.argument = argument if _SHAPE_ARGUMENT.get() else None  # set before UserError says it
        super().__init__(problem, fix, owner)

    def said(self, flag: Callable[[type | str | None, str], str]) -> str:
        if flag is parameter_name and self.argument is not None:
            return said(" — ".join(self.argument), flag, self.owner)
        return super().said(flag)


def check_sample_shape(
    owner: type, shape: Sequence[int], kind: Literal["vectors", "images"], width: int
) -> None:
    """One sample of `shape` is of `kind`, `width` its features (D,) or channels (C, H, W); else InvalidValue
    saying which network fits (a network for the other kind of data failed at the first step)."""
    shape, name = tuple(shape), owner.__name__
    rank, other, other_rank = (1, "images", 3) if kind == "vectors" else (3, "vectors", 1)
    fits = f"({width},)" if rank == 1 else f"({width}, H, W)"
    if len(shape) != rank:
        theirs, takes = len(shape) == other_rank, (width,) if rank == 1 else f"({width}, H, W)"
        network = NETWORK_FOR[other] if theirs else "a network for its shape"
        raise SampleShapeMisfit(
            f"{name} is for {kind} of shape {takes}, and the data's samples have shape {shape}"
            + (f" ({other})" if theirs else ""),
            f"train {other if theirs else 'this data'} with {network}",
            owner,
            (
                f"{name} is for {kind} of shape {takes}, and sample_shape={shape}"
                + (f" is of {other}" if theirs else ""),
                f"pass sample_shape={fits} for this network, or train samples of shape {shape} with {network}",
            ),
        )
    # (H, W, C), NumPy's and PIL's layout, of square images: (3, 8, 8) for 8 channels is no such thing
    if rank == 3 and shape[0] == shape[1] != width and shape[-1] == width:
        raise SampleShapeMisfit(
            f"{name} is for images of {width} channel{'s' * (width != 1)}, (C, H, W), and the data's samples of "
            f"shape {shape} look channels-last, (H, W, C)",
            "put the channels first: x.permute(2, 0, 1) for an image (x.permute(0, 3, 1, 2) for a batch of them)",
            owner,
            (
                f"{name} is for images of {width} channel{'s' * (width != 1)}, (C, H, W), and sample_shape={shape} "
                "looks channels-last, (H, W, C)",
                f"pass sample_shape={(width, *shape[:2])}, the images' channels first",
            ),
        )
    if shape[0] != width:
        unit = "features" if rank == 1 else f"channel{'s' * (width != 1)}"
        raise SampleShapeMisfit(
            f"{name} is for {kind} of {width} {unit}, and the data's samples have {shape[0]}"
            + ("" if rank == 1 else f" (shape {shape})"),
            f"build it with {{--in_channels}} {shape[0]} (train.py sets it from the data)",
            owner,
            (
                f"{name} is for {kind} of {width} {unit}, and sample_shape={shape} has {shape[0]}",
                f"pass sample_shape={fits} for this network, or build it with {{--in_channels}}={shape[0]}",
            ),
        )


def check_size_divisible(owner: type, shape: Sequence[int], num_levels: int) -> None:
    """A UNet's image size (H, W of `shape`) divisible by 2**(levels - 1), each level halving it: InvalidValue."""
    factor = 2 ** (num_levels - 1)
    height, width = shape[-2:]
    if height % factor != 0 or width % factor != 0:
        levels = f"= 2**(levels - 1) for the {num_levels} levels of {{--channel_mult}}"
        raise SampleShapeMisfit(
            f"image size {height}x{width} ({{LightningDataModule:--image_size}}) is not divisible by {factor} "
            + levels,
            f"pick an image size divisible by {factor} ({{LightningDataModule:--image_size}}), or fewer "
            "levels in {--channel_mult}",
            owner,
            (
                f"sample_shape={tuple(shape)} has an image size {height}x{width} not divisible by {factor} "
                + levels,
                f"pass a sample_shape whose height and width are divisible by {factor}, or build the network "
                "with fewer levels in {--channel_mult}",
            ),
        )


def forward_parameters(network: type) -> str | None:
    """None when `network` (a torch.nn.Module class) keeps the networks' call, `forward(x, t)` (and `y`, the labels,
    for class-conditional data: `diffusion.core.guidance.call_network`); else what its forward takes, `(input)`:
    a module of another kind (`torch.nn.Linear`) failed at the first step with torch's TypeError. A forward whose
    signature cannot be read is taken as it is."""
    forward = getattr(network, "forward", None)
    if forward is None or forward is torch.nn.Module.forward:  # none of its own: torch's NotImplementedError
        return "nothing (it defines no forward)"
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None, "x", "t")  # as an unbound method: `self` first
    except TypeError:
        parameters = list(signature.parameters)[1:]
        return f"({', '.join(parameters)})"
    return None


def _of(owner: type, error: WrongType) -> WrongType:
    error.owner = owner
    return error
