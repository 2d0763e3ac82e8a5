"""`save_image_grid` draws pixels as they are, float in [0, 1] or uint8 in 0..255 (what `to_uint8`, the README's step,
returns), and refuses by the argument's name what it would otherwise draw as another picture or fail on with a
library's words: samples in model units (every negative value black), 0..255 in a float tensor (only 0 and 255), NaN
(black), 2 channels (gray + alpha), no images, a path that names no picture format. (The other argument checks of the
public API: tests/test_public_api_arguments.py.)"""

import builtins
import errno
import os

import numpy as np
import pytest
import torch
from helpers.full_disk import immutable
from PIL import Image

from diffusion import denormalize, rows_by_class, save_image_grid, to_uint8
from diffusion.errors import CannotReplace, CannotWrite, DiskFull, FlaggedFolder, InvalidValue, WrongType
from diffusion.generation.image_grid import HALF_A_LEVEL

NORMALIZATION = {"shift": [0.5], "scale": [0.5]}
SAMPLES = torch.linspace(-1, 1, 4 * 64).reshape(4, 1, 8, 8)  # generate's: model units


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path))


def test_uint8_images_are_drawn_as_the_same_pixels_as_their_floats(tmp_path):
    # to_uint8's output raised torch's "result type Float can't be cast to the desired output type Byte".
    uint8 = to_uint8(SAMPLES, NORMALIZATION)
    grid = save_image_grid(uint8, tmp_path / "uint8.png", nrow=2)
    assert grid.dtype == torch.uint8 and grid.shape == (3, 19, 19)
    save_image_grid(uint8.float() / 255, tmp_path / "float.png", nrow=2)
    save_image_grid(denormalize(SAMPLES, NORMALIZATION), tmp_path / "data.png", nrow=2)
    drawn = pixels(tmp_path / "uint8.png")
    assert np.array_equal(drawn, pixels(tmp_path / "float.png"))
    assert np.array_equal(drawn, pixels(tmp_path / "data.png"))
    assert np.array_equal(drawn[1:9, 1:9, 0], uint8[0, 0].numpy())  # the first image, inside the padding
    assert len(np.unique(drawn)) > 200  # the gray levels, not only black and white


def test_a_rounding_beyond_0_and_1_is_drawn_and_a_jpeg_is_written_by_its_suffix(tmp_path):
    images = torch.tensor([-0.99 * HALF_A_LEVEL, 1 + 0.99 * HALF_A_LEVEL]).view(2, 1, 1, 1).expand(2, 3, 4, 4)
    save_image_grid(images, tmp_path / "grid.JPG")
    assert Image.open(tmp_path / "grid.JPG").format == "JPEG"
    save_image_grid(images, tmp_path / "grid.png", nrow=2)
    assert pixels(tmp_path / "grid.png")[1, 1].tolist() == [0, 0, 0]
    assert pixels(tmp_path / "grid.png")[1, 6].tolist() == [255, 255, 255]


@pytest.mark.parametrize(
    ("images", "expected"),
    [
        (SAMPLES, r"^images holds values from -1 to 1, outside \[0, 1\] .*: negative values look like samples in "
                  r"model units \(-1\.\.1\) — pass to_uint8\(samples, module.normalization\)"),
        (SAMPLES * 0.5 + 0.5 + 0.01, r"^images holds values from 0.01 to 1.01, outside \[0, 1\] .* — pass to_uint8"
                                     r".*images.clamp\(0, 1\)"),
        ((SAMPLES * 0.5 + 0.5) * 255, r"^images holds values from 0 to 255, .*: values above 1 look like pixels "
                                      r"0\.\.255 in a float tensor — pass them as images.round\(\).to\(torch.uint8\)"),
        (SAMPLES.clone().index_fill_(0, torch.tensor([1, 3]), float("nan")),
         r"^images holds values that are not finite \(NaN or infinity\), which have no pixels, in 2 of its 4 images"),
        (torch.rand(4, 2, 8, 8), r"^images has 2 channels \(shape \(4, 2, 8, 8\)\), not 1 \(gray\) or 3 \(RGB\) — "),
        (torch.rand(4, 4, 8, 8), r"^images has 4 channels .* images\[:, :3\]"),
        (torch.zeros(8, 8, 8, 1, dtype=torch.uint8), r"^images has shape \(8, 8, 8, 1\): channels last \(N, H, W, C\), "
                                                     r"as samples.npz .* — pass images.permute\(0, 3, 1, 2\)"),
        (torch.zeros(0, 1, 8, 8), r"^images has shape \(0, 1, 8, 8\), which holds no pixels — pass at least one"),
        (torch.zeros(2, 1, 8, 8, dtype=torch.int64), r"^images are torch.int64 values, not float images in \[0, 1\] "
                                                     r"or uint8 images in 0..255 — "),
        (torch.zeros(2, 1, 8, 8, device="meta"), r"^images is a tensor on the meta device, whose values cannot be "),
    ],
    ids=[
        "model-units", "beyond-rounding", "float-0-255", "nan", "two-channels", "rgba", "channels-last", "empty", "int64",
        "meta",
    ],
)  # fmt: skip
def test_images_it_would_draw_as_another_picture_are_refused_by_their_name(images, expected, tmp_path):
    # Each was drawn (clamped: black for every negative value, only 0 and 255, NaN black; 2 channels as gray +
    # alpha), or failed in torchvision (an empty batch: ZeroDivisionError).
    with pytest.raises(InvalidValue, match=expected):
        save_image_grid(images, tmp_path / "grid.png")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("grid.txt", r"^path='.*grid.txt' ends in .txt, which names no picture format this writes — end it in .png"),
        ("grid", r"^path='.*grid' has no suffix, which names no picture format this writes — end it in .png"),
        ("", r"^path is empty — pass the picture's path; end it in .png \(lossless\) or .jpg"),
        ("missing/grid.png", r"^path='.*missing/grid.png': the folder .*missing does not exist — make the folder"),
        # the OS's IsADirectoryError naming a temporary file (tester 22b, S5)
        ("a_folder.png", r"^path='.*a_folder.png' is a folder, not a picture's file — move that folder away"),
    ],
)  # fmt: skip
def test_a_path_it_cannot_write_a_picture_to_is_refused_by_its_name(path, expected, tmp_path, monkeypatch):
    # PIL said "unknown file extension: .txt" (and of "" the same), naming neither the argument nor the formats.
    monkeypatch.chdir(tmp_path)
    if path == "a_folder.png":
        (tmp_path / path).mkdir()
    with pytest.raises(ValueError if path != "missing/grid.png" else FileNotFoundError, match=expected):
        save_image_grid(torch.rand(2, 1, 4, 4), str(tmp_path / path) if path else path)
    assert [p.name for p in tmp_path.iterdir()] == (["a_folder.png"] if path == "a_folder.png" else [])


def refusing_open(folder, error_number):
    """`open` for which `folder` refuses new files with `error_number`, as an immutable or full one does."""
    real = builtins.open

    def opening(path, *args, **kwargs):
        if str(path).startswith(str(folder)):
            raise OSError(error_number, os.strerror(error_number), str(path))
        return real(path, *args, **kwargs)

    return opening


@pytest.mark.parametrize(
    ("error_number", "kind", "expected"),
    [
        (
            errno.EPERM,
            CannotWrite,
            r"^cannot write a.png into \S+ \(Operation not permitted\) — make that folder ",
        ),
        (
            errno.ENOSPC,
            DiskFull,
            r"^no space left on the disk of \S+ while saving a.png — free space on that disk",
        ),
    ],
    ids=["immutable-folder", "full-disk"],
)
def test_a_folder_that_refuses_the_picture_is_said_naming_it_and_the_fix(error_number, kind, expected, tmp_path,
                                                                          monkeypatch):  # fmt: skip
    # PIL's bare "PermissionError: [Errno 1] Operation not permitted: 'imm/a.png'" (tester 9b, R8)
    monkeypatch.setattr(builtins, "open", refusing_open(tmp_path, error_number))
    with pytest.raises(kind, match=expected) as refused:
        save_image_grid(torch.zeros(2, 1, 8, 8), tmp_path / "a.png")
    assert isinstance(refused.value, OSError) and str(tmp_path) in str(refused.value)


def test_an_immutable_folder_or_picture_is_said_by_its_flag_not_as_a_folder_to_make_writable(tmp_path):
    # Tester 12b's X8: both said "make that folder writable for this user" (root, the folder writable in the second).
    folder = tmp_path / "imm"
    folder.mkdir()
    with immutable(folder), pytest.raises(FlaggedFolder) as refused:
        save_image_grid(torch.zeros(2, 1, 4, 4), folder / "g.png")
    assert str(refused.value) == (
        f"cannot write g.png into {folder} (it is immutable) — check its attributes (lsattr -d {folder}; chattr -i "
        "clears an immutable flag), or write to another folder; the files written there before are intact"
    )
    picture = folder / "g.png"
    save_image_grid(torch.zeros(2, 1, 4, 4), picture)
    before = picture.read_bytes()
    with immutable(picture):
        with pytest.raises(
            CannotReplace, match=r"^cannot replace g\.png in \S+ \(it is immutable\): the folder takes"
        ):
            save_image_grid(torch.ones(2, 1, 4, 4), picture)
        assert picture.read_bytes() == before and os.listdir(folder) == ["g.png"]


def test_a_path_under_a_file_or_in_a_folder_that_takes_no_files_is_said_as_such(tmp_path):
    # Tester 12b's X9: "the folder samples.npz does not exist — make the folder first" (a file has that name), and
    # /proc's bare FileNotFoundError from inside PIL.
    (tmp_path / "samples.npz").write_bytes(b"npz")
    for path in ["samples.npz/g.png", "samples.npz/a/g.png"]:
        with pytest.raises(InvalidValue) as refused:
            save_image_grid(torch.zeros(2, 1, 4, 4), tmp_path / path)
        assert str(refused.value) == (
            f"path='{tmp_path / path}': {tmp_path / 'samples.npz'} is a file, not a folder — pass a path in a folder"
        )
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    with pytest.raises(CannotWrite) as refused:
        save_image_grid(torch.zeros(2, 1, 4, 4), "/proc/nope.png")
    assert str(refused.value) == (
        "cannot write nope.png into /proc (No such file or directory: the folder takes no new files) — pass a path "
        "in a folder that takes files (not one of the system's, such as /proc or /sys)"
    )


def test_a_picture_saved_over_on_a_full_disk_or_stopped_is_left_as_it_was(tmp_path, monkeypatch):
    # Tester 18b's M7: PIL saved straight onto the path; a full disk left a truncated PNG where the grid was.
    from helpers.full_disk import full_open

    from diffusion.generation import image_grid

    picture = tmp_path / "grid.png"
    save_image_grid(torch.rand(4, 1, 8, 8), picture)
    before = picture.read_bytes()
    monkeypatch.setattr(image_grid, "open", full_open(100), raising=False)  # the disk fills after 100 bytes
    with pytest.raises(DiskFull) as refused:
        save_image_grid(torch.rand(16, 3, 32, 32), picture)
    assert str(refused.value) == (
        f"no space left on the disk of {tmp_path} while saving grid.png — free space on that disk, or save the "
        "picture on another disk"
    )
    assert picture.read_bytes() == before and os.listdir(tmp_path) == ["grid.png"]
    with pytest.raises(DiskFull):  # a new name: no partial (or empty) file left either
        save_image_grid(torch.rand(16, 3, 32, 32), tmp_path / "new.png")
    assert os.listdir(tmp_path) == ["grid.png"]
    monkeypatch.undo()

    def stopped(descriptor):
        raise KeyboardInterrupt

    monkeypatch.setattr(image_grid.os, "fsync", stopped)  # Ctrl+C once the new picture is written
    with pytest.raises(KeyboardInterrupt):
        save_image_grid(torch.rand(16, 3, 32, 32), picture)
    assert picture.read_bytes() == before and os.listdir(tmp_path) == ["grid.png"]


def test_a_picture_saved_over_on_a_real_full_disk_is_left_as_it_was(tmp_path):
    from helpers.full_disk import on_a_small_disk

    script = (
        "import os, torch; from diffusion import save_image_grid\n"
        "save_image_grid(torch.rand(4, 1, 8, 8), 'disk/grid.png'); before = open('disk/grid.png', 'rb').read()\n"
        "try: open('disk/filler', 'wb').write(b'x' * 300_000)\n"
        "except OSError: pass\n"
        "try: save_image_grid(torch.rand(64, 3, 64, 64), 'disk/grid.png')\n"
        "except OSError as error: print(type(error).__name__, error)\n"
        "print(open('disk/grid.png', 'rb').read() == before, sorted(os.listdir('disk')))\n"
    )
    (tmp_path / "m7.py").write_text(script)
    ran = on_a_small_disk(tmp_path / "disk", "200k", "{python} m7.py", tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "DiskFull no space left on the disk of disk while saving grid.png — free space on that disk, or save the "
        "picture on another disk",
        "True ['filler', 'grid.png']",
    ]


def test_rows_by_class_of_samples_without_labels_says_how_to_save_them():
    # Tester 18b's M8: "RuntimeError: Could not infer dtype of NoneType" (torch.as_tensor)
    with pytest.raises(WrongType) as refused:
        rows_by_class(torch.rand(4, 1, 8, 8), None)
    assert str(refused.value) == (
        "labels=None is a NoneType, not integer class indices, one per image — an unconditional model's samples "
        "have no labels: save them with save_image_grid(images, path), not in rows by class; of a conditional "
        "model, pass the labels generate was given"
    )
    with pytest.raises(
        WrongType, match=r"^labels=\['a', 'b'\] is a list, not integer class indices — pass the"
    ):
        rows_by_class(torch.rand(2, 1, 8, 8), ["a", "b"])
