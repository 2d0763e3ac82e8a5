"""Each training epoch is cut to whole global batches (diffusion.data.resumable.ResumableSampler): every
step has the same shape, and the same samples whatever the split into processes and accumulation."""

from types import SimpleNamespace

import pytest
from torch.utils.data import DistributedSampler

from diffusion.data.resumable import ResumableSampler
from diffusion.data.vectors import VectorDataModule

DATASET = list(range(50))


def epoch(world_size: int, global_batch: int | None, epoch_index: int = 0) -> list[list[int]]:
    """Each rank's share of one epoch."""
    shares = []
    for rank in range(world_size):
        sampler = ResumableSampler(
            DATASET, num_replicas=world_size, rank=rank, shuffle=True, seed=3, global_batch=global_batch
        )
        sampler.set_epoch(epoch_index)
        shares.append(list(sampler))
    return shares


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_an_epoch_is_the_start_of_the_permutation_cut_to_whole_global_batches(world_size):
    lightnings = [list(DistributedSampler(DATASET, world_size, rank, seed=3)) for rank in range(world_size)]
    shares = epoch(world_size, global_batch=16)
    for share, full in zip(shares, lightnings, strict=True):
        assert len(share) == 48 // world_size and share == full[: len(share)]  # Lightning's order, cut
    seen = [i for share in shares for i in share]
    assert len(seen) == len(set(seen)) == 48  # disjoint, no padding repeats
    # The same 48 samples in the same global order whatever the world size.
    assert sorted(seen) == sorted(i for share in epoch(1, global_batch=16) for i in share)
    assert set(seen) != {i for share in epoch(world_size, 16, epoch_index=1) for i in share}  # others sit out


def test_a_dataset_smaller_than_one_global_batch_is_kept_whole():
    assert sorted(epoch(1, global_batch=64)[0]) == DATASET
    assert [len(share) for share in epoch(2, global_batch=64)] == [25, 25]


def test_the_training_loader_steps_in_whole_global_batches_of_the_trainer():
    data = VectorDataModule("moons", num_samples=100, batch_size=8, val_fraction=0.05)  # 95 training samples
    data.setup("fit")
    for world_size, accumulate, batches in [(1, 1, 11), (1, 3, 9), (2, 1, 5), (2, 2, 4)]:
        data.trainer = SimpleNamespace(
            world_size=world_size, global_rank=0, accumulate_grad_batches=accumulate
        )
        loader = data.train_dataloader()
        sizes = [len(batch.index) for batch in loader]  # an IndexBatch: the data is held on the device
        assert sizes == [8] * batches, (world_size, accumulate)  # a multiple of accumulate, none ragged
