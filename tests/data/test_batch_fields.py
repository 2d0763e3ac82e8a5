"""Batch checks its fields as it is built: a user's DataModule yields it, and a list as x, an index of the wrong
length or a text label was found, if at all, deep inside training. Types and shapes only (it is built every
step); what the project itself builds (items, the DataLoader's stacking, pickling to and from workers, the
device move) is taken."""

import pickle

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset, default_collate

from diffusion import Batch, IndexedDataset
from diffusion.core.guidance import NO_LABEL

X = torch.rand(4, 2)


@pytest.mark.parametrize(
    ("fields", "error", "words"),
    [
        (([1, 2], torch.arange(2)), TypeError, r"^x=\[1, 2\] is a list, not a tensor of samples — "),
        ((X, torch.arange(3)), ValueError, r"^index holds 3 positions for 4 samples \(x of shape \(4, 2\)\) — "),
        ((X, torch.arange(4), "cat"), TypeError, r"^label='cat' is a str, not a class \(an int\) or integer "),
        ((X, torch.arange(4.0)), ValueError, r"^index is a torch.float32 tensor of shape \(4,\), not a 1-D integer"),
        ((X, torch.arange(4)[None]), ValueError, r"^index is a torch.int64 tensor of shape \(1, 4\), not a 1-D "),
        ((X, torch.arange(4), torch.rand(4)), ValueError, r"^label is a torch.float32 tensor of shape \(4,\), not "),
        ((X, torch.arange(4), torch.arange(3)), ValueError, r"^label is a torch.int64 tensor of shape \(3,\), not "),
        ((X, torch.tensor([True, False, True, True])), ValueError, r"^index is a torch.bool tensor"),
        ((X[0], "0"), TypeError, r"^index='0' is a str, not an int \(an item\) or a 1-D integer tensor"),
        ((X[0], 0, 1.5), TypeError, r"^label=1.5 is a float, not a class"),
        # round 25b's S2: an item's x no tensor (PIL images without a transform) ended in torch's collate error
        ((Image.new("L", (8, 8)), 0), TypeError, r"^x=<PIL.*> is an Image, not a tensor of one sample — make each "),
        ((None, 0), TypeError, r"^x=None is a NoneType, not a tensor of one sample"),
        (([0.0, 1.0], 0), TypeError, r"^x=\[0.0, 1.0\] is a list, not a tensor of one sample"),
    ],
    ids=["list-x", "short-index", "text-label", "float-index", "2-D-index", "float-labels", "short-labels",
         "bool-index", "text-item-index", "float-item-label", "pil-item", "none-item", "list-item"],
)  # fmt: skip
def test_fields_of_the_wrong_kind_or_length_are_refused_by_name(fields, error, words):
    with pytest.raises(error, match=words):
        Batch(*fields)


def test_what_the_project_builds_is_taken():
    items = IndexedDataset(TensorDataset(X, torch.tensor([0, 1, 0, 1])), with_labels=True)
    item = items[2]
    assert type(item) is Batch and item.x is not None and (item.index, item.label) == (2, 0)
    batch = next(iter(DataLoader(items, batch_size=4)))  # default_collate rebuilds the Batch from tensors
    assert (
        type(batch) is Batch and batch.index.tolist() == [0, 1, 2, 3] and batch.label.tolist() == [0, 1, 0, 1]
    )
    assert pickle.loads(pickle.dumps(batch)).index.tolist() == [0, 1, 2, 3]  # from a loader's worker
    assert type(move_data_to_device(batch, "cpu")) is Batch
    assert default_collate([Batch(x, i) for i, x in enumerate(X)]).label.tolist() == [NO_LABEL] * 4
    assert Batch(X, torch.arange(4)).label == NO_LABEL and Batch(X, torch.arange(4), None).label is None
    assert Batch(X, torch.arange(4, dtype=torch.int32), torch.zeros(4, dtype=torch.uint8)).x is X
    assert batch._replace(label=None).label is None
    assert (
        Batch(np.zeros((1, 8, 8), np.float32), 3).index == 3
    )  # a NumPy sample: the DataLoader makes it a tensor
