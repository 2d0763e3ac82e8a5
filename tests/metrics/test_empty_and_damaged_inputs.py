"""Inputs the metrics, the grid and a user's own dataset items took or failed on in torch's or Python's words
(round 24): an item's index as a 0-d tensor refused with a batch's fix, rows_by_class of no images ending in
max(), a damaged inception_weights file ending in torch's unpickling errors, SampleQuality fed no images and
BitsPerDim of infinite or negative bounds taken without a word."""

import pickle
import re

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from diffusion import Batch, BitsPerDim, SampleQuality, rows_by_class
from diffusion.data.batch import check_batch
from diffusion.errors import InvalidValue

X = torch.rand(4, 1, 8, 8) * 2 - 1
FIX = (
    r" — pass torch-fidelity's weights-inception-2015-12-05-6726825d.pth \(github.com/toshas/torch-fidelity "
    r"releases\), or leave inception_weights out to download it$"
)


# ---- S1: a dataset item's index -------------------------------------------------------------------------------
def test_an_items_index_as_a_0_d_integer_tensor_is_taken_as_its_int_and_trains():
    """docs/data.md: items are Batch(x, index); `torch.tensor(i)` was refused with the fix of a batch."""
    item = Batch(X[2], torch.tensor(2))
    assert item.index == 2 and isinstance(item.index, int)
    batch = default_collate([Batch(x, torch.tensor(i)) for i, x in enumerate(X)])  # the DataLoader's stacking
    assert type(batch) is Batch and batch.index.dtype == torch.int64 and batch.index.tolist() == [0, 1, 2, 3]
    assert check_batch(batch).index.tolist() == [0, 1, 2, 3]  # what training takes at its first step


def test_an_items_index_of_no_integer_is_refused_with_the_fix_of_an_item():
    with pytest.raises(InvalidValue, match=r"^index is a torch.float32 tensor of shape \(\), and an item's index "
                       r"is its position in the dataset, a whole number — pass the index as an int: int\(i\); "):  # fmt: skip
        Batch(X[0], torch.tensor(2.0))


@pytest.mark.parametrize("index", [lambda i, x: torch.tensor([i]), lambda i, x: torch.arange(len(x))],
                         ids=["tensor([i])", "arange(len(x))"])  # fmt: skip
def test_items_whose_index_is_a_1_element_tensor_are_said_as_items_at_the_stacking(index):
    """Taken per item (x (1, 8, 8) looks like a batch of one), stacked to (4, 1): the batch's fix sent the user
    round in a circle."""
    items = [Batch(x, index(i, x)) for i, x in enumerate(X)]
    with pytest.raises(InvalidValue, match=r"^index is a torch.int64 tensor of shape \(4, 1\), not a 1-D integer "
                       r"tensor: the DataLoader stacks such a column from items whose index is a 1-element tensor "
                       r"\(torch.tensor\(\[i\]\)\) — give each item its index as an int: Batch\(x, int\(i\)\) in "
                       r"your dataset's __getitem__ \(a batch: index.flatten\(\)\); "):  # fmt: skip
        default_collate(items)


# ---- S3: rows_by_class of no images ------------------------------------------------------------------------
def test_rows_by_class_of_no_images_is_refused_naming_images():
    empty = torch.zeros(0, 1, 8, 8, dtype=torch.uint8)
    with pytest.raises(InvalidValue, match=r"^images has shape \(0, 1, 8, 8\), which holds no pixels — pass at "
                       r"least one image$"):  # fmt: skip
        rows_by_class(empty, torch.zeros(0, dtype=torch.long))


# ---- S4: a damaged inception_weights file ------------------------------------------------------------------
class NotATensor:  # pickled into a torch.save archive: weights_only refuses it, unread
    pass


def write_weights(path, kind: str) -> None:
    if kind == "truncated":
        torch.save({"w": torch.zeros(1000)}, path)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "web page":
        path.write_text("<html>404 Not Found</html>")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "other weights":
        torch.save({"w": torch.zeros(1000)}, path)
    elif kind == "objects":
        torch.save({"w": NotATensor()}, path)
    elif kind == "pickle":  # pickle.dump's, not torch.save's: unpickling it could run code
        path.write_bytes(pickle.dumps({"w": NotATensor()}))
    elif kind == "npz":
        with path.open("wb") as file:
            np.savez(file, np.zeros(3))
    elif kind == "list":
        torch.save([torch.zeros(1)], path)
    elif kind == "checkpoint":
        torch.save({"state_dict": {"w": torch.zeros(1)}, "epoch": 3}, path)


WEIGHTS_CASES = {
    "truncated": r" is not a readable PyTorch weights file \(it is truncated: a zip archive, torch.save's format, "
    r"cut short\)",
    "web page": r" is not a readable PyTorch weights file \(neither torch.save's zip archive nor a pickle: it "
    r"starts with b'<html>404 Not Fo'\)",
    "empty": r" is not a readable PyTorch weights file \(it is empty: 0 bytes\)",
    "other weights": r": these weights do not fit InceptionV3 \(\d+ missing keys \(e.g. Conv2d_1a_3x3.conv.weight, "
    r".*\), 1 unexpected keys \(e.g. w\)\)",
    "objects": r" is not a readable PyTorch weights file \(it holds pickled objects other than tensors, which "
    r"could run code when loaded\)",
    "pickle": r" is not a readable PyTorch weights file \(it holds pickled objects other than tensors, which "
    r"could run code when loaded\)",
    "npz": r" is not a readable PyTorch weights file \(a zip archive torch.save did not write, such as "
    r"np.savez's .npz\)",
    "list": r" is not a readable PyTorch weights file \(it holds a list, not a state dict: names -> tensors\)",
    "checkpoint": r" is not a readable PyTorch weights file \(its entry 'state_dict' is a dict, not a tensor: a "
    r"state dict holds tensors alone\)",
}


@pytest.mark.parametrize(("kind", "words"), WEIGHTS_CASES.items(), ids=WEIGHTS_CASES.keys())
def test_a_damaged_or_foreign_inception_weights_file_is_refused_naming_inception_weights(
    kind, words, tmp_path
):
    """SampleQuality's line for each, naming the parameter and the file, where torch's PytorchStreamReader,
    UnpicklingError, EOFError or load_state_dict error named neither; what the evaluate command says of its flag."""
    pytest.importorskip("torch_fidelity")
    path = tmp_path / "inception.pth"
    write_weights(path, kind)
    with pytest.raises(
        InvalidValue, match=rf"^inception_weights {re.escape(str(path))}{words}{FIX}"
    ) as caught:
        SampleQuality(features="inception", metrics=("fid",), inception_weights=str(path))
    assert isinstance(caught.value, ValueError)


def test_weights_files_of_either_torch_save_format_are_read_whole(inception_weights, tmp_path):
    from diffusion.metrics.features import read_inception_weights

    state = read_inception_weights(inception_weights)
    assert tuple(state["fc.weight"].shape) == (1008, 2048)
    legacy = tmp_path / "legacy.pth"  # torch.save's format before torch 1.6: a pickle
    torch.save({"fc.bias": torch.ones(3)}, legacy, _use_new_zipfile_serialization=False)
    assert read_inception_weights(legacy)["fc.bias"].tolist() == [1.0, 1.0, 1.0]


# ---- noted: SampleQuality fed no images, BitsPerDim of rows no bound gives -----------------------------------
def test_sample_quality_refuses_no_images_naming_images():
    quality = SampleQuality("pixels", ["fid"], channels=1)
    with pytest.raises(InvalidValue, match=r"^images has shape \(0, 1, 8, 8\), which holds no pixels — pass at "
                       r"least one image$"):  # fmt: skip
        quality.update(torch.zeros(0, 1, 8, 8, dtype=torch.uint8), real=False)


def test_bits_per_dim_refuses_infinite_rows_naming_bounds():
    bounds = torch.tensor([[1.0, 1, 1, 2], [1, 1, 1, float("inf")]], dtype=torch.float64)
    with pytest.raises(InvalidValue, match=r"^bounds holds infinity in 1 of its 2 rows \(first row 1\), and their "
                       r"mean would be an infinite bits/dim: .* — evaluate finite weights: "):  # fmt: skip
        BitsPerDim.of(bounds)


def test_bits_per_dim_refuses_negative_bounds_and_takes_rounding():
    with pytest.raises(InvalidValue, match=r"^bounds holds negative values in 3 of its 3 rows \(first row 0, "
                       r"lowest -1\), and every term of the bound is >= 0 \(a KL divergence, or -log of a "
                       r"probability\) — pass the \(N, 4\) rows image_bounds returns"):  # fmt: skip
        BitsPerDim.of(-torch.ones(3, 4, dtype=torch.float64))
    rounded = torch.tensor([[-1e-12, 1.0, 0.5, 1.5], [0.0, 1.0, 0.5, 1.5]], dtype=torch.float64)
    assert BitsPerDim.of(rounded).bits_per_dim == pytest.approx(1.5)
