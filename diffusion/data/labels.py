"""Class labels of class-conditional models: where they come from (a dataset's own classes, an image folder's
subfolders, a ``.npy`` file beside vector data), the label each generated sample asks for, and their check.

`NO_LABEL` (defined with the networks' class embedding) marks a sample without a class: unlabelled data, labels
dropped for classifier-free guidance, and the unconditional half of a guided forward.
"""

from pathlib import Path

import numpy as np
import torch

from diffusion.core.guidance import NO_LABEL
from diffusion.data.file_in_folder import FileKind, file_in_folder
from diffusion.data.numpy_files import read_array

LABELS_FILE = FileKind("labels file", ("*.npy",), "np.save(path, labels.astype(np.int64)) writes one")


def folder_classes(root: Path, files: list[Path]) -> tuple[list[int], list[str]]:
    """(label of every file, class names): the class of a file is its first-level subfolder under ``root``
    (torchvision's ImageFolder convention: ``root/<class>/.../image.png``), classes numbered in sorted order."""
    folders = [
        path.relative_to(root).parts[0] if len(path.relative_to(root).parts) > 1 else None for path in files
    ]
    loose = [path for path, folder in zip(files, folders, strict=True) if folder is None]
    if loose:
        raise ValueError(
            f"--data.conditional true reads classes from subfolders (root/<class>/image.png), but {len(loose)} "
            f"image(s) lie directly in {root}, e.g. {loose[0].name}; move them into a class folder"
        )
    names = sorted(set(folders))
    index = {name: i for i, name in enumerate(names)}
    return [index[folder] for folder in folders], names


def load_labels(path: Path, num_samples: int) -> np.ndarray:
    """N integer class labels 0..K-1 from a ``.npy`` file, as int64, with errors that say what is wrong."""
    path = file_in_folder(path, "--data.labels", LABELS_FILE)
    # The one reader of users' arrays: a missing, empty or foreign file is refused as every command refuses it.
    labels = np.asarray(
        read_array(path, "--data.labels", "save them with np.save(path, labels.astype(np.int64))")[0]
    )
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"--data.labels {path} must hold N integers (shape (N,), an integer dtype), got "
            f"{getattr(labels, 'dtype', type(labels).__name__)} {getattr(labels, 'shape', '')}; "
            "save them with np.save(path, labels.astype(np.int64))"
        )
    if len(labels) != num_samples:
        raise ValueError(
            f"--data.labels {path} has {len(labels)} labels for {num_samples} samples; give one per sample"
        )
    if labels.min() < 0:
        raise ValueError(f"--data.labels {path} has negative labels (min {labels.min()}); classes are 0..K-1")
    return labels.astype(np.int64)


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
    if num_classes is None:
        if class_label is not None:
            raise ValueError(
                f"class_label={class_label!r}: this model is unconditional (trained without --data.conditional)"
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
        raise ValueError(
            f"class_label={class_label!r} is not a class of this model; use 0..{num_classes - 1}, 'all'"
            + (f" or a name in {names}" if names else "")
        )
    return torch.full((num_samples,), label, dtype=torch.long)


def check_labels(labels: torch.Tensor, num_classes: int, what: str) -> None:
    """Raise ValueError unless every label is a class 0..num_classes-1 or NO_LABEL (a device sync on a GPU:
    call it where labels enter, not at every step)."""
    if ((labels < NO_LABEL) | (labels >= num_classes)).any():
        raise ValueError(
            f"{what} must be classes 0..{num_classes - 1} (or {NO_LABEL}: no label), got "
            f"{sorted(set(labels.tolist()))[:12]}"
        )


def labels_for_sampling(labels, num_classes: int | None, num_samples: int) -> torch.Tensor | None:
    """The labels of `num_samples` samples to draw, checked once (not at every step), as an int64 tensor; None
    samples without labels. Raises ValueError for labels given to an unconditional model (num_classes None)."""
    if labels is None:
        return None
    if num_classes is None:
        raise ValueError(
            "this model is unconditional (trained without --data.conditional): it takes no labels"
        )
    labels = torch.as_tensor(labels, dtype=torch.long)
    if labels.shape != (num_samples,):
        raise ValueError(f"need one label per sample: {num_samples}, got shape {tuple(labels.shape)}")
    check_labels(labels, num_classes, "labels")
    return labels
