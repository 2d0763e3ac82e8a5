"""`diffusion.data.preparing.prepare` checks its arguments at entry, as the command's parser checks its flags:
encoding="webp" stored JPEG and recorded "webp", seed=-4 was recorded, overwrite="yes" taken as True, a name for
the data module ended in an AttributeError and num_workers=-1 in litdata's traceback (tester round 15b: S6)."""

import pytest
from helpers import assert_refused_by_name

from diffusion import ImageDataModule, VectorDataModule
from diffusion.data.preparing import check_prepare_arguments, prepare

CASES = [
    ("encoding-unknown", {"encoding": "webp"}, ValueError, "encoding='webp'"),
    ("seed-negative", {"seed": -4}, ValueError, "seed=-4"),
    ("seed-beyond-torch", {"seed": 2**64}, ValueError, "seed="),
    ("seed-fraction", {"seed": 1.5}, ValueError, "seed=1.5"),
    ("seed-text", {"seed": "3"}, TypeError, "seed"),
    ("overwrite-text", {"overwrite": "yes"}, TypeError, "overwrite"),
    ("overwrite-number", {"overwrite": 1}, TypeError, "overwrite"),
    ("workers-negative", {"num_workers": -1}, ValueError, "num_workers=-1"),
    ("workers-zero", {"num_workers": 0}, ValueError, "num_workers=0"),
    ("workers-text", {"num_workers": "2"}, TypeError, "num_workers"),
    ("datamodule-name", {"datamodule": "digits"}, TypeError, "datamodule"),
    ("datamodule-none", {"datamodule": None}, TypeError, "datamodule"),
]


@pytest.mark.parametrize(("given", "error", "argument"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_prepare_argument_is_refused_by_its_name(given, error, argument, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arguments = {"datamodule": ImageDataModule(), "out": "prep", **given}
    assert_refused_by_name(lambda: prepare(**arguments), error, argument, tmp_path)


def test_good_prepare_arguments_are_taken():
    for encoding in ("auto", "raw", "png", "jpeg"):
        check_prepare_arguments(ImageDataModule(), encoding, 0, None, False)
    check_prepare_arguments(VectorDataModule(), "auto", 2**64 - 1, 1, True)
