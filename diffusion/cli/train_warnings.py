"""train.py's notes (warnings) as lines of the command's own: `warning: <text>`, the options it names said as the
user gave them (`--ema.snapshot_every 5`, or `run.yaml: ema.snapshot_every 5` where a config file set it).

A note of train.py's own is a `CommandNote`, worded for the command line. A note a class raises while train.py
builds it (the module, the data, the callbacks) is said again as one (`notes_said_as_written`): a class's
`OptionNote` of the flags the user wrote, as train.py says a class's errors; any other UserWarning in its own
words. The command shows a CommandNote as one line (`one_line_notes`), without the warnings module's file and
line and the source line under them; a Python caller of the classes gets their warnings as they are.
"""

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from diffusion.cli.command_line import Written, where_written
from diffusion.cli.config_files import as_text
from diffusion.cli.flag_names import flag_text
from diffusion.training.option_notes import OptionNote, RunNote


class CommandNote(UserWarning):
    """A note of train.py's, worded for its command line: shown as `warning: <text>` (`one_line_notes`)."""


def say_notes(notes: Sequence[str]) -> None:
    """train.py's notes on its command line, found as it parses (`options_turned_off`): rank 0 says each."""
    for note in notes:
        rank_zero_warn(CommandNote(note))


def note_as_written(note: OptionNote, groups: dict[type, str], written: Sequence[Written]) -> str:
    """A class's note with each option and value said as the user gave it: `--ema.snapshot_every 5`, a config
    file's `run.yaml: ema.snapshot_every 5`, and a value the note suggests as a flag takes it (`--ema.post_hoc
    true`)."""
    say = where_written(written)

    def option(name: str, value: Any) -> str:
        flag = flag_text(note.owner, name, groups)
        shown = as_text(list(value) if isinstance(value, tuple) else value)
        return say(flag[2:], shown) if flag.startswith("--") else f"{flag}={value}"

    return note.say(option)


@contextmanager
def notes_said_as_written(groups: dict[type, str], written: Sequence[Written]) -> Iterator[None]:
    """The warnings raised in the block (train.py building its classes), each given again once it ends: a
    UserWarning as a CommandNote (a class's `OptionNote` said of the flags as written), any other kind (a
    library's deprecation) as it was."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield
    finally:  # with the warnings module as it was; a note given before an error too
        for warning in caught:
            message = warning.message
            if isinstance(message, OptionNote):
                warnings.warn(CommandNote(note_as_written(message, groups, written)), stacklevel=1)
            elif isinstance(message, UserWarning) and not isinstance(message, CommandNote):
                warnings.warn(CommandNote(str(message)), stacklevel=1)
            else:
                warnings.warn_explicit(
                    message, warning.category, warning.filename, warning.lineno, source=warning.source
                )


@contextmanager
def one_line_notes() -> Iterator[None]:
    """While the command runs, a CommandNote or a RunNote is shown as one line, `warning: <text>`; any other warning as the
    warnings module (or Lightning, which formats its own) shows it."""
    shown_before = warnings.formatwarning

    def formatted(
        message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        if issubclass(category, CommandNote | RunNote):
            return f"warning: {message}\n"
        return shown_before(message, category, filename, lineno, line)

    warnings.formatwarning = formatted
    try:
        yield
    finally:
        warnings.formatwarning = shown_before
