"""The error type every layer may raise for a mistake of the user's, and the check of a choice among a Literal's
values. How the commands print them (one line, exit status 2) is `diffusion.cli.reporting`.

Library code raises `UserError(problem, fix)`, `OutOfRange(name, value, requirement, fix)` for a parameter's range
check, or a plain `ValueError`/`FileNotFoundError` whose message reads `<what is wrong> — <how to fix it>` (or
`<what>; <fix>`).
"""

from collections.abc import Mapping
from typing import Any, get_args


class UserError(Exception):
    """A mistake in what the user gave, and its fix: reported as `<problem> — <fix>`."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem} — {fix}")
        self.problem, self.fix = problem, fix

    def about(self, subject: str) -> "UserError":
        """The same error said of `subject`, what the user gave that led to it (a flag and a path): `<subject>:
        <problem> — <fix>`, for a check deep inside reading that subject which cannot know its name."""
        return UserError(f"{subject}: {self.problem}", self.fix)


class OutOfRange(UserError, ValueError):
    """A parameter's value outside what it accepts: `<name>=<value> must be <requirement> — <fix>`.

    It carries its parts, and `owner`, the class whose parameter it is (its `__init__` checked it), so a command
    that built that class from a group of flags says it of the flag the user wrote: `--data.batch_size 0 is out
    of range (must be >= 1) — ...` (diffusion.cli.train_checks.naming_the_flag). The command reads these fields,
    never the message's words. A ValueError too, for Python callers that catch one."""

    def __init__(
        self, name: str, value: Any, requirement: str, fix: str | None = None, owner: type | None = None
    ) -> None:
        super().__init__(f"{name}={value} must be {requirement}", fix or f"pass a value {requirement}")
        self.name, self.value, self.requirement, self.owner = name, value, requirement, owner


class WeightsDoNotFit(UserError, RuntimeError):
    """Weights (a state dict) that do not fit a network, said by counts and a few example keys of each kind of
    misfit (`check_weights_fit`); a RuntimeError too, as torch's own `load_state_dict` error is."""


def check_weights_fit(network: Any, weights: Mapping[str, Any], source: str, fix: str) -> None:
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
        raise WeightsDoNotFit(f"{source}: these weights do not fit {type(network).__name__} ({summary})", fix)


class CallerError(ValueError):
    """A mistake of Python code calling a command (not of a user typing one): always keeps its traceback."""


def check_choice(name: str, value: Any, allowed: object) -> None:
    """Raise ValueError unless `value` is one of the choices of the Literal type `allowed`."""
    choices = get_args(allowed)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {list(choices)}")


class Interrupted(SystemExit):
    """The command was stopped by a signal (Ctrl+C's SIGINT, or SIGTERM): exit status 128 + the signal's number
    (130, 143), as a shell reports a process the signal killed. A SystemExit, so no `except Exception` on the way
    out swallows it and Lightning's loops tear down and re-raise it as any other exception."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum
