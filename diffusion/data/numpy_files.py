"""The one reader of the arrays users hand the commands (`--data.path`, `--samples`, `--reference` .npz): what a
NumPy file is, told from its first bytes, and the same rule in every command for the neighbouring formats.

The rule: a `.npy` array and an `.npz` archive's `arr_0` (or its only array) are the same thing, so either is
read wherever an array is; an archive of several (`np.savez(path, a, b)`: arr_0, arr_1) is refused rather than
read in part, but for an `arr_1` of one label per item (sample's class labels). Images: (N, H, W, C) or
(N, C, H, W) with C = 1 or 3, whichever of the two the shape allows (refused when it allows both); uint8, or
integers within 0..255. Float images are refused: 0..1, -1..1 and 0..255 are all in use, and a wrong guess would
give wrong numbers without a word.
"""

import contextlib
import re
import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from diffusion.data.file_in_folder import FileKind, file_in_folder
from diffusion.errors import InvalidValue, MissingFile, UserError

IMAGE_FIX = (
    "save uint8 images (N, H, W, C) with np.savez(path, images), as python -m diffusion.sample writes them"
)
ARRAY_FILE = FileKind(
    "NumPy file", ("*.npz", "*.npy"),
    "python -m diffusion.sample writes OUT/samples.npz, np.savez and np.save write your own arrays",
)  # fmt: skip
FLOAT_FIX = (
    "convert them to uint8 first: (x * 255).round() for 0..1, ((x + 1) * 127.5).round() for -1..1, "
    "then .clip(0, 255).astype(np.uint8)"
)


# The first byte of a pickle of protocol 2 or later (pickle.dump, torch.save's legacy format).
PICKLE = b"\x80"


def numpy_file_kind(path: Path) -> str:
    """ "npy", "npz", "pickle" or "other", from the file's first bytes: np.load would try to unpickle an unknown
    file and report that, rather than what the file is."""
    with path.open("rb") as file:
        magic = file.read(6)
    if magic == b"\x93NUMPY":
        return "npy"
    if magic[:1] == PICKLE:
        return "pickle"
    return "npz" if magic[:2] == b"PK" else "other"  # np.savez writes a zip archive


def is_torch_archive(path: Path) -> bool:
    """Whether the zip file `path` is torch.save's archive (its pickle, `<name>/data.pkl`), not np.savez's."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") or name == "data.pkl" for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):  # said as truncated or corrupt where np.load reads it
        return False


PICKLED = "holds pickled Python objects (pickle.dump, or torch.save's legacy format), not"


def array_header(path: Path, member: str | None = None) -> tuple[tuple[int, ...], np.dtype] | None:
    """(shape, dtype) of the array in the .npy file `path` (or the .npz archive's `member`), from its header alone
    (nothing else is read); None for a header version numpy's readers here do not know."""
    with contextlib.ExitStack() as stack:
        file: IO[bytes]
        if member is None:
            file = stack.enter_context(path.open("rb"))
        else:
            archive = stack.enter_context(zipfile.ZipFile(path))
            # np.load names an archive's arrays by their entries' names less ".npy".
            entry = f"{member}.npy" if f"{member}.npy" in archive.namelist() else member
            file = stack.enter_context(archive.open(entry))
        version = np.lib.format.read_magic(file)
        read_header = HEADER_READERS.get(version)
        if read_header is None:
            return None
        shape, _, dtype = read_header(file)
        return shape, dtype


def holds_objects(path: Path, member: str | None = None) -> bool:
    """Whether the array in the .npy file `path` (or the .npz archive's `member`) is of a dtype that holds Python
    objects, from its header alone: numpy reads such arrays only by unpickling them, which could run code."""
    header = array_header(path, member)
    return header is not None and header[1].hasobject


# np.savez(path, a, b, ...) names its arrays arr_0, arr_1, ...: more than one of them is more than one array of
# data, of which one would be read (arr_1 beside arr_0 is read as its labels, as sample writes them, when it holds
# one per item). Arrays saved under other names (guided-diffusion's reference batches keep mu and sigma beside
# arr_0) are not data.
POSITIONAL = re.compile(r"arr_\d+")
MERGE_FIX = "save one array per file, or merge them into one: np.savez(path, np.concatenate([a, b]))"


def check_one_array(path: Path, flag: str, names: list[str]) -> None:
    """Refuse an .npz archive holding more than one positional array (np.savez(path, *batches)), naming them."""
    positional = sorted((n for n in names if POSITIONAL.fullmatch(n)), key=lambda n: int(n[4:]))
    headers = {name: array_header(path, name) for name in positional}
    first = headers.get("arr_0")
    labels = headers.get("arr_1")
    one_per_item = first is not None and labels is not None and labels[0] == first[0][:1]
    if len(positional) <= (2 if one_per_item else 1):
        return
    shown = ", ".join(f"{name} {header[0] if header else '?'}" for name, header in headers.items())
    count = first[0][0] if first is not None and first[0] else "N"
    raise InvalidValue(
        f"{flag} {path} holds more than one array ({shown}), and only arr_0 is read "
        f"(arr_1 only as class labels, shape ({count},))",
        MERGE_FIX,
    )


HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def read_array(path: str | Path, flag: str, fix: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(array, labels or None) of a .npy file (memory-mapped) or an .npz archive (`arr_0`, or its only array;
    labels from `arr_1`); `fix` ends each refusal but that of an archive of several arrays. A folder holding one
    such file stands for it. Files holding Python objects (a pickle, an array of dtype object) and empty arrays are
    refused, saying so."""
    path = file_in_folder(path, flag, ARRAY_FILE)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise MissingFile(f"{flag} {path} {what}", fix)
    kind = numpy_file_kind(path)
    if kind == "pickle":
        raise InvalidValue(f"{flag} {path} {PICKLED} a NumPy array (np.save, np.savez)", fix)
    if kind == "other":
        raise InvalidValue(f"{flag} {path} is not a .npy file or an .npz archive", fix)
    if kind == "npz" and is_torch_archive(path):  # a zip too: its entries were listed as if they were arrays
        raise InvalidValue(
            f"{flag} {path} is a PyTorch file (torch.save: a checkpoint), not a NumPy array", fix
        )
    objects = InvalidValue(f"{flag} {path} holds Python objects (dtype object), not numbers", fix)
    try:
        if kind == "npy":
            if holds_objects(path):
                raise objects
            # mmap: shape and dtype are checked from the header before anything is read.
            array, labels = np.load(path, mmap_mode="r", allow_pickle=False), None
        else:
            with np.load(path, allow_pickle=False) as archive:
                names = archive.files
                if "arr_0" not in names and len(names) != 1:
                    listed = names if len(names) <= 6 else [*names[:5], f"... ({len(names)} in all)"]
                    raise InvalidValue(
                        f"{flag} {path} holds {listed}, no arr_0 (FID statistics hold mu and sigma)", fix
                    )
                name = "arr_0" if "arr_0" in names else names[0]
                check_one_array(path, flag, names)
                labelled = "arr_0" in names and "arr_1" in names
                if any(holds_objects(path, member) for member in [name, *(["arr_1"] if labelled else [])]):
                    raise objects
                array = archive[name]
                labels = archive["arr_1"] if labelled else None
    except UserError:
        raise
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, KeyError) as err:
        raise InvalidValue(f"{flag} {path} is truncated or corrupt ({err})", fix) from err
    if array.size == 0:
        raise InvalidValue(f"{flag} {path} holds an empty array (shape {array.shape})", fix)
    return array, labels


def read_images(path: str | Path, flag: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(uint8 images (N, H, W, C), labels or None) of a .npy or .npz file, by the module's rule."""
    array, labels = read_array(path, flag, IMAGE_FIX)
    shown = f"{flag} {path}: the array has dtype {array.dtype} and shape {array.shape}"
    if array.ndim != 4:
        raise InvalidValue(f"{shown}, not images (N, H, W, C) with C = 1 or 3", IMAGE_FIX)
    last, second = array.shape[-1] in (1, 3), array.shape[1] in (1, 3)
    if last and second:
        raise InvalidValue(f"{shown}: (N, H, W, C) and (N, C, H, W) both fit", IMAGE_FIX)
    if not (last or second):
        raise InvalidValue(f"{shown}, with neither 1 nor 3 channels first or last", IMAGE_FIX)
    if not last:
        array = array.transpose(0, 2, 3, 1)
    if np.issubdtype(array.dtype, np.floating):
        raise InvalidValue(f"{shown}: float images could be in 0..1, -1..1 or 0..255", FLOAT_FIX)
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
            raise InvalidValue(f"{shown}, not numbers of pixels", IMAGE_FIX)
        if array.size and (array.min() < 0 or array.max() > 255):
            raise InvalidValue(f"{shown}, values beyond 0..255", IMAGE_FIX)
    return np.ascontiguousarray(array, dtype=np.uint8), labels
