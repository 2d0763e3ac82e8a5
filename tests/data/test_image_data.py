"""Data modules: offline only (scikit-learn's bundled digits and files written into tmp_path)."""

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import get_args
from urllib.error import URLError

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from sklearn.datasets import load_digits
from torch.utils.data import DistributedSampler, TensorDataset
from torchvision import datasets

from diffusion.cli.reporting import is_user_error
from diffusion.data.batch import Batch, check_batch
from diffusion.data.images import TORCHVISION, ImageDataModule, ImageDatasetName
from diffusion.data.vectors import VectorDataModule
from diffusion.generation.render import denormalize, to_uint8_images


def _all_items(dm):
    return [dm.train_set[i] for i in range(len(dm.train_set))], [
        dm.val_set[i] for i in range(len(dm.val_set))
    ]


@pytest.fixture(scope="module")
def digits():
    dm = ImageDataModule("digits", seed=0)
    dm.setup("fit")
    return dm


def test_digits_items_shapes_and_range(digits):
    assert digits.sample_shape == (1, 8, 8)  # their own grid
    assert digits.normalization == {"shift": [0.5], "scale": [0.5]}
    train, val = _all_items(digits)
    assert len(train) + len(val) == 1797 and len(val) == round(1797 * 0.05)
    x, index, _ = train[0]
    assert x.dtype == torch.float32 and x.shape == (1, 8, 8) and isinstance(index, int)
    stacked = torch.stack([x for x, *_ in train + val])
    assert stacked.min() == -1 and stacked.max() == 1
    # Index is the position in the full dataset: train/val disjoint, together 0..1796.
    train_idx, val_idx = {i for _, i, _ in train}, {i for _, i, _ in val}
    assert not train_idx & val_idx and train_idx | val_idx == set(range(1797))
    full = digits.train_set.dataset
    for pos in (0, 5, 100):
        x, index, _ = digits.train_set[pos]
        assert index == digits.train_set.indices[pos] and torch.equal(x, full[index][0])


def test_digits_are_the_originals_and_area_averaging_recovers_them_from_a_larger_size(digits):
    original = torch.from_numpy(load_digits().images / 16 * 2 - 1).float().unsqueeze(1)
    assert torch.equal(torch.stack([digits.train_set.dataset[i][0] for i in range(1797)]), original)
    larger = ImageDataModule("digits", seed=0, image_size=16)
    larger.setup("fit")
    x = torch.stack([larger.train_set.dataset[i][0] for i in range(1797)])  # (N, 1, 16, 16)
    assert x.shape == (1797, 1, 16, 16) and torch.equal(F.avg_pool2d(x, 2), original)


def test_digits_split_depends_only_on_seed(digits):
    same, other = ImageDataModule("digits", seed=0), ImageDataModule("digits", seed=1)
    same.setup("fit")
    other.setup("fit")
    assert same.val_set.indices == digits.val_set.indices
    assert other.val_set.indices != digits.val_set.indices


@pytest.mark.parametrize("on_device", [True, False], ids=["held on the device", "per-item loader"])
def test_training_batches_are_indexed(on_device):
    digits = ImageDataModule("digits", seed=0, on_device=on_device)
    x, index, _ = next(digits.training_batches())
    assert x.shape == (64, 1, 8, 8) and index.dtype == torch.int64 and index.shape == (64,)


def test_train_sampler_matches_lightnings_ddp_sampler(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "3")  # what seed_everything(3) sets
    dm = VectorDataModule("moons", num_samples=100)
    dm.setup("fit")
    for world_size, rank in [(1, 0), (2, 1)]:
        dm.trainer = SimpleNamespace(world_size=world_size, global_rank=rank)
        sampler = dm.train_dataloader().sampler
        # A DistributedSampler, so Lightning injects none; the very order it would inject (seed PL_GLOBAL_SEED).
        lightnings = DistributedSampler(
            dm.train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=3
        )
        assert isinstance(sampler, DistributedSampler) and list(sampler) == list(lightnings)
    dm.trainer = None
    assert dm.train_dataloader().sampler.num_replicas == 1


def test_val_fraction_zero_disables_validation():
    dm = VectorDataModule("moons", num_samples=50, val_fraction=0)
    dm.setup("fit")
    assert len(dm.train_set) == 50 and dm.val_dataloader() == []


def test_val_from_train_trains_on_everything_and_validates_on_a_fixed_subset():
    dm = ImageDataModule("digits", val_fraction=0, val_from_train=100, seed=0)
    dm.setup("fit")
    assert dm.train_set.indices == list(range(1797))  # all of it, nothing held out
    assert len(dm.val_set) == 100 and set(dm.val_set.indices) < set(dm.train_set.indices)
    again, other = (
        ImageDataModule("digits", val_fraction=0, val_from_train=100, seed=0),
        ImageDataModule("digits", val_fraction=0, val_from_train=100, seed=1),
    )
    again.setup("fit")
    other.setup("fit")
    assert again.val_set.indices == dm.val_set.indices != other.val_set.indices
    assert torch.equal(dm.val_set[0][0], dm.train_set[dm.val_set.indices[0]][0])
    with pytest.raises(ValueError, match="val_fraction 0"):
        ImageDataModule("digits", val_from_train=100)  # the default val_fraction 0.05 would hold some out
    with pytest.raises(ValueError, match="val_from_train=0 must be >= 1"):
        ImageDataModule("digits", val_fraction=0, val_from_train=0)
    too_many = ImageDataModule("digits", val_fraction=0, val_from_train=5000)
    with pytest.raises(ValueError, match="5000 is more than the 1797"):
        too_many.setup("fit")


def test_cifar10_recipe_trains_on_all_50000_images(tmp_path):
    import yaml

    config = yaml.safe_load((Path(__file__).parents[2] / "configs" / "cifar10.yaml").read_text())["data"]
    assert config["class_path"] == "diffusion.data.ImageDataModule"
    dm = ImageDataModule(**{**config["init_args"], "root": str(tmp_path)})
    dm._split(TensorDataset(torch.zeros(50_000, 1)))  # stands in for the 50,000 CIFAR-10 training images
    assert len(dm.train_set) == 50_000 and 0 < len(dm.val_set) <= 2_000


def test_torchvision_shapes_known_without_download(tmp_path):
    root = str(tmp_path / "missing")
    assert ImageDataModule("mnist", root=root).sample_shape == (1, 28, 28)
    assert ImageDataModule("fashion_mnist", root=root, image_size=32).sample_shape == (1, 32, 32)
    cifar = ImageDataModule("cifar10", root=root)
    assert cifar.sample_shape == (3, 32, 32) and cifar.random_flip
    assert cifar.normalization == {"shift": [0.5] * 3, "scale": [0.5] * 3}


def test_the_dataset_names_are_the_torchvision_entries():
    # ImageDatasetName is written out for the type checker: a TORCHVISION entry needs its name there too.
    assert get_args(ImageDatasetName) == ("digits", *TORCHVISION, "folder", "streaming")


def _write_fake_mnist(root, n=6):
    """MNIST's raw idx files (what prepare_data would download), tiny and random."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    images = np.random.default_rng(0).integers(0, 256, (n, 28, 28), dtype=np.uint8)
    for split in ("train", "t10k"):
        header = np.array([2051, n, 28, 28], dtype=">i4").tobytes()
        (raw / f"{split}-images-idx3-ubyte").write_bytes(header + images.tobytes())
        header = np.array([2049, n], dtype=">i4").tobytes()
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(header + bytes(n))
    return images


def test_mnist_setup_from_local_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare_data"):
        ImageDataModule("mnist", root=str(tmp_path)).setup("fit")
    images = _write_fake_mnist(tmp_path)
    dm = ImageDataModule("mnist", root=str(tmp_path), val_fraction=0)
    dm.setup("fit")
    x, index, _ = dm.train_set[3]
    assert type(x) is torch.Tensor and index == 3
    assert torch.allclose(
        x, torch.from_numpy(images[3]).float().div(255).mul(2).sub(1).unsqueeze(0), atol=1e-6
    )
    resized = ImageDataModule("mnist", root=str(tmp_path), image_size=32, val_fraction=0)
    resized.setup("fit")
    assert resized.train_set[0][0].shape == (1, 32, 32)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dataset": "imagenet"}, "imagenet.*digits"),
        ({"image_size": 4}, r"image_size=4 must be >= 8 — pass image_size 8 or more"),
        (
            {"dataset": "cifar10", "channels": 1},
            "channels 1 does not fit dataset .cifar10., whose images have 3 channels",
        ),
        ({"val_fraction": 1.0}, "val_fraction"),
        (
            {"val_fraction": 1.5},
            r"val_fraction=1.5 must be in \[0, 1\) — pass .* val_fraction 0.05",
        ),
        ({"num_workers": -1}, r"num_workers=-1 must be >= 0 — pass num_workers 0"),
        ({"val_from_train": 0, "val_fraction": 0}, r"val_from_train=0 must be >= 1 .* — pass a count"),
        ({"dataset": "folder"}, "needs an image size — set image_size"),
    ],
)
def test_image_options_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ImageDataModule(**kwargs)


def _write_images(folder):
    (folder / "sub").mkdir(parents=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(
        folder / "a.png"
    )
    Image.fromarray(np.full((40, 25), 255, dtype=np.uint8), mode="L").save(folder / "sub" / "b.PNG")
    (folder / "notes.txt").write_text("not an image")


@pytest.mark.parametrize("channels", [None, 1])
def test_folder_images(tmp_path, channels):
    _write_images(tmp_path)
    dm = ImageDataModule("folder", root=str(tmp_path), image_size=12, channels=channels, val_fraction=0)
    c = channels or 3
    assert dm.sample_shape == (c, 12, 12)
    dm.setup("fit")
    assert len(dm.train_set) == 2
    for x, *_ in (dm.train_set[0], dm.train_set[1]):
        assert type(x) is torch.Tensor and x.shape == (c, 12, 12) and x.dtype == torch.float32
        assert x.min() >= -1 and x.max() <= 1
    assert torch.all(dm.train_set[1][0] == 1)  # the white grayscale image


def test_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope does not exist — point root at your images"):
        ImageDataModule("folder", root=str(tmp_path / "nope"), image_size=16)
    (tmp_path / "points.npy").write_bytes(b"")  # a file exists: "does not exist" was false
    with pytest.raises(
        ValueError, match=r"^root .*points.npy is a file, not a folder of images — point root at the"
    ):
        ImageDataModule("folder", root=str(tmp_path / "points.npy"), image_size=16)
    (tmp_path / "points.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"\.png.* — put your images there, or point root at"):
        ImageDataModule("folder", root=str(tmp_path), image_size=16)
    (tmp_path / "broken.png").write_bytes(b"definitely not a png")
    dm = ImageDataModule("folder", root=str(tmp_path), image_size=16, val_fraction=0)
    dm.setup("fit")
    with pytest.raises(ValueError, match="broken.png"):
        dm.train_set[0]


def test_folder_16_bit_images_are_scaled_and_float_images_refused(tmp_path):
    # PIL's convert() clips rather than scales: 16-bit came out almost white, float in [0, 1] black.
    ramp = np.linspace(0, 65535, 16 * 16).round().astype(np.uint16).reshape(16, 16)
    Image.fromarray(ramp).save(tmp_path / "deep.png")  # opens as PIL mode I;16
    assert Image.open(tmp_path / "deep.png").mode == "I;16"
    for channels in (1, 3):
        dm = ImageDataModule("folder", root=str(tmp_path), image_size=16, channels=channels, val_fraction=0)
        dm.setup("fit")
        expected = torch.from_numpy(np.round(ramp / 257) / 255 * 2 - 1).float()  # 16 bits -> 8, then [-1, 1]
        assert torch.allclose(dm.train_set[0][0], expected.expand(channels, 16, 16), atol=1e-6)
    Image.fromarray(np.full((16, 16), 0.5, np.float32)).save(tmp_path / "float.tif")  # PIL mode F
    dm = ImageDataModule("folder", root=str(tmp_path), image_size=16, val_fraction=0, verify=True)
    with pytest.raises(
        ValueError, match=r"float\.tif has floating-point pixels .* — save it as an 8- or 16-bit"
    ):
        dm.prepare_data()


@pytest.mark.parametrize(
    "dataset, cls, error, where",
    [
        ("mnist", datasets.MNIST, RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried https://x/"),
         "MNIST/raw"),
        ("fashion_mnist", datasets.FashionMNIST, RuntimeError("Error downloading x.gz"), "FashionMNIST/raw"),
        ("cifar10", datasets.CIFAR10, URLError("[Errno -2] Name or service not known"), "cifar-10-python"),
    ],
)  # fmt: skip
def test_a_failed_download_says_where_to_put_the_files(tmp_path, monkeypatch, dataset, cls, error, where):
    def offline(self, *args, **kwargs):  # what torchvision raises without a network
        raise error

    monkeypatch.setattr(cls, "download", offline)
    dm = ImageDataModule(dataset, root=str(tmp_path))
    with pytest.raises(
        OSError, match=rf"could not download {dataset} into .* — check the network.*{where}"
    ) as info:
        dm.prepare_data()
    assert is_user_error(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["swiss_roll", "moons", "8gaussians"])
def test_toy_sets(name):
    dm = VectorDataModule(name, num_samples=500)
    assert dm.sample_shape == (2,) and dm.data.shape == (500, 2)
    # Standardized: about zero mean and std feature_std per feature (winsorized statistics, so not exactly).
    assert dm.data.mean(0).abs().max() < 0.15 and ((dm.data.std(0) / dm.feature_std - 1).abs() < 0.1).all()
    assert torch.equal(dm.data, VectorDataModule(name, num_samples=500).data)  # deterministic from seed


def test_gaussian_dim():
    dm = VectorDataModule("gaussian", num_samples=200, dim=7)
    assert dm.sample_shape == (7,) and len(dm.normalization["shift"]) == 7


def test_npy_round_trip(tmp_path):
    original = np.random.default_rng(0).normal(3.0, 2.0, (100, 5)).astype(np.float32)
    original[:, 4] = 7.0  # a constant feature
    path = tmp_path / "points.npy"
    np.save(path, original)
    dm = VectorDataModule("swiss_roll", path=str(path))  # path wins over dataset
    assert dm.dataset == "npy" and dm.sample_shape == (5,)
    assert torch.allclose(denormalize(dm.data, dm.normalization), torch.from_numpy(original), atol=1e-5)
    dm.setup("fit")
    x, index, _ = dm.train_set[0]
    assert x.shape == (5,) and torch.equal(x, dm.data[index])


@pytest.mark.parametrize(
    "array, error, match",
    [
        (np.zeros(10), ValueError, r"shape \(10,\), expected \(N, D\)"),
        (np.zeros((4, 2, 2)), ValueError, "expected \\(N, D\\)"),
        (np.array([[0.0, 1.0], [np.nan, 2.0]]), ValueError, "NaN"),
        (np.array([["a", "b"], ["c", "d"]]), ValueError, "dtype"),
    ],
)
def test_npy_errors(tmp_path, array, error, match):
    path = tmp_path / "bad.npy"
    np.save(path, array)
    with pytest.raises(error, match=match):
        VectorDataModule(path=str(path))


def test_npy_missing_or_unreadable(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing.npy does not exist — pass an \(N, D\) array"):
        VectorDataModule(path=str(tmp_path / "missing.npy"))
    (tmp_path / "text.npy").write_text("1,2,3")
    with pytest.raises(ValueError, match=r"text.npy is not a \.npy file or an \.npz archive — .*np.save"):
        VectorDataModule(path=str(tmp_path / "text.npy"))
    (tmp_path / "a.csv").write_text("1,2\n3,4\n")
    with pytest.raises(
        ValueError, match=r"a.csv is not a \.npy file or an \.npz archive — .*np.loadtxt"
    ) as info:
        VectorDataModule(path=str(tmp_path / "a.csv"))
    assert "pickle" not in str(info.value)
    np.save(tmp_path / "objects.npy", np.array([[1, None]], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"objects.npy holds Python objects .* — .* as float or int"):
        VectorDataModule(path=str(tmp_path / "objects.npy"))
    np.save(tmp_path / "cut.npy", np.zeros((100, 3)))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "cut.npy").read_bytes()[:500])
    with pytest.raises(ValueError, match=r"cut.npy is truncated or corrupt .* — "):
        VectorDataModule(path=str(tmp_path / "cut.npy"))
    with pytest.raises(ValueError, match="set path to an"):
        VectorDataModule("npy")


def test_to_uint8_images():
    x = torch.tensor([-1.0, 1.0, 0.0, 2.0]).view(1, 1, 2, 2).expand(3, 3, 2, 2)
    images = to_uint8_images(x, {"shift": [0.5] * 3, "scale": [0.5] * 3})
    assert images.dtype == np.uint8 and images.shape == (3, 2, 2, 3)
    assert images[0, :, :, 0].tolist() == [[0, 255], [128, 255]]


def test_batches_are_typed_and_a_foreign_batch_is_refused_with_a_clear_error(digits):
    batch = next(digits.training_batches())
    assert isinstance(batch, Batch) and batch.index.dtype == torch.int64
    # A user's DataModule yielding (image, label): labels would silently become noise seeds without the check.
    images, labels = batch.x, torch.zeros(len(batch.x), dtype=torch.long)
    assert check_batch(Batch(images, labels)).x is images
    with pytest.raises(TypeError, match=r"Batch\(x, index\), got tuple.*IndexedDataset"):
        check_batch((images, labels))


@pytest.mark.parametrize("root", [np.zeros((4, 8, 8, 3), np.uint8), None])
def test_a_root_that_is_no_path_is_refused_naming_it(root):
    with pytest.raises(TypeError, match="^root=.* not the path of a folder — pass the path of the folder"):
        ImageDataModule("folder", root=root, image_size=8)


def test_a_root_given_to_the_bundled_digits_is_refused_where_it_holds_images_and_said_otherwise(tmp_path):
    """Round 19b's Q4: ImageDataModule(root=FOLDER) (or train.py --data.root FOLDER) without dataset 'folder' trained
    on the digits without a word."""
    (tmp_path / "imgs" / "cats").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "imgs" / "cats" / "a.png")
    with pytest.raises(ValueError) as refused:
        ImageDataModule(root=str(tmp_path / "imgs"), image_size=8)
    assert str(refused.value) == (
        f"root {tmp_path / 'imgs'} holds images, and dataset 'digits' (the default) does not read root: the digits are "
        "bundled with scikit-learn — to train on those images pass dataset folder and image_size (configs/folder.yaml "
        "sets them), or leave root out to train on the digits"
    )
    with pytest.warns(
        UserWarning, match=r"^root='.*empty' not used: dataset 'digits' is bundled with scikit-learn"
    ):
        ImageDataModule(root=str(tmp_path / "empty"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ImageDataModule(root="data")  # the default, written out
        ImageDataModule("folder", root=str(tmp_path / "imgs"), image_size=8)
