"""Class labels of class-conditional models: where they come from (a dataset's own classes, an image folder's
subfolders, a ``.npy`` file beside vector data), the label each generated sample asks for, and their check.

`NO_LABEL` (defined with the networks' class embedding) marks a sample without a class: unlabelled data, labels
dropped for classifier-free guidance, and the unconditional half of a guided forward.
"""

from numbers import Integral
from pathlib import Path
from typing import Any

import numpy as np
import torch

from diffusion.core.guidance import NO_LABEL
from diffusion.data.file_in_folder import FileKind, file_in_folder
from diffusion.data.numpy_files import read_array
from diffusion.errors import InvalidValue, OutOfRange, UserError, WrongType, check_whole_number

LABELS_FILE = FileKind("labels file", ("*.npy",), "np.save(path, labels.astype(np.int64)) writes one")
# As many classes as this are taken whatever the sample count (a few samples of many classes).
FEW_CLASSES = 1024
MAX_CLASSES = 2**20  # the network holds a row of weights per class: a million rows is already gigabytes


def folder_classes(root: Path, files: list[Path]) -> tuple[list[int], list[str]]:
    """(label of every file, class names): the class of a file is its first-level subfolder under ``root``
    (torchvision's ImageFolder convention: ``root/<class>/.../image.png``), classes numbered in sorted order."""
    folders = [
        path.relative_to(root).parts[0] if len(path.relative_to(root).parts) > 1 else None for path in files
    ]
    loose = [path for path, folder in zip(files, folders, strict=True) if folder is None]
    if loose:
        raise InvalidValue(
            f"{{--conditional}} true reads classes from subfolders (root/<class>/image.png), but {len(loose)} "
            f"image(s) lie directly in {root}, e.g. {loose[0].name}",
            "move them into a class folder",
        )
    names = sorted({folder for folder in folders if folder is not None})  # none is None past the check above
    index = {name: i for i, name in enumerate(names)}
    return [index[folder] for folder in folders if folder is not None], names


def load_labels(path: Path, num_samples: int) -> np.ndarray:
    """N integer class labels 0..K-1 from a ``.npy`` file, as int64, with errors that say what is wrong."""
    path = file_in_folder(path, "{--labels}", LABELS_FILE)
    # The one reader of users' arrays: a missing, empty or foreign file is refused as every command refuses it.
    labels = np.asarray(
        read_array(path, "{--labels}", "save them with np.save(path, labels.astype(np.int64))")[0]
    )
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise InvalidValue(
            f"{{--labels}} {path} must hold N integers (shape (N,), an integer dtype), got "
            f"{getattr(labels, 'dtype', type(labels).__name__)} {getattr(labels, 'shape', '')}",
            "save them with np.save(path, labels.astype(np.int64))",
        )
    if len(labels) != num_samples:
        raise InvalidValue(
            f"{{--labels}} {path} has {len(labels)} labels for {num_samples} samples",
            "give one per sample",
        )
    if labels.min() < 0:
        raise InvalidValue(
            f"{{--labels}} {path} has negative labels (min {labels.min()})",
            "classes are 0..K-1",
        )
    top, most = int(labels.max()), most_classes(num_samples)
    if top >= most:  # IDs used as labels: a class embedding of as many rows would not fit any memory
        raise InvalidValue(
            f"{{--labels}} {path} holds the label {top}: classes are numbered 0..K-1, and {top + 1:,} "
            f"classes are too many for {num_samples:,} samples (at most {most:,})",
            "number the classes 0..K-1 (np.unique(labels, return_inverse=True)[1] does), or pass this data's labels",
        )
    return labels.astype(np.int64)


def most_classes(num_samples: int) -> int:
    """The most classes labels of `num_samples` samples may number: one per sample (a class with no sample cannot
    be learned), at least FEW_CLASSES, at most MAX_CLASSES."""
    return min(MAX_CLASSES, max(num_samples, FEW_CLASSES))


def class_labels(
    num_samples: int,
    num_classes: int | None,
    class_label: int | str | None = None,
    class_names: list[str] | None = None,
) -> torch.Tensor | None:
    """Labels (num_samples,) int64 of samples 0..num_samples-1 of a model with `num_classes` classes:

    - class_label None or "all": classes in turn, sample i of class i % num_classes (a function of the index
      alone, so sample i is the same whatever num_samples, batch size or number of ranks);
    - an index K (or a string of one, or one of `class_names`): every sample of class K.

    None for an unconditional model (num_classes None) when no class is asked for; asking one is an error.
    """
    num_samples = check_whole_number("num_samples", num_samples, 1, "pass how many samples to label")
    if num_classes is not None:
        fix = "pass module.num_classes (None: an unconditional model)"
        num_classes = check_whole_number("num_classes", num_classes, 1, fix)
    check_class_names(class_names, num_classes, "pass module.hparams.class_names, or None")
    if class_label is not None and not isinstance(class_label, str):  # text is looked up below
        check_whole_number("class_label", class_label, fix="pass a class index (an int), a name, or 'all'")
    if num_classes is None:
        if class_label is not None:
            raise InvalidValue(
                f"class_label={class_label!r}: this model is unconditional (it has no classes)",
                "leave class_label unset, or load a class-conditional checkpoint",
            )
        return None
    if class_label is None or class_label == "all":
        return torch.arange(num_samples) % num_classes
    names = list(class_names or [])
    if isinstance(class_label, str) and class_label in names:
        label = names.index(class_label)
    else:
        try:
            label = int(class_label)
        except ValueError:
            label = -1
    if not 0 <= label < num_classes:
        raise InvalidValue(
            f"{{--class_label}} {class_label} is not a class of this model",
            f"use 0..{num_classes - 1}, 'all'" + (f" or a name in {names}" if names else ""),
        )
    return torch.full((num_samples,), label, dtype=torch.long)


def check_class_names(class_names: Any, num_classes: int | None, fix: str) -> None:
    """Refuse class names that are not a list of names (`fix` says what to pass), or that do not name the classes
    0..num_classes-1 one each: a name for an unconditional model (num_classes None), or a count of names other
    than `num_classes` (a class without a name, or a name of no class), kept in a checkpoint without a word, or a
    name given twice (a name picks its first class, so the other could not be asked for by name)."""
    if class_names is None:
        return
    if not isinstance(class_names, list | tuple) or not all(isinstance(name, str) for name in class_names):
        raise WrongType("class_names", class_names, "a list of names", fix)
    if num_classes is None:
        names = list(class_names)[:5]
        raise InvalidValue(
            f"class_names {names} were given for an unconditional model (its network has no num_classes)",
            "leave class_names out, or build the network with num_classes equal to their count",
        )
    if len(class_names) != num_classes:
        raise InvalidValue(
            f"class_names holds {len(class_names)} name(s) for a model of {num_classes} classes",
            "pass one name for each class 0..num_classes-1, in order",
        )
    repeated = next((name for name in class_names if list(class_names).count(name) > 1), None)
    if repeated is not None:  # a name picks its first class: the others could not be asked for by name
        classes = [str(index) for index, name in enumerate(class_names) if name == repeated]
        times = "twice" if len(classes) == 2 else f"{len(classes)} times"
        raise InvalidValue(
            f"class_names has {repeated!r} {times} (classes {', '.join(classes[:-1])} and {classes[-1]})",
            "give each class its own name",
        )


def check_labels(labels: torch.Tensor, num_classes: int, what: str) -> None:
    """Raise OutOfRange unless every label is a class 0..num_classes-1 or NO_LABEL (a device sync on a GPU:
    call it where labels enter, not at every step)."""
    outside = (labels < NO_LABEL) | (labels >= num_classes)
    if outside.any():
        raise OutOfRange(
            what, sorted(set(labels[outside].tolist()))[:12], f"classes 0..{num_classes - 1} (or {NO_LABEL}: no label)",
            f"pass labels of this model's {num_classes} classes (class_labels(n, {num_classes}) gives each in turn)",
        )  # fmt: skip


def labels_for_sampling(labels: Any, num_classes: int | None, num_samples: int) -> torch.Tensor | None:
    """The labels of `num_samples` samples to draw, checked once (not at every step), as an int64 tensor; None
    samples without labels. Raises ValueError for labels given to an unconditional model (num_classes None)."""
    if labels is None:
        return None
    if num_classes is None:
        raise InvalidValue(
            "labels were given, but this model is unconditional (trained without {LightningDataModule:--conditional})",
            "leave labels out (None), or use a model trained with class labels",
        )
    labels = torch.as_tensor(labels)
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise WrongType(
            "labels", labels, "integer class indices", "pass them as ints (torch.long): never truncated"
        )
    labels = labels.long()
    if labels.shape != (num_samples,):  # never cycled nor cut: the samples would get other classes than asked
        count = f"{labels.numel()} labels" if labels.ndim == 1 else f"labels of shape {tuple(labels.shape)}"
        raise OutOfRange(
            "labels", f"<{count}>", f"one label per sample, shape ({num_samples},) for num_samples={num_samples}",
            f"pass one int class per sample, e.g. class_labels({num_samples}, {num_classes}) (each class in turn)",
        )  # fmt: skip
    check_labels(labels, num_classes, "labels")
    return labels


class ItemWithoutLabel(UserError, TypeError):
    """A dataset item of `IndexedDataset(..., with_labels=True)` without a whole-number label (a TypeError, as it was)."""


def item_label(item: Any, index: int) -> int:
    """The class of a dataset's item (x, label, ...): a whole number, never rounded (a label 1.7 was class 1)."""
    label = item[1] if isinstance(item, tuple | list) and len(item) >= 2 else None
    if (
        isinstance(label, torch.Tensor)
        and label.numel() == 1
        or isinstance(label, np.ndarray)
        and label.size == 1
    ):
        label = label.item()  # TensorDataset's labels, numpy's
    if label is None or isinstance(label, bool) or not isinstance(label, Integral):
        length = f" of {len(item)} element(s)" if isinstance(item, tuple | list) else ""
        held = f"{label!r:.60}, not a whole number" if label is not None else "no label"
        raise ItemWithoutLabel(
            f"IndexedDataset(with_labels=True) needs items (x, label, ...), and item {index} of its dataset is a "
            f"{type(item).__name__}{length}: {held}",
            "leave with_labels out (False) for a dataset without labels, or have the dataset return (x, label) "
            "with label a class index 0..K-1",
        )
    return int(label)
