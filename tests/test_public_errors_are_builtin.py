"""A Python caller catches a public function's refusal by a built-in type: every user error the library raises is
also a ValueError, a TypeError or an OSError (a RuntimeError for weights that do not fit, as torch's own), never a
bare `UserError`, which `except ValueError` would let through. A bad file handed to a public function (a damaged
checkpoint, statistics without sigma, an export's config cut short) is a ValueError; a file or download the system
could not read, an OSError. The argument checks themselves: tests/test_public_api_arguments.py."""

import ast
import importlib
import json
import pickle
import pkgutil
from pathlib import Path
from textwrap import indent

import numpy as np
import pytest
import torch
from helpers import tiny_vector_model

import diffusion
from diffusion import (
    DiffusionModule,
    ImageDataModule,
    NoiseSchedule,
    SampleQuality,
    UserError,
    latest_checkpoint,
    load_checkpoint,
    load_statistics,
)
from diffusion.errors import CannotRead, CannotWrite, DiskFull, MissingFile

BUILTIN = (ValueError, TypeError, OSError)


def every_user_error_kind() -> set[type[UserError]]:
    """The UserError subclasses of the library (the commands' own, below diffusion.cli, are said by the commands
    alone), each module imported."""
    for module in pkgutil.walk_packages(diffusion.__path__, "diffusion."):
        if not module.name.startswith("diffusion.cli"):
            importlib.import_module(module.name)
    kinds, todo = set(), [UserError]
    while todo:
        for kind in todo.pop().__subclasses__():
            kinds.add(kind)
            todo.append(kind)
    return {
        kind
        for kind in kinds
        if kind.__module__.startswith("diffusion.") and not kind.__module__.startswith("diffusion.cli")
    }


# Raised only where a command trains a run folder (another job holds its lock): no public function's refusal.
COMMANDS_ONLY = {"RunFolderInUse"}


def test_every_user_error_kind_is_a_builtin_error_too():
    kinds = every_user_error_kind()
    assert {"InvalidValue", "MissingFile", "UnreadableCheckpoint", "DiskFull"} <= {k.__name__ for k in kinds}
    plain = [
        kind.__name__
        for kind in kinds
        if kind.__name__ not in COMMANDS_ONLY and not issubclass(kind, (*BUILTIN, RuntimeError))
    ]
    assert not plain, f"user errors that no `except ValueError/TypeError/OSError` catches: {plain}"


def bare_user_errors(source: str) -> list[int]:
    """The lines of `source` that make a bare `UserError` (`UserError(...)`, `diffusion.errors.UserError(...)`, a
    `raise UserError`): raised there or returned for a caller to raise, either way no built-in kind."""
    named = lambda node: getattr(node, "id", getattr(node, "attr", None)) == "UserError"  # noqa: E731
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if (isinstance(node, ast.Call) and named(node.func))
        or (isinstance(node, ast.Raise) and named(node.exc))
    )


def test_the_library_makes_no_bare_user_error():
    # Structural, as the kinds above: below diffusion/cli/ (whose commands say their own errors and exit) a user
    # error is made as one of its kinds (InvalidValue, MissingFile, WrongType, ... or a module's own subclass of a
    # built-in), never as UserError itself, which a Python caller's `except ValueError` would let through.
    package = Path(diffusion.__file__).parent
    found = [
        f"{path.relative_to(package.parent)}:{line}"
        for path in sorted(package.rglob("*.py"))
        if path.relative_to(package).parts[0] not in ("cli", "errors")
        for line in bare_user_errors(path.read_text())
    ]
    assert not found, f"a bare UserError (make it InvalidValue, MissingFile, ... instead) at: {found}"


def test_the_scan_finds_each_way_of_making_a_bare_user_error():
    made = "raise UserError('a', 'b')\nraise errors.UserError('a', 'b')\nreturn UserError('a', 'b')\nraise UserError\n"
    kinds = "raise InvalidValue('a', 'b')\nkind = UserError\nraise kind('a', 'b')\nisinstance(e, UserError)\n"
    assert bare_user_errors(f"def f():\n{indent(made, '    ')}") == [2, 3, 4, 5]
    assert bare_user_errors(f"try:\n    pass\nexcept UserError:\n{indent(kinds, '    ')}") == []


def test_the_writing_and_reading_faults_are_os_errors_and_pickle_whole():
    # A DataLoader worker's error crosses to the main process pickled: an OSError's kind rebuilt by its own __new__.
    for error in [DiskFull(Path("out"), "samples.npz"), CannotWrite(Path("out"), "a.png", "Permission denied"),
                  MissingFile("no such file", "pass another"), CannotRead("could not read it", "pass another")]:  # fmt: skip
        assert isinstance(error, OSError) and error.errno is None  # not taken for the OS's own full disk
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and vars(copy) == vars(error)


def statistics(tmp_path: Path, **arrays: np.ndarray) -> Path:
    np.savez(tmp_path / "stats.npz", **arrays)
    return tmp_path / "stats.npz"


def export_folder(tmp_path: Path, config: str) -> Path:
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text(config)
    return tmp_path / "export"


def run_of_damaged_checkpoints(tmp_path: Path) -> Path:
    (tmp_path / "runs" / "x" / "version_0" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "version_0" / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")
    return tmp_path / "runs"


def file_of(tmp_path: Path, name: str, contents: bytes) -> Path:
    (tmp_path / name).write_bytes(contents)
    return tmp_path / name


def pipeline_without_unet(tmp_path: Path) -> Path:
    (tmp_path / "pipe").mkdir()
    (tmp_path / "pipe" / "model_index.json").write_text("{}")
    return tmp_path / "pipe"


def samples_file(tmp_path: Path) -> Path:
    np.savez(
        tmp_path / "samples.npz", np.zeros((2, 8, 8, 1), np.uint8)
    )  # torch's line was its C++ enforce text
    return tmp_path / "samples.npz"


def not_a_checkpoint(tmp_path: Path) -> Path:
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.ckpt")
    return tmp_path / "other.ckpt"


def folder_of_two(tmp_path: Path) -> Path:
    (tmp_path / "a.ckpt").write_bytes(b"")
    (tmp_path / "b.ckpt").write_bytes(b"")
    return tmp_path


# (id, the call on a folder of bad files, the built-in type, text the message holds)
FILE_CASES = [
    ("checkpoint-folder-of-two", lambda d: load_checkpoint(folder_of_two(d)), ValueError,
     "is a folder holding 2 checkpoints"),
    ("init-from-folder-of-none", lambda d: DiffusionModule(tiny_vector_model().network, sample_shape=(2,),
                                                           init_from=d), ValueError, "holds no checkpoint"),
    ("streaming-root-missing", lambda d: ImageDataModule(dataset="streaming", root=str(d / "nope")),
     FileNotFoundError, "no prepared data set there"),
    ("statistics-without-sigma", lambda d: load_statistics(statistics(d, mu=np.zeros(3))), ValueError,
     "has no sigma"),
    ("statistics-of-two-sizes", lambda d: load_statistics(statistics(d, mu=np.zeros(3), sigma=np.eye(4))),
     ValueError, "mu has shape (3,)"),
    ("statistics-nan", lambda d: load_statistics(statistics(d, mu=np.full(2, np.nan), sigma=np.eye(2))),
     ValueError, "NaN"),
    ("statistics-not-npz", lambda d: load_statistics(file_of(d, "s.npz", b"text")), ValueError,
     "not an .npz archive"),
    ("checkpoint-cut-short", lambda d: load_checkpoint(file_of(d, "x.ckpt", b"PK\x03\x04 cut short")),
     ValueError, "truncated"),
    ("checkpoint-is-samples", lambda d: load_checkpoint(samples_file(d)), ValueError, "is a NumPy archive"),
    ("checkpoint-of-other-contents", lambda d: load_checkpoint(not_a_checkpoint(d)), ValueError,
     "not a checkpoint written by train.py"),
    ("export-config-cut-short", lambda d: load_checkpoint(export_folder(d, '{"format": ')), ValueError,
     "is not valid JSON"),
    ("export-of-another-program", lambda d: load_checkpoint(export_folder(d, json.dumps({"format": "x"}))),
     ValueError, "not the config of an export"),
    ("diffusers-without-unet", lambda d: load_checkpoint(pipeline_without_unet(d)), ValueError,
     "without its unet/ folder"),
    ("latest-only-damaged", lambda d: latest_checkpoint(run_of_damaged_checkpoints(d), "x"), ValueError,
     "no intact checkpoint"),
    # were "no checkpoint under ... — train first" of a run that is there
    ("latest-of-a-checkpoint-file", lambda d: latest_checkpoint(file_of(d, "last.ckpt", b"x"), "base"),
     ValueError, "last.ckpt is a file, not the folder of runs — pass the folder train.py wrote to"),
    ("latest-of-a-version-named", lambda d: latest_checkpoint(run_of_damaged_checkpoints(d), "x/version_0"),
     ValueError, "name='x/version_0' holds a version folder — pass name='x' (the latest version is taken)"),
    ("latest-of-a-version-folder", lambda d: latest_checkpoint(run_of_damaged_checkpoints(d) / "x", "version_0"),
     ValueError, "name='version_0' is a version folder of the run"),
    ("init-from-damaged", lambda d: DiffusionModule(tiny_vector_model().network, sample_shape=(2,),
                                                    init_from=file_of(d, "x.ckpt", b"garbage")),
     ValueError, "x.ckpt"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "error", "text"), [case[1:] for case in FILE_CASES], ids=[c[0] for c in FILE_CASES]
)
def test_a_bad_file_is_refused_as_a_builtin_error(call, error, text, tmp_path):
    with pytest.raises(error) as raised:
        call(tmp_path)
    assert isinstance(raised.value, UserError) and text in str(raised.value), str(raised.value)


def test_a_schedule_that_is_none_is_a_value_error():
    with pytest.raises(ValueError, match=r"^trained_betas=<2 betas, 0 \.\.\. 0\.1> are not a noise schedule"):
        NoiseSchedule("trained", 2, trained_betas=[0.0, 0.1])


def test_inception_weights_that_cannot_be_read_are_an_os_error(tmp_path):
    pytest.importorskip("torch_fidelity")
    with pytest.raises(OSError, match=r"^inception_weights=.*nope\.pth does not exist — "):
        SampleQuality(features="inception", inception_weights=str(tmp_path / "nope.pth"))
