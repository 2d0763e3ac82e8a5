"""Files damaged as a bad copy or a failing disk damages them: one byte changed inside the data, the file's size and
structure intact (truncated and empty files are other tests')."""

import zipfile
from pathlib import Path


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def flip_byte_inside_largest_entry(path: Path) -> str:
    """Change one byte in the middle of the largest array of a zip archive (a torch.save file's largest tensor,
    an .npz's largest array); returns the entry's name."""
    with zipfile.ZipFile(path) as archive:
        arrays = [
            info for info in archive.infolist() if "/data/" in info.filename or info.filename.endswith(".npy")
        ]
        entry = max(arrays, key=lambda info: info.file_size)
    with open(path, "rb") as file:
        file.seek(entry.header_offset + 26)  # the local header's name and extra field lengths
        name_length, extra_length = (int.from_bytes(file.read(2), "little") for _ in range(2))
    start = entry.header_offset + 30 + name_length + extra_length
    flip_byte(path, start + entry.compress_size // 2)
    return entry.filename


def flip_byte_near_the_end(path: Path) -> None:
    """A safetensors file's tensor data ends the file: change a byte inside it."""
    flip_byte(path, path.stat().st_size - 10)
