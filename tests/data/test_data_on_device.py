"""Data held on the device (diffusion.data.on_device): its batches are the per-item loader's batches, for a seed,
an epoch, a resume point and a rank of 1 or 2 processes; its flips are a function of (seed, epoch, index); a
dataset that does not fit takes the loader.

Data: the bundled digits (float32, model units already), made-up MNIST files and made-up CIFAR-10 arrays (uint8,
at their native size and resized), vectors with labels; all offline and small. Ranks are simulated as the
DataModule sees them (a trainer's world size and rank); real two-process runs are in tests/training.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torchvision import datasets
from torchvision.datasets.vision import VisionDataset

from diffusion.core.guidance import NO_LABEL
from diffusion.data import on_device, split
from diffusion.data.batch import Batch, IndexBatch, check_batch
from diffusion.data.images import ImageDataModule
from diffusion.data.on_device import HeldSamples, IndexLoader, random_flips, room_for
from diffusion.data.resumable import ResumableLoader
from diffusion.data.split import IndexedDataset
from diffusion.data.vectors import VectorDataModule

SEED = 7


@pytest.fixture(autouse=True)
def _seed(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", str(SEED))  # the sampler's seed, as seed_everything sets it


class MadeUpCIFAR10(ImageDataModule):
    """CIFAR-10 as torchvision holds it, an (N, 32, 32, 3) uint8 array, of 300 random images."""

    def _full_dataset(self, random_flip: bool):
        base = datasets.CIFAR10.__new__(datasets.CIFAR10)  # its checksums would refuse made-up files
        VisionDataset.__init__(base, self.root, transform=self._transform(random_flip))
        rng = np.random.default_rng(0)
        base.train, base.data = True, rng.integers(0, 256, (300, 32, 32, 3), dtype=np.uint8)
        base.targets = rng.integers(0, 10, 300).tolist()
        return IndexedDataset(base, with_labels=self.conditional)


def write_made_up_mnist(root, n=300) -> None:
    """MNIST's raw idx files (what prepare_data would download), random images and labels."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(1)
    images, labels = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n, dtype=np.uint8)
    for part in ("train", "t10k"):
        (raw / f"{part}-images-idx3-ubyte").write_bytes(
            np.array([2051, n, 28, 28], ">i4").tobytes() + images.tobytes()
        )
        (raw / f"{part}-labels-idx1-ubyte").write_bytes(
            np.array([2049, n], ">i4").tobytes() + labels.tobytes()
        )


def data_module(kind: str, root, on_device: bool, random_flip: bool = False, **kwargs):
    common = {"batch_size": 16, "seed": 3, "on_device": on_device, **kwargs}
    if kind == "vectors":
        points, labels = root / "points.npy", root / "labels.npy"  # labels go with the user's own points
        np.save(points, np.random.default_rng(1).normal(size=(200, 3)).astype(np.float32))
        np.save(labels, np.random.default_rng(2).integers(0, 4, 200))
        return VectorDataModule(path=str(points), labels=str(labels), **common)
    name, _, size = kind.partition("@")  # "mnist@32": resized from 28 to 32
    images = {
        "random_flip": random_flip,
        "conditional": True,
        "image_size": int(size) if size else None,
        **common,
    }
    if name == "mnist":
        if not (root / "MNIST").exists():
            write_made_up_mnist(root)
        return ImageDataModule("mnist", root=str(root), **images)
    if name == "cifar10":
        return MadeUpCIFAR10("cifar10", root=str(root), **images)
    return ImageDataModule("digits", **images)


def epoch_batches(data, world: int, rank: int, epoch: int, resume_after: int | None = None) -> list[Batch]:
    """Rank `rank` of `world`'s training batches of `epoch` as training_step gets them; with `resume_after` k, those
    of a loader that resumes from the state of one that handed out k batches (a fresh DataModule: another run)."""
    data.trainer = SimpleNamespace(world_size=world, global_rank=rank, accumulate_grad_batches=1)
    loader = data.train_dataloader()
    loader.sampler.set_epoch(epoch)  # as Lightning does before each epoch
    if resume_after is not None:
        first = iter(loader)
        for _ in range(resume_after):
            next(first)
        state = loader.state_dict()
        loader = data.train_dataloader()
        loader.load_state_dict(state)
        loader.sampler.set_epoch(epoch)
    # What Lightning does with each batch: move it to the root device, then the DataModule's hook.
    return [data.on_after_batch_transfer(move_data_to_device(batch, "cpu"), 0) for batch in loader]


def assert_same_batches(held: list[Batch], loaded: list[Batch]) -> None:
    assert len(held) == len(loaded) > 0
    for ours, theirs in zip(held, loaded, strict=True):
        assert isinstance(ours, Batch) and ours.x.dtype == theirs.x.dtype == torch.float32
        assert torch.equal(ours.index, theirs.index) and ours.index.dtype == theirs.index.dtype
        assert torch.equal(ours.x, theirs.x)  # bitwise
        assert torch.equal(ours.label, theirs.label)


KINDS = ["digits", "mnist", "mnist@32", "cifar10", "cifar10@24", "vectors"]


@pytest.mark.parametrize("kind", KINDS)
def test_held_batches_are_the_loaders_batches_for_every_rank_epoch_and_resume_point(tmp_path, kind):
    held, loaded = data_module(kind, tmp_path, on_device=True), data_module(kind, tmp_path, on_device=False)
    resumed = data_module(kind, tmp_path, on_device=True)
    for data in (held, loaded, resumed):
        data.setup("fit")
    for world, rank, epoch in [(1, 0, 0), (1, 0, 1), (2, 0, 1), (2, 1, 1)]:
        expected = epoch_batches(loaded, world, rank, epoch)
        assert_same_batches(epoch_batches(held, world, rank, epoch), expected)
        assert_same_batches(epoch_batches(resumed, world, rank, epoch, resume_after=2), expected[2:])
    assert held.data_path.startswith("held on cpu") and "DataLoader" in loaded.data_path
    if kind.startswith(("mnist", "cifar")):
        assert held._held.samples.dtype == torch.uint8  # stored as 8 bits, converted per batch
        assert tuple(held._held.samples.shape[-2:]) == held.sample_shape[-2:]


def test_the_training_loader_yields_indices_in_the_main_process(tmp_path):
    data = data_module("digits", tmp_path, on_device=True, num_workers=2)
    loader = data.train_dataloader()
    assert isinstance(loader, IndexLoader) and loader.num_workers == 0
    batch = next(iter(loader))
    assert isinstance(batch, IndexBatch) and batch.index.dtype == torch.int64 and batch.seed == SEED
    # Anything else passes the hook untouched (validation batches), and training refuses indices plainly.
    val_batch = next(iter(data.val_dataloader()))
    assert data.on_after_batch_transfer(val_batch, 0) is val_batch
    with pytest.raises(TypeError, match="datamodule=dm"):
        check_batch(batch)
    off = data_module("digits", tmp_path, on_device=False, num_workers=2)
    assert type(off.train_dataloader()) is ResumableLoader and off.train_dataloader().num_workers == 2


def test_flips_are_a_function_of_seed_epoch_and_index_and_half_flip():
    images = torch.randint(0, 256, (2000, 3, 4, 5), dtype=torch.uint8)
    held = HeldSamples(images, None, random_flip=True, uint8_images=True)
    index = torch.randperm(2000)
    flips = random_flips(index, epoch=3, seed=SEED)
    assert 0.45 < flips.float().mean() < 0.55
    # Not of the batch or its order: any split of the same samples draws the same flips.
    parts = torch.cat([random_flips(part, 3, SEED) for part in index.flip(0).split(7)]).flip(0)
    assert torch.equal(parts, flips)
    for other in (
        random_flips(index, 4, SEED),
        random_flips(index, 3, SEED + 1),
    ):  # another epoch, another seed
        assert 0.4 < (other != flips).float().mean() < 0.6
    batch = held.batch(index[:500], epoch=3, seed=SEED)
    unflipped = HeldSamples(images, None, random_flip=False, uint8_images=True).batch(index[:500], 3, SEED).x
    assert torch.equal(batch.x, torch.where(flips[:500, None, None, None], unflipped.flip(-1), unflipped))
    assert torch.equal(batch.label, torch.full((500,), NO_LABEL))


@pytest.mark.parametrize("kind", ["digits", "cifar10"])
def test_each_sample_is_flipped_alike_on_any_rank_and_after_a_resume(tmp_path, kind):
    held = data_module(kind, tmp_path, on_device=True, random_flip=True)
    unflipped = data_module(kind, tmp_path, on_device=True)

    def by_index(batches: list[Batch]) -> dict[int, torch.Tensor]:
        return {int(i): x for batch in batches for i, x in zip(batch.index, batch.x, strict=True)}

    one = by_index(epoch_batches(held, 1, 0, epoch=2))
    two = by_index([b for rank in (0, 1) for b in epoch_batches(held, 2, rank, epoch=2)])
    # (A global batch of 32 rather than 16 cuts the epoch's order elsewhere: compare the samples both see.)
    both = one.keys() & two.keys()
    assert len(both) > 0.8 * len(one) and all(torch.equal(one[i], two[i]) for i in both)
    plain = by_index(epoch_batches(unflipped, 1, 0, epoch=2))
    flipped = [i for i in one if not torch.equal(one[i], plain[i])]
    assert all(torch.equal(one[i], plain[i].flip(-1)) for i in flipped)
    assert 0.3 < len(flipped) / len(one) < 0.7
    # A resumed run's rest of the epoch: the same images, flipped the same way.
    rest = epoch_batches(
        data_module(kind, tmp_path, on_device=True, random_flip=True), 2, 1, 2, resume_after=1
    )
    assert_same_batches(rest, epoch_batches(held, 2, 1, epoch=2)[1:])


def test_a_dataset_that_does_not_fit_takes_the_loader(tmp_path, monkeypatch):
    monkeypatch.setattr(split, "room_for", lambda nbytes, device: f"its {nbytes} bytes would not fit")
    data = data_module("digits", tmp_path, on_device=True)
    loader = data.train_dataloader()
    assert type(loader) is ResumableLoader and isinstance(next(iter(loader)), Batch)
    assert data.data_path.startswith("per-item DataLoader, 0 worker processes (its ")


def test_the_room_rule_leaves_the_network_three_quarters_of_the_card(monkeypatch):
    gb = 10**9
    assert room_for(100 * gb, torch.device("cpu")) is None  # host memory holds it for the loader anyway
    free_and_total = {"now": (80 * gb, 80 * gb)}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: free_and_total["now"])
    cuda = torch.device("cuda", 0)
    assert room_for(150 * 10**6, cuda) is None  # CIFAR-10
    assert room_for(20 * gb, cuda) is None and "a quarter" in room_for(20 * gb + 1, cuda)
    free_and_total["now"] = (30 * gb, 80 * gb)  # other processes hold 50 GB
    assert room_for(15 * gb, cuda) is None and room_for(15 * gb + 1, cuda) is not None
    assert "no memory rule" in room_for(1, torch.device("meta"))


def test_a_folder_of_images_is_read_by_the_loader_and_says_so(tmp_path):
    from PIL import Image

    for i in range(4):
        Image.fromarray(np.full((8, 8, 3), i * 40, np.uint8)).save(tmp_path / f"{i}.png")
    data = ImageDataModule("folder", root=str(tmp_path), image_size=8, batch_size=2, val_fraction=0)
    assert type(data.train_dataloader()) is ResumableLoader
    assert (
        data.data_path
        == "per-item DataLoader, 0 worker processes (image files are decoded as they are drawn)"
    )


def test_on_device_batches_move_to_the_device_of_the_index(tmp_path, monkeypatch):
    """The copy is made once per device; `training_batches` yields Batch on the device asked for."""
    data = data_module("vectors", tmp_path, on_device=True)
    copies = []
    to = HeldSamples.to
    monkeypatch.setattr(HeldSamples, "to", lambda self, device: copies.append(device) or to(self, device))
    first = list(data.training_batches("cpu"))
    again = list(data.training_batches("cpu"))
    assert copies == [torch.device("cpu")] and len(first) == len(again) == 190 // 16
    assert all(torch.equal(a.x, b.x) for a, b in zip(first, again, strict=True))
    assert on_device.megabytes(2_400) == "2.4 kB" and on_device.megabytes(153_600_000) == "153.6 MB"
