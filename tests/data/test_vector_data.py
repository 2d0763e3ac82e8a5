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
    with pytest.raises(ValueError, match="feature_std=0 must be > 0"):
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
