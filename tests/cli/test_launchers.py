"""Launchers and pretrained weights (seed 002): `python train.py --devices 2`, `torchrun --nproc_per_node 2`
and two "nodes" (two torchrun processes on this machine) each train one run with one last.ckpt; --devices
not matching torchrun's processes fails at startup naming the flags; `--model.init_from` (a checkpoint of
this project or a plain state_dict) gives every rank the same weights before DDP wraps the model.

Every launch runs DDP on CPU (gloo) with the tiny UNet for two steps. `python train.py --devices 2` starts cold, as
users start it (Lightning's launcher starts rank 1 from a fresh interpreter too); torchrun's agents run forked warm
(helpers/warm.py: `python -m torch.distributed.run`, what the `torchrun` script runs), and so do the workers they
start (their sys.executable is the warm python): these tests are about what torchrun's environment does to a run.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import QUICK, TINY_UNET, warm
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.fabric.plugins.environments.lightning import find_free_network_port

from diffusion.cli.process_group import check_other_machines_named, launch_ranks
from diffusion.cli.train import DiffusionCLI, with_default_config
from diffusion.errors import UserError

REPO = Path(__file__).parents[2]
TRAIN = str(REPO / "train.py")
MAX_STEPS = 2
# QUICK with two steps of batch 8: a launcher works in two steps or not at all.
FAST = [*TINY_UNET, *QUICK, "--max_steps", str(MAX_STEPS), "--accelerator", "cpu",
        "--data.init_args.batch_size", "8"]  # fmt: skip
# The `torchrun` script's module form, forked warm (warm.run, warm.popen).
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def subprocess_env() -> dict[str, str]:
    """tests/ on the path (runs import WeightProbe by class path); one thread per process, as torchrun sets,
    since two processes with two threads each thrash a 2-core CI machine."""
    path = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def only_checkpoint(save_dir: Path) -> dict:
    """The run's one last.ckpt (several would mean every process trained alone), loaded."""
    checkpoints = list(save_dir.glob("*/version_*/checkpoints/last.ckpt"))
    assert len(checkpoints) == 1, checkpoints
    return torch.load(checkpoints[0], map_location="cpu", weights_only=False)


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["python", "torchrun"])
def test_one_node_two_processes_start_from_init_from_weights(launcher, sources, digits_checkpoint, tmp_path):
    # One run proves two things (each run costs ~15 s on 2 cores): the launcher works, and init_from gave
    # every rank the source weights before DDP wrapped the model.
    prefix = [sys.executable] if launcher == "python" else [*TORCHRUN, "--nproc_per_node", "2"]
    launch = subprocess.run if launcher == "python" else warm.run
    probe = f'{{"class_path": "helpers.ddp.WeightProbe", "init_args": {{"out_dir": "{tmp_path}"}}}}'
    cmd = [*prefix, TRAIN, "--devices", "2", "--strategy", "ddp", *FAST,
           "--model.init_from", str(sources[{"python": "checkpoint", "torchrun": "state_dict"}[launcher]]),
           "--trainer.callbacks+", probe, "--trainer.logger.init_args.save_dir", str(tmp_path)]  # fmt: skip
    result = launch(cmd, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert only_checkpoint(tmp_path)["global_step"] == MAX_STEPS
    assert "distributed_backend=gloo" in output and "GLOBAL_RANK: 1, MEMBER: 2/2" in output
    expected = network_weights(digits_checkpoint)
    for rank in (0, 1):
        assert_same_weights(torch.load(tmp_path / f"rank{rank}.pt", weights_only=True), expected)


@pytest.mark.multiprocess
def test_two_nodes_on_one_machine_with_torchrun(tmp_path):
    port = find_free_network_port()

    def start_node(rank: int) -> subprocess.Popen:
        cmd = [*TORCHRUN, "--nnodes", "2", "--node_rank", str(rank), "--master_addr", "127.0.0.1",
               "--master_port", str(port), "--nproc_per_node", "1",
               TRAIN, "--num_nodes", "2", "--devices", "1", "--strategy", "ddp", *FAST,
               "--trainer.logger.init_args.save_dir", str(tmp_path)]  # fmt: skip
        return warm.popen(
            cmd,
            cwd=tmp_path,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    nodes = [start_node(0), start_node(1)]
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            node.terminate()  # no-op once exited; torchrun passes SIGTERM on to its worker
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output[-3000:]
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in outputs[0]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]  # node 1's process joined as the second rank
    assert only_checkpoint(tmp_path)["global_step"] == MAX_STEPS


TORCHRUN_ENV = {  # what `torchrun --nproc_per_node 2` gives its first process
    "TORCHELASTIC_RUN_ID": "test", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
    "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
}  # fmt: skip


@pytest.mark.parametrize("devices", ["auto", "1", "3"])
def test_devices_not_matching_torchrun_processes_fail_at_startup(devices, monkeypatch):
    # "auto" and 1 would let each of torchrun's processes train alone (Lightning says nothing);
    # 3 would fail only at fit time, after data and model are built.
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match="Pass --devices 2 --num_nodes 1"):
        DiffusionCLI([*FAST, "--devices", devices, "--trainer.logger", "false"])


def test_devices_matching_torchrun_processes_use_torchruns_environment(monkeypatch):
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    cli = DiffusionCLI([*FAST, "--devices", "2", "--strategy", "ddp", "--trainer.logger", "false"])
    assert isinstance(cli.trainer.strategy.cluster_environment, TorchElasticEnvironment)


@pytest.mark.multiprocess
def test_torchrun_with_one_device_fails_naming_the_flags(tmp_path):
    cmd = [*TORCHRUN, "--nproc_per_node", "2", TRAIN, "--devices", "1", *FAST,
           "--trainer.logger.init_args.save_dir", str(tmp_path)]  # fmt: skip
    result = warm.run(cmd, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "Pass --devices 2 --num_nodes 1" in result.stdout + result.stderr
    assert not list(tmp_path.glob("**/*.ckpt"))


# ---- init_from --------------------------------------------------------------------------------------------
def network_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The network part of a checkpoint's state_dict (the EMA weights when EMA is on)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    return {key.removeprefix("network."): value for key, value in state.items() if key.startswith("network.")}


def assert_same_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, rtol=0, atol=0, msg=key)


@pytest.fixture(scope="module")
def sources(digits_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """The same weights as a checkpoint of this project and as a plain state_dict saved by torch.save."""
    state_dict = tmp_path_factory.mktemp("weights") / "network.pt"
    torch.save(network_weights(digits_checkpoint), state_dict)
    return {"checkpoint": digits_checkpoint, "state_dict": state_dict}


@pytest.mark.parametrize("source", ["checkpoint", "state_dict"])
def test_init_from_loads_the_network_weights(source, sources, digits_checkpoint):
    expected = network_weights(digits_checkpoint)
    args = with_default_config([*TINY_UNET, "--trainer.logger", "false"])
    fresh = DiffusionCLI(args).model.network.state_dict()
    assert any(not torch.equal(fresh[key], expected[key]) for key in expected), (
        "precondition: a fresh init equals the source"
    )
    model = DiffusionCLI([*args, "--model.init_from", str(sources[source])]).model
    assert_same_weights(model.network.state_dict(), expected)
    assert "init_from" not in model.hparams  # a one-time source: the new run's checkpoints hold the weights


def test_init_from_a_missing_file_names_it(tmp_path):
    missing = tmp_path / "pretrained.ckpt"
    with pytest.raises(FileNotFoundError, match="pretrained.ckpt"):
        DiffusionCLI([*TINY_UNET, "--model.init_from", str(missing), "--trainer.logger", "false"])


def test_init_from_weights_of_another_network_names_the_keys(sources, tmp_path):
    state = torch.load(sources["state_dict"], weights_only=True)
    state["extra.weight"] = state.pop(next(iter(state)))
    path = tmp_path / "renamed.pt"
    torch.save(state, path)
    with pytest.raises(
        RuntimeError,
        match=r"renamed\.pt: these weights do not fit UNet \(1 missing keys .*1 unexpected keys \(e\.g\. extra\.weight\)",
    ):
        DiffusionCLI([*TINY_UNET, "--model.init_from", str(path), "--trainer.logger", "false"])


# What names the other machines: a launcher's variables (torchrun, SLURM, LSF, MPI) or Lightning's own.
CLUSTER_VARIABLES = ("MASTER_ADDR", "NODE_RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_JOB_NAME",
                     "LSB_JOBID", "LSB_DJOB_RANKFILE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")  # fmt: skip
LONE_MACHINE = "--num_nodes 2: nothing starts or names the other machines"


def test_num_nodes_without_a_launcher_is_refused_before_it_waits(monkeypatch):
    # It printed "MEMBER: 1/2" and waited for a second machine without end (sample's ranks too), past SIGTERM.
    for name in CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UserError, match=rf"^{LONE_MACHINE} .* — start the command on each of the 2 machines "
                       r"under torchrun --nnodes 2 or srun, or with MASTER_ADDR="):  # fmt: skip
        DiffusionCLI([*FAST, "--num_nodes", "2", "--devices", "1", "--trainer.logger", "false"])
    with pytest.raises(UserError, match=LONE_MACHINE):
        launch_ranks(1, 2, "cpu", "cpu", None, "diffusion.sample")  # sample's and evaluate's ranks
    monkeypatch.setenv("NODE_RANK", "0")  # Lightning's launcher on each machine by hand: what it asks for
    check_other_machines_named(2)
    check_other_machines_named(1)
