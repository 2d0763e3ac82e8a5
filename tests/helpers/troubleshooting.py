"""The table of messages in docs/troubleshooting.md, read as patterns: what the docs test and the bad-flag test
hold the code's messages against."""

import re
from pathlib import Path

TROUBLESHOOTING = Path(__file__).parents[2] / "docs" / "troubleshooting.md"
# Words of a row that stand for the user's values: a flag, a path, a number, a value.
PLACEHOLDER = re.compile(r"\.\.\.|--flag|\b(?:DIR|PATH|FILE|N|X|Y|VALUE|TYPE|K)\b|<[a-z ]+>")


def table_messages() -> list[str]:
    """Every backticked text of the first cell of every row of the table of messages."""
    table = TROUBLESHOOTING.read_text().split("## Messages you may see", 1)[1]
    cells = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `")]
    return [text for cell in cells for text in re.findall(r"`([^`]+)`", cell)]


def pattern_of(message: str) -> re.Pattern:
    """A row's message as a regular expression: its placeholders match anything."""
    parts = PLACEHOLDER.split(message.removeprefix("error: "))
    return re.compile(".*".join(re.escape(part) for part in parts))


def stable_text(message: str) -> str:
    """The longest run of a row's message between placeholders: text the code must hold verbatim."""
    return max((part.strip() for part in PLACEHOLDER.split(message.removeprefix("error: "))), key=len)


def matches_a_row(line: str) -> bool:
    return any(pattern_of(message).search(line) for message in table_messages())
