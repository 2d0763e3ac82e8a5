"""The error types every layer may raise for a mistake of the user's, and the check of a choice among a Literal's
values. How the commands print them (one line, exit status 2) is `diffusion.cli.reporting`; any other exception
is a bug there, printed with its traceback.

Library code raises `UserError(problem, fix)` (or `InvalidValue`, `MissingFile`: the same, and a ValueError or a
FileNotFoundError for Python callers that catch one), `OutOfRange(name, value, requirement, fix)` for a
parameter's range check, `WrongType(name, value, expected, fix)` for an argument of the wrong kind (a TypeError too;
`check_whole_number` refuses a count's fraction, text or bool by these two). A library's error that the user's input caused (a file PIL or numpy cannot read) is
caught where the input is read and raised again as one of these, `from` it.

A message names an option of the class that checks it as `{--name}` (`{--sampling.steps}` for a nested one), never
as a flag: the error carries the class (`owner`), and who reads the message decides how it is said. A Python
caller reads the parameter's name (`str(error)`: `batch_size`); a command says the flag the user wrote, from its
own table of the classes it builds (`error.said(flag)`, diffusion.cli.flag_names: `--data.batch_size`). An option
of another class is `{ClassName:--name}`, by the class's name where this layer cannot import it
(`{DiffusionModule:--variance}` in core/). A flag of the command that runs the code, in a step of that command
(`{command:--out}`, `COMMAND`), is said as that flag by both: the fix is to run the command otherwise.
"""

import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from numbers import Integral, Real
from typing import Any, get_args

# `{--batch_size}`: an option of the error's owner, in a message; `{DiffusionModule:--variance}`: of that class
OPTION = re.compile(r"\{(?:([A-Za-z_]\w*):)?--([A-Za-z_][\w.]*)\}")


COMMAND = "command"  # the owner of a command's own flags (`--out`), in a step only that command runs


def parameter_name(owner: type | str | None, name: str) -> str:
    """How a Python caller reads an option: its parameter's name (a command's own flag: the flag)."""
    return f"--{name}" if owner == COMMAND else name


def said(
    text: str, flag: Callable[[type | str | None, str], str] = parameter_name, owner: type | str | None = None
) -> str:
    """`text` with each placeholder said as `flag(owner, name)` says it: for a line printed outside a UserError
    (a log line, a SystemExit's message), whose `{command:--flag}` is the running command's flag either way."""
    return OPTION.sub(lambda match: flag(match[1] or owner, match[2]), text)


class UserError(Exception):
    """A mistake in what the user gave, and its fix: reported as `<problem> — <fix>`; `owner`, the class whose
    options its `{--name}` placeholders are."""

    def __init__(self, problem: str, fix: str, owner: type | str | None = None) -> None:
        # `owner`: a class, or COMMAND for the running command's own flags (`{--steps}` said as `--steps`)
        self.problem, self.fix, self.owner = problem, fix, owner
        super().__init__(self.said(parameter_name))

    def said(self, flag: Callable[[type | str | None, str], str]) -> str:
        """`<problem> — <fix>`, each `{--name}` said as `flag(owner, name)` says it (the owner named in the
        placeholder, `{ClassName:--name}`, by its name)."""
        return said(f"{self.problem} — {self.fix}", flag, self.owner)

    def about(self, subject: str) -> "UserError":
        """The same error said of `subject`, what the user gave that led to it (a flag and a path): `<subject>:
        <problem> — <fix>`, for a check deep inside reading that subject which cannot know its name. Of the same
        built-in kind for Python callers: a missing file's a MissingFile, another OSError's a CannotRead, any other
        check's (a range, a kind, weights that do not fit) an InvalidValue, as what `subject` holds is wrong."""
        if type(self) is UserError:
            kind: type[UserError] = UserError
        elif isinstance(self, FileNotFoundError):
            kind = MissingFile
        else:
            kind = CannotRead if isinstance(self, OSError) else InvalidValue
        return kind(f"{subject}: {self.problem}", self.fix, self.owner)

    def __reduce__(self) -> tuple:
        # Pickled whole (a DataLoader worker's error crosses to the main process as itself): the subclasses'
        # __init__ take other arguments, so the instance is rebuilt from its fields, not by calling it.
        return (_rebuilt, (type(self), self.args, self.__dict__))


def _rebuilt(cls: type[UserError], args: tuple, fields: dict[str, Any]) -> UserError:
    # its own __new__: Exception's refuses an OSError's kinds (MissingFile, DiskFull)
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(fields)
    return error


@contextmanager
def options_of(owner: type) -> Iterator[None]:
    """A UserError of no class raised in the block is of `owner`'s options: a helper that reads a file for a
    class (`read_array(path, "{--path}", ...)`) names the option without knowing whose it is."""
    try:
        yield
    except UserError as error:
        if error.owner is None:
            error.owner = owner
        raise


class InvalidValue(UserError, ValueError):
    """A value of the user's that cannot be used (a range: OutOfRange); a ValueError too, for Python callers."""


class MissingFile(UserError, FileNotFoundError):
    """A file or folder the user named that is not there; a FileNotFoundError too, for Python callers."""


class CannotRead(UserError, OSError):
    """A file or download the user's setting points at that the system could not read (no network, no such file,
    no permission), said with the system's reason; an OSError too, for Python callers."""


class OutOfRange(UserError, ValueError):
    """A parameter's value outside what it accepts: `<name>=<value> must be <requirement> — <fix>`.

    It carries its parts, and `owner`, the class whose parameter it is (its `__init__` checked it), so a command
    that built that class from a group of flags says it of the flag the user wrote: `--data.batch_size 0 is out
    of range (must be >= 1) — ...` (diffusion.cli.train_checks.naming_the_flag). The command reads these fields,
    never the message's words. A ValueError too, for Python callers that catch one."""

    def __init__(
        self, name: str, value: Any, requirement: str, fix: str | None = None, owner: type | None = None
    ) -> None:
        self.name, self.value, self.requirement = name, value, requirement
        # `pass a value >= 1`, `pass a list of positive ints` (a requirement that says a kind says the value)
        named = requirement.startswith(("a ", "an "))
        fix = fix or (f"pass {requirement}" if named else f"pass a value {requirement}")
        super().__init__(f"{name}={value} must be {requirement}", fix, owner)


class WeightsDoNotFit(UserError, RuntimeError):
    """Weights (a state dict) that do not fit a network, said by counts and a few example keys of each kind of
    misfit (`check_weights_fit`; `summary` holds that part); a RuntimeError too, as torch's own `load_state_dict`
    error is."""

    summary = ""


def check_weights_fit(
    network: Any, weights: Mapping[str, Any], source: str, fix: str, owner: type | None = None
) -> None:
    """Raise WeightsDoNotFit unless `weights` hold exactly `network`'s state dict keys, each of its shape: checked
    before `load_state_dict`, so the line comes from the keys, not from reading torch's report."""
    expected = network.state_dict()
    missing = [key for key in expected if key not in weights]
    unexpected = [key for key in weights if key not in expected]
    reshaped = [
        key for key in expected if key in weights and tuple(weights[key].shape) != tuple(expected[key].shape)
    ]
    kinds = [(missing, "missing keys"), (unexpected, "unexpected keys"), (reshaped, "of another shape")]
    summary = ", ".join(f"{len(keys)} {kind} (e.g. {', '.join(keys[:2])})" for keys, kind in kinds if keys)
    if summary:
        misfit = WeightsDoNotFit(
            f"{source}: these weights do not fit {type(network).__name__} ({summary})", fix, owner
        )
        misfit.summary = summary
        raise misfit


class CallerError(ValueError):
    """A mistake of Python code calling a command (not of a user typing one): always keeps its traceback."""


def check_choice(name: str, value: Any, allowed: object, owner: type | None = None) -> None:
    """Raise InvalidValue unless `value` is one of the choices of the Literal type `allowed`."""
    choices = get_args(allowed)
    if value not in choices:
        raise InvalidValue(f"{name}={value!r} is not supported", f"choose one of {list(choices)}", owner)


class Interrupted(SystemExit):
    """The command was stopped by a signal (Ctrl+C's SIGINT, or SIGTERM): exit status 128 + the signal's number
    (130, 143), as a shell reports a process the signal killed. A SystemExit, so no `except Exception` on the way
    out swallows it and Lightning's loops tear down and re-raise it as any other exception."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


class WrongType(UserError, TypeError):
    """An argument of a public function given as the wrong kind of thing (a path where a model goes, options where a
    sampler goes, text where a number goes): `<name>=<value> is <what it is>, not <what it must be> — <fix>`. A
    TypeError too, for Python callers that catch one; a command still says it as one line."""

    def __init__(self, name: str, value: Any, expected: str, fix: str) -> None:
        kind = type(value).__name__
        shown = repr(value) if len(repr(value)) <= 60 else f"<{kind}>"
        article = "an" if kind[0].lower() in "aeiou" else "a"
        super().__init__(f"{name}={shown} is {article} {kind}, not {expected}", fix)
        self.name, self.value, self.expected = name, value, expected


def check_whole_number(name: str, value: Any, minimum: int | None = None, fix: str | None = None) -> int:
    """`value` as an int, refused unless it is an integer (a numpy one too; never a bool, whose True would count
    as 1) at least `minimum`: a float is refused rather than rounded, even 3.0, as the commands' int flags refuse
    it."""
    requirement = "a whole number" + ("" if minimum is None else f" >= {minimum}")
    if isinstance(value, bool) or not isinstance(value, Integral | float):
        raise WrongType(name, value, requirement, fix or f"pass {name} as an int")
    if isinstance(value, float) or (minimum is not None and value < minimum):
        raise OutOfRange(name, value, requirement, fix)
    return int(value)


def check_bool(name: str, value: Any, fix: str | None = None) -> bool:
    """`value` if it is a bool; refused otherwise (WrongType), since any text, even "no", or a number is truthy or
    falsy without meaning either."""
    if not isinstance(value, bool):
        raise WrongType(name, value, "True or False", fix or f"pass {name}=True or {name}=False")
    return value


def check_real(name: str, value: Any, fix: str | None = None) -> float:
    """`value` as a float, refused (WrongType) unless it is a real number: never a bool, whose True would count as
    1.0, nor text. Its range is the caller's to check."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise WrongType(name, value, "a number", fix or f"pass {name} as a float")
    return float(value)


GIB = 2**30


def machine_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the system does not say (no `os.sysconf`)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_memory(
    name: str, value: Any, needed: int, what: str, fix: str, owner: type | None = None
) -> None:
    """Refuse (OutOfRange of `name`) a size whose tensors (`what`, `needed` bytes) could not be held in this
    machine's memory at all: said before torch's allocation error, or the kernel's OOM kill, ends the process."""
    total = machine_memory()
    if total is not None and needed > total:
        requirement = (
            f"small enough for this machine's {total / GIB:,.1f} GiB of memory: {what} would take "
            f"{needed / GIB:,.1f} GiB"
        )
        raise OutOfRange(name, value, requirement, fix, owner)


# A write's faults (a full disk, a folder or file that refuses), a UserError each: their own module, said from here
# as before (`from diffusion.errors import DiskFull`).
from diffusion.errors.writes import (  # noqa: E402, F401
    FREE_SPACE,
    FS_IOC_GETFLAGS,
    FULL_DISK_ERRNOS,
    MAKE_WRITABLE,
    REFUSED_WRITE_ERRNOS,
    REFUSING_FLAGS,
    CannotReplace,
    CannotWrite,
    DiskFull,
    FlaggedFolder,
    _naming_the_write,
    check_can_replace,
    check_folder_exists,
    check_replaceable,
    is_disk_full,
    naming_a_full_disk,
    naming_a_refusing_folder,
    refusing_flag,
)
