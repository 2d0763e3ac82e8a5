"""Sampling options given as a dict (a module's `sampling`, as a checkpoint stores it), read as `SamplingOptions`
with a key that is no option said by name, with the option it is closest to and every option there is."""

from collections.abc import Mapping
from dataclasses import fields
from difflib import get_close_matches
from typing import Any

from diffusion.core.sampling import SamplingOptions
from diffusion.errors import UserError


class UnknownSamplingOption(UserError, TypeError):
    """A key of a dict of sampling options that is no field of SamplingOptions: a TypeError, as Python's own."""


def sampling_options_from(values: Any, name: str) -> Any:
    """`values` as SamplingOptions where it is a dict of its fields; anything else as it is (SamplingOptions, or
    what its users refuse by kind: `check_options`). A key that is no field is refused naming `name`, the key,
    the field it is closest to and every field: `SamplingOptions(**values)` said only "unexpected keyword
    argument 'step'"."""
    if not isinstance(values, Mapping):
        return values
    known = [option.name for option in fields(SamplingOptions)]
    unknown = [key for key in values if key not in known]
    if unknown:
        key, close = unknown[0], get_close_matches(str(unknown[0]), known, n=1)
        raise UnknownSamplingOption(  # the options in the problem: a file's check says its own fix (exported.py)
            f"{name} has no option {key!r} (SamplingOptions has {', '.join(known)})",
            (f"write {close[0]!r} if that is what was meant, or " if close else "") + f"leave {key!r} out",
        )
    return SamplingOptions(**values)
