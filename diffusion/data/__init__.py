"""LightningDataModules and what they yield: images (`ImageDataModule`) and vectors (`VectorDataModule`) in model
units, as `Batch(x, index[, label])` items (`IndexedDataset` wraps a dataset of your own), split into training and
validation sets, with a training loader that resumes mid-epoch; a dataset held as arrays is batched and augmented
on the training device (`diffusion.data.on_device`).

`diffusion.data.ImageDataModule` and `diffusion.data.VectorDataModule` are the class paths configs name.
"""

from diffusion.data.batch import Batch
from diffusion.data.images import ImageDataModule
from diffusion.data.split import IndexedDataset, SplitDataModule
from diffusion.data.vectors import VectorDataModule

__all__ = ["Batch", "ImageDataModule", "IndexedDataset", "SplitDataModule", "VectorDataModule"]
