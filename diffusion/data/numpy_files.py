"""What a NumPy file is, told from its first bytes."""

from pathlib import Path


def numpy_file_kind(path: Path) -> str:
    """ "npy", "npz" or "other", from the file's first bytes: np.load would try to unpickle an unknown file and
    report that, rather than what the file is."""
    with path.open("rb") as file:
        magic = file.read(6)
    if magic == b"\x93NUMPY":
        return "npy"
    return "npz" if magic[:2] == b"PK" else "other"  # np.savez writes a zip archive
