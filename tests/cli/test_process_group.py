"""Training and sampling close the process group they opened (diffusion/cli/process_group.py): a gloo group left
open can abort the process at interpreter exit after its work succeeded (exit -6).
`python -m diffusion.sample --devices 2` is checked in tests/cli/test_sample_distributed.py. And `--ddp_timeout` reaches
the group on a torch without `torch.distributed.set_timeout` (2.11, on the lent GPU machines)."""

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from helpers import tiny_run

from diffusion.cli.process_group import closing_process_group, process_group_is_open
from diffusion.training.callbacks.heartbeat import set_collective_timeout


def open_a_one_process_group(rendezvous_file) -> None:
    """(torch's FileStore waits forever for a file in a folder that does not exist.)"""
    dist.init_process_group("gloo", init_method=f"file://{rendezvous_file}", rank=0, world_size=1)


@pytest.fixture(autouse=True)
def no_group_left_behind():
    yield
    if process_group_is_open():  # a failed test must not leave its group to the next one
        dist.destroy_process_group()


def test_a_group_opened_inside_is_closed_on_success_and_on_error(tmp_path):
    with closing_process_group():
        open_a_one_process_group(tmp_path / "a")
    assert not process_group_is_open()
    with pytest.raises(ValueError), closing_process_group():
        open_a_one_process_group(tmp_path / "b")
        raise ValueError
    assert not process_group_is_open()


def test_a_group_the_caller_opened_stays_open(tmp_path):
    open_a_one_process_group(tmp_path / "rendezvous")
    with closing_process_group():
        pass
    assert process_group_is_open()


def test_training_under_ddp_closes_its_group(tmp_path, monkeypatch):
    # One DDP process in this one: Lightning opens a gloo group of world size 1 inside fit, and sets
    # MASTER_PORT & co. in os.environ, which must not reach the next test's subprocesses.
    monkeypatch.setattr(os, "environ", dict(os.environ))
    seen = []
    original = dist.init_process_group
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: seen.append(True) or original(*a, **k))
    ddp = [
        "--trainer.strategy.class_path",
        "DDPStrategy",
    ]  # the class: --strategy ddp on one device drops DDP
    tiny_run(tmp_path, *ddp, "--devices", "1", "--accelerator", "cpu", "--max_steps", "1")
    assert seen, "the run opened no process group: the test would prove nothing"
    assert not process_group_is_open()


@pytest.mark.filterwarnings("ignore:.*_set_pg_timeout.*:FutureWarning")  # newer torch: a deprecated alias
@pytest.mark.parametrize("torch_has_set_timeout", [True, False])
def test_the_collective_timeout_is_set_with_or_without_set_timeout(
    tmp_path, monkeypatch, torch_has_set_timeout
):
    if not torch_has_set_timeout:  # raising=False: torch 2.11 has none to take away
        monkeypatch.delattr(dist, "set_timeout", raising=False)
    open_a_one_process_group(tmp_path / "rendezvous")
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    assert backend.options._timeout != timedelta(seconds=7)
    set_collective_timeout(timedelta(seconds=7))
    assert backend.options._timeout == timedelta(seconds=7)
