"""The reference helpers evaluate and phema call check their arguments at entry, as the public functions do
(tests/test_public_api_arguments.py): num_reference=-3 was all but 3 images (a Python slice), 0 numpy's "need at
least one array to concatenate", and save_statistics(path, "stats") an AttributeError (tester round 15b: S7)."""

import numpy as np
import pytest
from helpers import assert_refused_by_name

from diffusion.metrics.image_sets import load_reference
from diffusion.metrics.reference_stats import FeatureStatistics, load_statistics, save_statistics

CASES = [
    ("reference-negative", lambda: load_reference("digits", 8, 1, num_reference=-3), ValueError, "num_reference=-3"),
    ("reference-zero", lambda: load_reference("digits", 8, 1, num_reference=0), ValueError, "num_reference=0"),
    ("reference-one", lambda: load_reference("digits", 8, 1, num_reference=1), ValueError, "num_reference=1"),
    ("reference-fraction", lambda: load_reference("digits", 8, 1, num_reference=2.5), ValueError, "num_reference"),
    ("reference-text", lambda: load_reference("digits", 8, 1, num_reference="5"), TypeError, "num_reference"),
    ("reference-bool", lambda: load_reference("digits", 8, 1, num_reference=True), TypeError, "num_reference"),
    ("stats-text", lambda: save_statistics("st.npz", "stats"), TypeError, "stats"),
    ("stats-array", lambda: save_statistics("st.npz", np.zeros(3)), TypeError, "stats"),
    ("stats-path-number", lambda: save_statistics(3, FeatureStatistics(np.zeros(2), np.eye(2))), TypeError, "path"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "argument"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_reference_argument_is_refused_by_its_name(call, error, argument, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what a call not refused would write lands here
    assert_refused_by_name(call, error, argument, tmp_path)


def test_good_reference_arguments_are_taken(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (5, 8, 8, 1), dtype=np.uint8)
    np.savez(tmp_path / "ref.npz", images)
    assert load_reference(str(tmp_path / "ref.npz"), 8, 1, num_reference=np.int64(2)).shape == (2, 8, 8, 1)
    assert load_reference(str(tmp_path / "ref.npz"), 8, 1, num_reference=None).shape == (5, 8, 8, 1)
    stats = FeatureStatistics(np.zeros(2), np.eye(2))
    saved = save_statistics(tmp_path / "st.npz", stats)
    np.testing.assert_array_equal(load_statistics(saved).sigma, np.eye(2))
