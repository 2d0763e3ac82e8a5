"""A prepared data set: a data set written once (`python -m diffusion.prepare`) into litdata's chunks, in a local
folder or object storage, to be held on the training device or streamed (`diffusion.data.streaming`). This module
holds its format (`PreparedSet`, the manifest's fields and names), its storage (a folder, or object storage through
`diffusion.data.object_store`), which files in a folder are a prepare's (`written_by_a_prepare`, `not_prepared`) and
its opening (`open_prepared`: everything checked before any time is spent). Its chunks' checksums are
`diffusion.data.checked_chunks`'; it is written by `diffusion.data.preparing`, into `--out` as
`diffusion.data.staging` says.

Layout of a prepared set at ROOT (a folder, or an `s3://`, `gs://`, `az://` URL):

    ROOT/train/        litdata's chunks and index.json: the training samples, shuffled before they were cut into
                       chunks (litdata shuffles the order of chunks and the samples within each, not across chunks)
    ROOT/val/          the validation samples, when the source had a validation split
    ROOT/prepared.json what a run needs to know (`PreparedSet`): kind, sample shape, normalization, class names,
                       counts, encoding; written last, with the SHA-256 of each part's index.json, the CRC-32
                       of each chunk (format 2: a chunk is checked the first time a process reads it) and of itself

Each sample is `{"index": i, "sample": ..., "label": k}`: i its position 0..N-1 in its part (what per-sample noise
and flips are drawn from), the sample uint8 (C, H, W) pixels ("raw") or PNG / JPEG bytes for images, float32 (D,)
in model units for vectors, k its class (-1: the source had none). A set without prepared.json was not finished
(its prepare was stopped) and is refused, as is one whose index or chunks are missing or cut short.

litdata is the `scale` extra's: imported only when a prepared set is used.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np

from diffusion.errors import CannotRead, InvalidValue, MissingFile

MANIFEST = "prepared.json"
INDEX = "index.json"  # litdata's, in each part
FORMAT_VERSION = 2  # 2: the chunks' checksums (a set of format 1 is read without them)
PARTS = ("train", "val")
# A set --overwrite replaces is kept until the new one, written in STAGING, is finished; then set aside in REPLACED.
STAGING, REPLACED = "prepare.partial", "prepare.replaced"
# The files a prepare writes: the manifest (and its write in progress), and in each part litdata's chunks and
# indexes (its workers' `0.index.json` and the merge's `index.json.tmp` on the way); the same in STAGING, REPLACED.
PREPARED_FILE = re.compile(
    rf"(({re.escape(STAGING)}|{re.escape(REPLACED)})/)?({re.escape(MANIFEST)}(\.partial)?|"
    rf"({'|'.join(PARTS)})/(chunk-[\w.-]+\.bin|(\d+[.-])?{re.escape(INDEX)}(\.tmp)?))"
)
# Held by the prepare writing a folder (`diffusion.data.folder_lock`): neither a prepare's file nor the user's.
PREPARE_LOCK = ".prepare.lock"
NO_LABEL_STORED = -1
Encoding = Literal["auto", "raw", "png", "jpeg"]
RAW_UP_TO = 64  # "auto": raw pixels up to 64 px (12 kB an RGB image, decoded for free), PNG above
# The object storage a URL names first, by scheme: `s3://BUCKET/PATH`.
URL_STORES = {
    "s3://": "bucket", "gs://": "bucket", "gcs://": "bucket", "az://": "container", "abfs://": "container",
    "http://": "host", "https://": "host",
}  # fmt: skip
URL_SCHEMES = tuple(URL_STORES)
INSTALL_HINT = "install the scale extra: pip install -c constraints.txt -e '.[scale]'"
# Object storage that does not answer is said within seconds, not after minutes of retries.
# http:// endpoints too (a local MinIO, AWS_ENDPOINT_URL=http://...): the scheme is the user's choice.
CLIENT_OPTIONS = {"connect_timeout": "5s", "timeout": "30s", "allow_http": True}
RETRIES = {"max_retries": 1, "retry_timeout": timedelta(seconds=10)}
# One operation, retries included: a guard against a hang, far above what a store takes.
STORE_DEADLINE_S = 600


def litdata() -> Any:
    """The litdata module, or a UserError saying how to install it."""
    try:
        import litdata as module
    except ImportError as err:
        raise InvalidValue(
            "prepared data sets are read and written with litdata, which is not installed", INSTALL_HINT
        ) from err
    return module


def is_url(root: str) -> bool:
    return root.startswith(URL_SCHEMES)


def store_named(root: str, flag: str = "") -> str:
    """`root`, refused where it is a URL that names no bucket (container, host): `s3://`, `s3:///set`; before the
    store is asked, which would say obstore's parse of it and blame the network."""
    scheme = next((s for s in URL_SCHEMES if root.startswith(s)), None)
    if scheme is not None and not root[len(scheme) :].split("/")[0].strip():
        store = URL_STORES[scheme]
        raise InvalidValue(
            f"{flag + ' ' if flag else ''}{root}: names no {store}", f"pass {scheme}{store.upper()}/PATH"
        )
    return root


def joined(root: str, *names: str) -> str:
    return "/".join([root.rstrip("/"), *names]) if is_url(root) else str(Path(root, *names))


@dataclass(frozen=True)
class PreparedSet:
    """What `prepared.json` says of a prepared set; `root` is where it was opened."""

    root: str
    kind: Literal["images", "vectors"]
    sample_shape: tuple[int, ...]
    normalization: dict[str, list[float]]
    class_names: list[str] | None  # None: no labels stored
    counts: dict[str, int]  # samples per part ("train", and "val" where there is one)
    encoding: Literal["raw", "png", "jpeg"]
    random_flip: bool  # the source's default (CIFAR-10 flips, as Ho et al.)
    source: str  # what it was prepared from, for the start-up line
    seed: int
    index_sha256: dict[str, str]
    # part -> chunk file name -> CRC-32 (8 hex digits); empty for a set of format 1
    chunk_crc32: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def sample_nbytes(self) -> int:
        """Bytes of one sample held in memory (uint8 images, float32 vectors)."""
        itemsize = 1 if self.kind == "images" else 4
        return int(np.prod(self.sample_shape)) * itemsize

    def describe(self) -> str:
        parts = ", ".join(f"{n:,} {part}" for part, n in self.counts.items())
        shape = "x".join(map(str, self.sample_shape))
        return f"prepared set {self.root} ({parts}; {shape} {self.kind}, {self.encoding}; from {self.source})"

    def to_json(self) -> bytes:
        fields = {k: v for k, v in asdict(self).items() if k != "root"}
        body = {"format": FORMAT_VERSION, **fields, "sample_shape": list(self.sample_shape)}
        text = json.dumps(body, indent=1, sort_keys=True)
        return json.dumps({**body, "sha256": sha256(text.encode())}, indent=1, sort_keys=True).encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prepare_again(root: str) -> str:
    """The fix of a damaged set."""
    return f"prepare the set again: python -m diffusion.prepare ... {{command:--out}} {root} {{command:--overwrite}}"


# --- Storage: local files, or object storage through obstore (litdata's own client, a dependency of it) ---------


def in_object_storage(operation: str, root: str, argument: Any = None) -> Any:
    """`operation` ("get", "put", "list", "delete") on the store at URL `root`, in a process of its own
    (`diffusion.data.object_store` says why); None for a file that is not there."""
    litdata()  # obstore comes with it
    store_named(root)  # the commands' flags were checked: the last guard, for a Python caller
    request = (operation, root.rstrip("/"), argument, CLIENT_OPTIONS, RETRIES)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("object_store.py"))],
        input=pickle.dumps(request), capture_output=True, timeout=STORE_DEADLINE_S,
    )  # fmt: skip
    if done.returncode != 0:  # a bug, ours or obstore's: its traceback
        raise RuntimeError(
            f"object storage {operation} on {root} failed:\n{done.stderr.decode(errors='replace')}"
        )
    outcome, value = pickle.loads(done.stdout)
    if outcome == "unreachable":
        raise CannotRead(
            f"cannot reach {root} ({' '.join(value.split())[:200]})",
            "check the URL, the network and the credentials (AWS_*, GOOGLE_*, AZURE_* environment variables)",
        )
    return value


def read_bytes(root: str, name: str) -> bytes | None:
    """The file `name` under `root`, or None where there is none."""
    if is_url(root):
        return in_object_storage("get", root, name)
    path = Path(root, name)
    return path.read_bytes() if path.is_file() else None


def write_bytes(root: str, name: str, data: bytes) -> None:
    if is_url(root):
        in_object_storage("put", root, (name, data))
        return
    path = Path(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)


def listing(root: str) -> dict[str, int]:
    """Every file under `root` (relative name -> size in bytes); empty where there is nothing."""
    if is_url(root):
        return in_object_storage("list", root)
    base = Path(root)
    if not base.is_dir():
        return {}
    return {
        p.relative_to(base).as_posix(): p.stat().st_size
        for p in base.rglob("*")
        if p.is_file() and p != base / PREPARE_LOCK
    }


def written_by_a_prepare(name: str) -> bool:
    """Whether `name` (relative to a prepared set's root) is a file a prepare writes: what `--overwrite` may
    replace and a failed prepare removes, never a file of the user's."""
    return PREPARED_FILE.fullmatch(name) is not None


def not_prepared(root: str, listed: dict[str, int] | None = None) -> list[str]:
    """What `root` holds that no prepare writes, sorted: its files and folders (`a.txt`, `photos/`; in a part,
    `train/notes.txt`). Empty for a prepared set, an unfinished prepare, an empty folder or none. `listed`: the
    store's listing of a URL, where it was read already."""
    if is_url(root):
        names = listing(root) if listed is None else listed
        return sorted({_entry_of(name) for name in names if not written_by_a_prepare(name)})
    base, found = Path(root), []
    if not base.is_dir():
        return []
    for entry in base.iterdir():
        if entry.name == PREPARE_LOCK and entry.is_file() and not entry.is_symlink():
            continue
        if entry.name in (STAGING, REPLACED) and entry.is_dir() and not entry.is_symlink():
            found += [f"{entry.name}/{name}" for name in not_prepared(str(entry))]
        elif entry.name in PARTS and entry.is_dir() and not entry.is_symlink():
            found += [
                f"{entry.name}/{_shown(inner)}" for inner in entry.iterdir() if not prepares_file(inner, base)
            ]
        elif not prepares_file(entry, base):
            found.append(_shown(entry))
    return sorted(found)


def prepares_file(entry: Path, base: Path) -> bool:
    """A file (not a link) of the name a prepare writes."""
    return (
        entry.is_file()
        and not entry.is_symlink()
        and written_by_a_prepare(entry.relative_to(base).as_posix())
    )


def _shown(entry: Path) -> str:
    return entry.name + ("/" if entry.is_dir() else "")


def _entry_of(name: str) -> str:
    """A store's file name as the entry of the root (or of a part) that holds it: `photos/cat.jpg` -> `photos/`."""
    first, _, rest = name.partition("/")
    if first in PARTS and rest:
        inner, _, deeper = rest.partition("/")
        return f"{first}/{inner}" + ("/" if deeper else "")
    return first + ("/" if rest else "")


# --- Opening a prepared set: everything checked before any time is spent -------------------------------------


def open_prepared(root: str, flag: str = "{--root}") -> PreparedSet:
    """The prepared set at `root`, checked: finished, not damaged, of this version; else a UserError naming it."""
    root = store_named(str(root), flag)
    prepare = "python -m diffusion.prepare {command:--config} <the recipe> {command:--out} "
    if not is_url(root) and Path(root).expanduser().is_file():
        raise InvalidValue(
            f"{flag} {root} is a file, not a folder: no prepared data set there",
            f"point {flag} at the folder a prepare wrote, or prepare one: {prepare}NEW_FOLDER",
        )
    if not is_url(root) and not Path(root).expanduser().is_dir():
        raise MissingFile(
            f"{flag} {root}: no prepared data set there (no such folder)",
            f"prepare one first: {prepare}{root}",
        )
    root = root if is_url(root) else str(Path(root).expanduser())
    files = listing(root)
    raw = read_bytes(root, MANIFEST) if MANIFEST in files or is_url(root) else None
    # A prepare writes into an empty folder, over its own files (--overwrite), never over the user's.
    if raw is None:
        others = not_prepared(root, files)
        if not any(written_by_a_prepare(name) for name in files):  # no prepare ran there
            held = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            raise InvalidValue(
                f"{flag} {root} holds no prepared data set (no {MANIFEST}; "
                + (f"it holds {held})" if others else "the folder is empty)"),
                f"prepare one into a new folder first: {prepare}NEW_FOLDER"
                if others
                else f"prepare one into it first: {prepare}{root}",
            )
        again = f"into a new folder: {prepare}NEW_FOLDER" if others else f"with {{command:--out}} {root}"
        raise InvalidValue(
            f"{flag} {root} is not a prepared data set (its prepare was stopped before it finished: there is no "
            f"{MANIFEST})",
            f"run python -m diffusion.prepare again {again}" + ("" if others else " {command:--overwrite}"),
        )
    try:
        body = json.loads(raw)
        claimed = body.pop("sha256")
        fields = {k: v for k, v in body.items() if k != "format"}
        intact = sha256(json.dumps(body, indent=1, sort_keys=True).encode()) == claimed
    except (ValueError, KeyError, TypeError, AttributeError):
        intact = False
    if not intact:
        raise InvalidValue(
            f"{joined(root, MANIFEST)} is damaged (its checksum does not match)",
            "prepare the set again with {command:--overwrite}",
        )
    if body["format"] > FORMAT_VERSION:
        raise InvalidValue(
            f"{root} was prepared by a newer version of this project (format {body['format']})",
            "upgrade the project, or prepare the set again with this version",
        )
    prepared = PreparedSet(root=root, **{**fields, "sample_shape": tuple(fields["sample_shape"])})
    for part in prepared.counts:
        check_part(prepared, part, files)
    return prepared


def check_part(prepared: PreparedSet, part: str, files: dict[str, int]) -> None:
    """A part's index is the one prepared (checksum) and every chunk it names is there, whole."""
    index_name = f"{part}/{INDEX}"
    fix = prepare_again(prepared.root)
    if index_name not in files:
        raise InvalidValue(
            f"{joined(prepared.root, index_name)} is missing: the prepared set is incomplete", fix
        )
    raw = read_bytes(prepared.root, index_name) or b""
    if sha256(raw) != prepared.index_sha256.get(part):
        raise InvalidValue(
            f"{joined(prepared.root, index_name)} is not the one prepared (its checksum differs)", fix
        )
    for chunk in json.loads(raw)["chunks"]:
        name = f"{part}/{chunk['filename']}"
        size = files.get(name)
        if size is None:
            raise InvalidValue(f"chunk {joined(prepared.root, name)} is missing", fix)
        if size != chunk["chunk_bytes"]:
            raise InvalidValue(
                f"chunk {joined(prepared.root, name)} is cut short or damaged ({size:,} bytes, "
                f"{chunk['chunk_bytes']:,} expected)",
                fix,
            )
