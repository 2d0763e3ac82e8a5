"""VectorDataModule's normalization: standardized per feature, robust to outliers, exactly invertible."""

import numpy as np
import pytest
import torch

from diffusion.data.vectors import VectorDataModule, feature_scaling
from diffusion.generation.render import denormalize


def _bulk_with_outliers(tmp_path, outlier: float = 1000.0):
    """1,000 points of N(0, 1) in two features plus 5 far outliers on the first one, saved as .npy."""
    data = np.random.default_rng(0).standard_normal((1005, 2))
    data[-5:, 0] = outlier
    path = tmp_path / "points.npy"
    np.save(path, data)
    return data, str(path)


def test_outliers_do_not_squeeze_the_bulk(tmp_path):
    data, path = _bulk_with_outliers(tmp_path)
    standardized = VectorDataModule(path=path, feature_std=1.0).data[:1000]
    assert ((standardized.std(0) - 1).abs() < 0.1).all()  # the bulk keeps unit scale
    assert standardized.mean(0).abs().max() < 0.1  # and its center
    squeezed = VectorDataModule(path=path, normalize="minmax").data[:1000]
    assert squeezed[:, 0].std() < 0.01 < squeezed[:, 1].std()  # min-max: 1/500 of the outlier's range


@pytest.mark.parametrize("normalize", ["standardize", "minmax"])
def test_normalization_maps_back_to_data_units(tmp_path, normalize):
    data, path = _bulk_with_outliers(tmp_path)
    dm = VectorDataModule(path=path, normalize=normalize)
    assert set(dm.normalization) == {"shift", "scale"} and len(dm.normalization["scale"]) == 2
    restored = denormalize(dm.data.double(), dm.normalization)  # data = model * scale + shift
    np.testing.assert_allclose(restored.numpy(), data, rtol=1e-5, atol=1e-4)


def test_feature_std_sets_the_spread_in_model_units(tmp_path):
    data, path = _bulk_with_outliers(tmp_path)
    unit, triple = VectorDataModule(path=path, feature_std=1.0), VectorDataModule(path=path, feature_std=3.0)
    torch.testing.assert_close(triple.data, 3 * unit.data)
    np.testing.assert_allclose(
        denormalize(triple.data.double(), triple.normalization).numpy(), data, atol=1e-4
    )
    assert VectorDataModule(path=path).feature_std == 3.0  # the default
    with pytest.raises(ValueError, match="feature_std=0 must be a finite number > 0"):
        VectorDataModule(path=path, feature_std=0)


def test_degenerate_features_get_a_finite_scale():
    data = np.zeros((1000, 3))
    data[:, 1] = 7.0  # constant
    data[:5, 2] = 1.0  # constant on its central 98%, not beyond
    data[:, 0] = np.random.default_rng(0).standard_normal(1000)
    shift, scale = feature_scaling(data, "standardize")
    assert scale[1] == 1.0 and shift[1] == 7.0  # maps to 0
    assert scale[2] == pytest.approx(data[:, 2].std())
    assert np.isfinite((data - shift) / scale).all()


def test_bad_normalize_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match=r"normalize 'zscore'.*'standardize', 'minmax'"):
        VectorDataModule("moons", num_samples=10, normalize="zscore")


def test_toy_data_is_standardized_and_deterministic():
    dm = VectorDataModule("swiss_roll", num_samples=2000)
    assert torch.equal(dm.data, VectorDataModule("swiss_roll", num_samples=2000).data)
    assert dm.normalize == "standardize" and dm.data.abs().max() < 4 * dm.feature_std


def test_labels_that_number_far_more_classes_than_samples_are_refused_naming_the_label(tmp_path):
    """A label of 2**40 (IDs used as labels) made a class embedding of 2**40 rows: a 70 TB allocation."""
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(100, 2)))
    labels = np.arange(100) % 3
    for top, taken in ((1023, True), (1024, False), (2**40, False)):
        labels[-1] = top
        np.save(tmp_path / "y.npy", labels)
        make = lambda: VectorDataModule(path=str(tmp_path / "x.npy"), labels=str(tmp_path / "y.npy"))  # noqa: E731
        if taken:  # a few samples of many classes: up to 1024 whatever the sample count
            assert make().num_classes == 1024
            continue
        with pytest.raises(ValueError, match=f"labels {tmp_path / 'y.npy'} holds the label {top}: .* too many for 100 "
                           "samples \\(at most 1,024\\) — number the classes 0..K-1"):  # fmt: skip
            make()


@pytest.mark.parametrize("dataset", ["moons", "swiss_roll", "gaussian"])
def test_labels_of_points_drawn_at_random_are_refused(dataset, tmp_path):
    # Round 25b's S1: a labels file beside generated moons trained a conditional model on classes of nothing
    np.save(tmp_path / "y.npy", np.arange(40) % 3)
    with pytest.raises(ValueError) as refused:
        VectorDataModule(dataset, num_samples=40, labels=str(tmp_path / "y.npy"))
    assert str(refused.value) == (
        f"labels {tmp_path / 'y.npy'} gives classes of samples of your own data (path), and dataset {dataset!r} "
        "draws its points at random: the file's classes would say nothing of them — pass path with the (N, D) "
        "array the labels belong to, or leave labels out"
    )


@pytest.mark.parametrize("name", ["path", "labels"])
def test_an_array_where_its_file_goes_is_refused_naming_the_argument(name, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((10, 2)) + np.arange(10)[:, None])
    given = {"path": str(tmp_path / "x.npy"), name: np.zeros((10, 2))}
    with pytest.raises(
        TypeError, match=f"^{name}=<ndarray> is a ndarray, not the path of .* — save the array with np.save"
    ):
        VectorDataModule(**given)


@pytest.mark.parametrize(
    ("options", "note"),
    [
        ({"dataset": "moons", "dim": 7, "num_samples": 5, "path": True},
         r"^dataset='moons', num_samples=5 and dim=7 not used: path='.*x.npy' selects dataset 'npy', whose data is "
         r"read from that file — leave them out, or leave path out to generate dataset 'moons'$"),
        ({"noise": 0.2, "path": True}, r"^noise=0.2 not used: path=.* — leave it out, or leave path out to generate "),
        ({"dataset": "moons", "dim": 3, "num_samples": 50}, r"^dim=3 not used: dataset 'moons' does not take it — leave it out "),
        ({"dataset": "gaussian", "dim": 3, "noise": 0.1, "num_samples": 50}, r"^noise=0.1 not used: dataset 'gaussian' does not take it"),
    ],
    ids=["path-over-a-toy-set", "noise-of-a-file", "dim-of-a-toy-set", "noise-of-gaussian"],
)  # fmt: skip
def test_options_the_data_does_not_use_are_said_not_used(options, note, tmp_path):
    # A file's data took no dataset, dim, num_samples or noise, and said nothing of them.
    np.save(tmp_path / "x.npy", np.zeros((10, 2)) + np.arange(10)[:, None])
    if options.pop("path", False):
        options["path"] = str(tmp_path / "x.npy")
    with pytest.warns(UserWarning, match=note):
        VectorDataModule(**options)


def test_options_the_data_uses_are_taken_without_a_note(tmp_path, recwarn):
    np.save(tmp_path / "x.npy", np.zeros((10, 2)) + np.arange(10)[:, None])
    VectorDataModule(path=str(tmp_path / "x.npy"))
    VectorDataModule("gaussian", dim=3, num_samples=50)
    VectorDataModule("moons", noise=0.1, num_samples=50)
    assert not [w for w in recwarn if "not used" in str(w.message)]


@pytest.mark.parametrize(
    ("options", "error", "line"),
    [
        ({"noise": float("nan")}, ValueError, r"^noise=nan must be a finite number >= 0 — "),
        ({"noise": float("inf")}, ValueError, r"^noise=inf must be a finite number >= 0 — "),
        ({"noise": "0.1"}, TypeError, r"^noise='0.1' is a str, not a number — "),
        ({"feature_std": float("inf")}, ValueError, r"^feature_std=inf must be a finite number > 0 — "),
        ({"num_samples": 2.5}, ValueError, r"^num_samples=2.5 must be a whole number >= 2 — "),
        ({"num_samples": 100.5, "dataset": "8gaussians"}, ValueError, r"^num_samples=100.5 must be a whole number"),
        ({"num_samples": 2.0}, ValueError, r"^num_samples=2.0 must be a whole number >= 2 — "),
        ({"dim": 2.5, "dataset": "gaussian"}, ValueError, r"^dim=2.5 must be a whole number >= 1 — "),
    ],
    ids=["nan-noise", "infinite-noise", "text-noise", "infinite-feature-std", "fractional-count",
         "fractional-count-8gaussians", "integral-float-count", "fractional-dim"],
)  # fmt: skip
def test_numbers_that_cannot_be_generated_are_refused_by_name(options, error, line):
    # NaN noise gave an all-NaN set without a word; a fractional count failed in sklearn's words (n_samples).
    with pytest.raises(error, match=line):
        VectorDataModule(**{"dataset": "moons", **options})
