"""A note (a warning) on options a class was given that do nothing in the combination given, said of its
parameters to a Python caller (`snapshot_every=5`) and of its flags by a command (`--ema.snapshot_every 5`).

The class words the note once, as a function of how an option and a value are said (`OptionNote.say`); the
warning's text is the Python caller's. train.py says the same note again of the flags the user wrote
(`diffusion.cli.train_warnings`), as it says a class's errors: no message text is parsed.
"""

from collections.abc import Callable
from typing import Any

# How an option of the note's owner is said with a value: ('snapshot_every', 5) -> 'snapshot_every=5'
SayValue = Callable[[str, Any], str]


def as_parameter(name: str, value: Any) -> str:
    """An option and its value as a Python caller writes them: `snapshot_every=5`, `post_hoc=True`."""
    return f"{name}={value}"


class OptionNote(UserWarning):
    """A note on `owner`'s options: `say(option)` is its text, each option with its value said by `option`
    (`as_parameter` for a Python caller, the flag as the user wrote it for a command)."""

    def __init__(self, say: Callable[[SayValue], str], owner: type) -> None:
        self.say, self.owner = say, owner
        super().__init__(say(as_parameter))


class RunNote(UserWarning):
    """A note of a run's own, found as it runs (a resumed schedule's jump: `optim.RunLengthSchedule`), worded alike
    for a Python caller and a command (no option said as a flag): train.py shows it as one line, `warning: <text>`."""
