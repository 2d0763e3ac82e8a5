"""A flag that wants a file, handed a folder: the one rule for every such flag (`--ckpt`, `--ckpt_path`,
`--model.init_from`, `--samples`, `--reference`, `--data.path`, `--data.labels`, `--inception_weights`).

A folder another command wrote often holds the very file wanted (a sample run's OUT/samples.npz, a run folder's
checkpoints/last.ckpt). The folder is searched a few levels down, in the layout the commands write, for files
of the wanted kind: exactly one is taken, and a note on stderr names it; several are refused in one line that
lists them and names the flag to pass one with; none are refused in one line that says which command writes one.
Hidden files and folders (temporary files of writes in progress) and ``*.partial`` folders (samples being
written) are not searched.
"""

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from diffusion.data.prepared import URL_SCHEMES
from diffusion.errors import InvalidValue, WrongType
from diffusion.errors import said as said_as_parameters

SEARCH_DEPTH = 4  # <save_dir>/<name>/<version>/checkpoints/last.ckpt from <save_dir>
SHOWN = 5  # files listed in a refusal before "and N more"


# A URL of object storage, also as pathlib left it ("s3://b/x" -> "s3:/b/x"): a local folder named "s3:" is none
_URL = re.compile("^(" + "|".join(re.escape(scheme.removesuffix("://")) for scheme in URL_SCHEMES) + "):/+")
COPY_DOWN = "copy it to a local path with your storage's tool (aws s3 cp, gcloud storage cp, azcopy copy) and pass that"


def url_given(path: object) -> str | None:
    """The object-storage URL `path` is (`s3://bucket/x`, as it was typed), or None for a local path."""
    match = _URL.match(str(path)) if isinstance(path, str | os.PathLike) else None
    return None if match is None else f"{match.group(1)}://{str(path)[match.end() :]}"


def check_local_file(path: object, flag: str, what: str) -> None:
    """Refuse an object-storage URL given for a file that is read from local storage only (`what`: "a
    checkpoint"): pathlib read `s3://b/x.ckpt` as the local `s3:/b/x.ckpt`, said to be missing."""
    url = url_given(path)
    if url is not None:
        raise InvalidValue(
            f"{flag} {url} is an object-storage URL, and {what} is read from a local path only", COPY_DOWN
        )


@dataclass(frozen=True)
class FileKind:
    """The files a flag wants: what they are called in a message, their name patterns, and who writes them."""

    name: str  # "checkpoint"
    patterns: tuple[str, ...]  # ("*.ckpt",)
    made_by: str  # "train.py writes them into runs/<name>/version_N/checkpoints/"
    # A folder holding none, said as what it is (a folder of another kind, which holds another kind of file) where
    # this says so: (what the folder is, the fix), or None for the generic "holds no <kind>"
    folder_said: Callable[[Path, str], tuple[str, str] | None] | None = None


def files_of_kind(folder: Path, kind: FileKind) -> list[Path]:
    """The files under `folder` (at most SEARCH_DEPTH levels down) whose names match `kind`, sorted."""
    found = []
    for root, folders, files in os.walk(folder):
        depth = len(Path(root).relative_to(folder).parts)
        folders[:] = [
            name for name in folders
            if depth + 1 < SEARCH_DEPTH and not name.startswith(".") and not name.endswith(".partial")
        ]  # fmt: skip
        found += [
            Path(root, name)
            for name in files
            if not name.startswith(".") and any(fnmatch(name, pattern) for pattern in kind.patterns)
        ]
    return sorted(found)


def file_in_folder(path: str | os.PathLike, flag: str, kind: FileKind) -> Path:
    """`path` itself unless it is a folder; a folder holding exactly one file of `kind`: that file (a note on
    stderr says so); else a UserError that lists the files found, or says that there are none. An object-storage
    URL is refused (`check_local_file`)."""
    check_local_file(path, flag, f"a {kind.name}")
    path = Path(path).expanduser()
    if not path.is_dir():
        return path
    found = files_of_kind(path, kind)
    if len(found) == 1:
        print(
            f"note: {said_as_parameters(flag)} {path} is a folder: using {found[0]}, the one {kind.name} in it",
            file=sys.stderr,
        )
        return found[0]
    patterns = " or ".join(kind.patterns)
    if not found:
        said = kind.folder_said(path, flag) if kind.folder_said is not None else None
        if said is not None:
            raise InvalidValue(f"{flag} {path} {said[0]}", said[1])
        raise InvalidValue(
            f"{flag} {path} is a folder, and it holds no {kind.name} ({patterns})",
            f"pass the path of a {kind.name} as {flag}; {kind.made_by}",
        )
    shown = ", ".join(str(file.relative_to(path)) for file in found[:SHOWN])
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    raise InvalidValue(
        f"{flag} {path} is a folder holding {len(found)} {kind.name}s ({shown}{more})",
        f"pass the one you mean as {flag} {found[0]} (or another of them)",
    )


def check_path_argument(
    name: str, value: object, what: str, fix: str, optional: bool = True, owner: type | None = None
) -> None:
    """Refuse an argument that names a file or folder (`what`: "an (N, D) .npy file") given as something else,
    the array itself most likely; None too, unless `optional`."""
    if not isinstance(value, str | os.PathLike) and not (optional and value is None):
        raise WrongType(name, value, f"the path of {what}", fix)
    if value is not None and not str(value).strip():  # pathlib reads "" as the current folder
        raise InvalidValue(
            f"{{--{name}}} {value!r} is an empty path, which would mean the current folder", fix, owner
        )
