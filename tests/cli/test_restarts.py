"""Restarts (issue 45): `--ckpt_path auto` is one command line for a job's first start and every restart. It names
the run's folder after the job (`--trainer.logger.init_args.version`, else torchrun's run id, else SLURM's job id),
resumes that folder's newest checkpoint when it has one and starts the run there when not, never takes another
job's run, refuses in one line when nothing names the job, and ends a restart of a finished run with status 0.

The folder's resolution is checked directly (environments set by hand); the runs are the tiny toy 2-D model,
in this process. End to end: `torchrun --nproc_per_node 2 --max-restarts 1` of two gloo ranks, one of them killed
with SIGKILL after the first checkpoint; torchrun restarts the job with the same command line, which resumes and
ends with the raw and EMA weights of the same job left alone, bit for bit.
"""

import json
import os
import re
import shutil
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from helpers import QUICK, TINY_MLP
from helpers.ddp import run_in_session
from helpers.user_errors import error_line
from helpers.weights import max_abs_diff, network_weights

from diffusion.cli.resume import RUN_LAYOUTS, job_run
from diffusion.cli.train import DiffusionCLI, main
from diffusion.errors import UserError

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
BASE = [
    "--config", str(REPO / "configs" / "toy2d.yaml"), *TINY_MLP, *QUICK,
    "--data.init_args.num_samples", "256", "--trainer.logger.init_args.name", "run",
]  # fmt: skip
JOB_VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


def train(save_dir: Path, *extra: str):
    return main([*BASE, "--trainer.logger.init_args.save_dir", str(save_dir), "--ckpt_path", "auto", *extra])


@pytest.fixture
def job(monkeypatch):
    """job(**variables): this test's launcher environment, none of the session's own."""

    def set_job(**variables: str) -> None:
        for name in JOB_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    set_job()
    return set_job


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


# ---- which folder -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("variables", "version", "folder"),
    [
        ({"SLURM_JOB_ID": "123"}, None, "slurm-123"),
        ({"TORCHELASTIC_RUN_ID": "5f0c-1a"}, None, "torchrun-5f0c-1a"),
        ({"TORCHELASTIC_RUN_ID": "5f0c-1a", "SLURM_JOB_ID": "123"}, None, "torchrun-5f0c-1a"),
        ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "123"}, None, "slurm-123"),
        ({"TORCHELASTIC_RUN_ID": "5f0c-1a", "SLURM_JOB_ID": "123"}, "mine", "mine"),
        ({}, 3, "version_3"),
    ],
    ids=["slurm", "torchrun", "torchrun before slurm", "torchrun's default id names none", "the user's version first",
         "a numbered version"],
)  # fmt: skip
def test_the_jobs_run_folder_is_named_by_the_version_else_torchrun_else_slurm(
    job, variables, version, folder
):
    job(**variables)
    init_args = {"save_dir": "runs", "name": "run", "version": version}
    run = job_run(init_args, RUN_LAYOUTS["TensorBoardLogger"])
    assert run.path == Path("runs", "run", folder).absolute()
    assert init_args["version"] == (version if version is not None else folder)  # the logger writes there


@pytest.mark.parametrize(
    ("variables", "words"),
    [
        ({}, r"nothing names it \(no torchrun or SLURM job"),
        ({"TORCHELASTIC_RUN_ID": "none"}, r"nothing names it \(torchrun's run id is its default 'none'"),
        ({"SLURM_JOB_ID": "../other"}, r"SLURM_JOB_ID='\.\./other' is no folder name"),
    ],
    ids=["no job", "torchrun without a run id", "an id that is no folder name"],
)
def test_auto_without_a_job_to_name_the_run_refuses_in_one_line(job, variables, words, tmp_path, capsys):
    job(**variables)
    with pytest.raises(SystemExit) as exit_info:
        train(tmp_path / "runs")
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert re.search(words, line) and "--trainer.logger.init_args.version NAME" in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "logger",
    [["--trainer.logger", "false"], ["--trainer.logger", "lightning.pytorch.loggers.MLFlowLogger"]],
    ids=["no logger", "MLflow"],
)
def test_auto_with_a_logger_whose_runs_it_cannot_name_refuses_in_one_line(job, logger, tmp_path, capsys):
    job(SLURM_JOB_ID="123")
    with pytest.raises(SystemExit) as exit_info:
        train(tmp_path / "runs", *logger)
    assert exit_info.value.code == 2
    assert error_line(capsys.readouterr().err).startswith("error: --ckpt_path auto ")


TORCHRUN_RESTARTS = {  # what `torchrun --nproc_per_node 2 --max-restarts 3` gives its first process
    "TORCHELASTIC_RUN_ID": "5f0c-1a", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RESTART_COUNT": "0",
    "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0",
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
}  # fmt: skip


def test_torchrun_restarts_on_the_rendezvous_store_it_shares_are_refused_at_the_first_start(
    monkeypatch, tmp_path
):
    """torch's agent keeps that store across restarts, and the restarted ranks may read the lost ranks' addresses
    there and wait for them (4 restarts of 5 of two gloo ranks never connected): refused before the first
    start trains, not found at the restart. With TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 the agent shares none. (The
    CLI is built, not fitted: a check that let it through would fail here, not wait for a rank 1.)"""
    for name, value in {**TORCHRUN_RESTARTS, "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(name, value)
    ddp = ["--devices", "2", "--strategy", "ddp", "--accelerator", "cpu"]
    args = [*BASE, "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), *ddp]
    with pytest.raises(UserError) as refused:
        DiffusionCLI([*args, "--ckpt_path", "auto"])
    assert str(refused.value).startswith(
        "torchrun --max-restarts 3 shares its rendezvous store with the ranks"
    )
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in refused.value.fix and not (tmp_path / "runs").exists()
    # What TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 makes torchrun give its ranks:
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert DiffusionCLI(args).trainer.world_size == 2


# ---- start, resume, never another job's run -----------------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A save_dir holding one finished run of job 123: runs/run/slurm-123 (last.ckpt and step=4.ckpt, step 4)."""
    save_dir = tmp_path_factory.mktemp("finished")
    with pytest.MonkeyPatch.context() as patch:
        for name in JOB_VARIABLES:
            patch.delenv(name, raising=False)
        patch.setenv("SLURM_JOB_ID", "123")
        cli = train(save_dir)
    assert cli.config.ckpt_path is None and cli.trainer.global_step == 4  # no checkpoint: the run started
    return save_dir


def test_auto_starts_the_jobs_run_in_its_folder_and_its_config_resumes_it(finished):
    run = finished / "run" / "slurm-123"
    assert [path.name for path in (finished / "run").iterdir()] == ["slurm-123"]
    assert load(run / "checkpoints" / "last.ckpt")["global_step"] == 4
    config = yaml.safe_load((run / "config.yaml").read_text())
    # As written, with the job's name as the version: run again with --config, it resumes this run.
    assert config["ckpt_path"] == "auto"
    assert config["trainer"]["logger"]["init_args"]["version"] == "slurm-123"


def test_auto_resumes_the_newest_checkpoint_of_the_jobs_run_not_a_newer_run_of_another_job(
    finished, job, tmp_path
):
    save_dir = tmp_path / "runs"
    shutil.copytree(finished, save_dir)
    # Newer runs of the same name, further on: another SLURM job's, a torchrun job's, a plain version_N.
    for other in ("slurm-456", "torchrun-5f0c", "version_7"):
        shutil.copytree(save_dir / "run" / "slurm-123", save_dir / "run" / other)
        theirs = load(save_dir / "run" / other / "checkpoints" / "last.ckpt")
        theirs["global_step"] = 5
        torch.save(theirs, save_dir / "run" / other / "checkpoints" / "last.ckpt")
    others = {
        path: path.read_bytes()
        for path in save_dir.rglob("*")
        if path.is_file() and "slurm-123" not in str(path)
    }
    job(SLURM_JOB_ID="123")
    cli = train(save_dir, "--max_steps", "6")
    assert Path(cli.config.ckpt_path) == save_dir / "run" / "slurm-123" / "checkpoints" / "last.ckpt"
    assert cli.trainer.global_step == 6 and Path(cli.trainer.log_dir).name == "slurm-123"
    assert (save_dir / "run" / "slurm-123" / "config-resumed-at-step-4.yaml").is_file()
    assert {path: path.read_bytes() for path in others} == others
    # A job of its own (a new SLURM job, a torchrun job of another id) starts its own run beside them.
    job(SLURM_JOB_ID="789")
    cli = train(save_dir)
    assert cli.config.ckpt_path is None and Path(cli.trainer.log_dir).name == "slurm-789"
    assert load(save_dir / "run" / "slurm-789" / "checkpoints" / "last.ckpt")["global_step"] == 4
    assert {path: path.read_bytes() for path in others} == others


def test_a_restart_of_a_finished_run_ends_with_status_0_and_writes_nothing(finished, job, tmp_path, capsys):
    """A rank lost after the final save makes torchrun restart a finished job: it must end, not fail."""
    save_dir = tmp_path / "runs"
    shutil.copytree(finished, save_dir)
    before = {path: path.stat().st_mtime_ns for path in save_dir.rglob("*")}
    job(SLURM_JOB_ID="123")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        train(save_dir)
    assert exit_info.value.code == 0
    assert "is trained to step 4 already (--max_steps 4): nothing to do" in capsys.readouterr().err
    assert {path: path.stat().st_mtime_ns for path in save_dir.rglob("*")} == before


# ---- end to end: torchrun --max-restarts, one rank killed ----------------------------------------------------
MAX_STEPS, KILL_AFTER = 6, 3  # checkpoints at the validations of steps 2, 4, 6: step 3 is trained again
DDP = [
    "--config", str(REPO / "configs" / "toy2d.yaml"), *TINY_MLP, "--model.network.init_args.dropout", "0.1",
    "--data.init_args.dataset", "gaussian", "--data.init_args.dim", "4", "--data.init_args.num_samples", "60",
    "--data.init_args.val_fraction", "0.2", "--data.init_args.batch_size", "8", "--max_steps", str(MAX_STEPS),
    "--trainer.val_check_interval", "2", "--model.warmup_steps", "1", "--model.lr_schedule", "constant",
    "--checkpoint.save_top_k", "-1", "--sample_grid.num_samples", "4", "--sample_grid.sampling.steps", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    "--devices", "2", "--strategy", "ddp", "--accelerator", "cpu", "--trainer.logger.init_args.name", "run",
]  # fmt: skip


def torchrun_job(save_dir: Path, *extra: str) -> tuple[int | None, str]:
    """`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nproc_per_node 2 --max-restarts 1 train.py ... --ckpt_path
    auto` (docs/scaling.md's) in a session of its own: the agent forked warm, and so are its workers
    (helpers/warm.py)."""
    save_dir.mkdir(parents=True)
    inherited = ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE", "RANK", *JOB_VARIABLES)
    env = {k: v for k, v in os.environ.items() if k not in inherited}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
           str(REPO / "train.py"), *DDP, "--trainer.logger.init_args.save_dir", str(save_dir),
           "--ckpt_path", "auto", *extra]  # fmt: skip
    return run_in_session(cmd, save_dir, env, timeout=300, warm=True)


def final_weights(save_dir: Path) -> tuple[Path, dict[str, dict[str, torch.Tensor]]]:
    """The job's one run folder and its final raw and EMA network weights."""
    (run,) = (save_dir / "run").iterdir()
    final = load(run / "checkpoints" / "last.ckpt")
    assert final["global_step"] == MAX_STEPS
    return run, network_weights(final)


@pytest.mark.multiprocess
def test_a_torchrun_job_restarted_after_a_rank_was_killed_ends_with_the_weights_of_the_job_left_alone(
    tmp_path,
):
    kill = {"class_path": "helpers.ddp.KillRankOnce", "init_args": {"step": KILL_AFTER, "rank": 1}}
    with ThreadPoolExecutor(max_workers=2) as pool:
        left_alone = pool.submit(torchrun_job, tmp_path / "left_alone")
        killed = pool.submit(torchrun_job, tmp_path / "killed", "--trainer.callbacks=" + json.dumps([kill]))
        (alone_code, alone_output), (code, output) = left_alone.result(), killed.result()
    assert alone_code == 0, alone_output[-4000:]
    assert code == 0, output[-4000:]
    # Rank 1 died by SIGKILL, named by torchrun or first by rank 0 (which watches it: heartbeat.py), and torchrun
    # started the job again: the same command line resumed step 2.
    named = re.search(rf"exitcode: -{signal.SIGKILL}\) local_rank: 1", output)
    assert named or "error: rank 1 died (killed by SIGKILL)" in output, output[-4000:]
    assert "resuming this job's run" in output and "from last.ckpt (step 2)" in output, output[-4000:]
    run, weights = final_weights(tmp_path / "killed")
    alone_run, expected = final_weights(tmp_path / "left_alone")
    assert run.name.startswith("torchrun-") and alone_run.name.startswith("torchrun-") and run != alone_run
    assert (run / "config-resumed-at-step-2.yaml").is_file()  # one folder for both attempts, resumed in place
    resumed_from = network_weights(load(run / "checkpoints" / "step=2.ckpt"))
    for kind in ("raw", "ema"):
        assert max_abs_diff(weights[kind], expected[kind]) == 0, kind
        # The steps after the resumed checkpoint moved the weights: equality is not for free.
        assert max_abs_diff(resumed_from[kind], expected[kind]) > 1e-4, kind


def test_auto_refuses_a_jobs_run_whose_only_checkpoint_is_a_broken_link(finished, job, tmp_path, capsys):
    """A run whose last.ckpt links to a file that is gone was taken for a run not saved yet, and started over in its
    folder: refused, naming the link and where it points."""
    save_dir = tmp_path / "runs"
    shutil.copytree(finished, save_dir)
    folder = save_dir / "run" / "slurm-123" / "checkpoints"
    for path in folder.glob("*.ckpt"):
        path.unlink()
    (folder / "last.ckpt").symlink_to(tmp_path / "moved.ckpt")
    job(SLURM_JOB_ID="123")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        train(save_dir, "--max_steps", "6")
    line = error_line(capsys.readouterr().err)
    assert exited.value.code == 2 and line.startswith(
        f"error: --ckpt_path auto: {folder / 'last.ckpt'} is a broken link (to {tmp_path / 'moved.ckpt'}, which "
        "does not exist) — restore the checkpoint"
    ), line
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]  # nothing started there
