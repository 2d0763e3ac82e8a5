"""Resume you can trust: a run killed with SIGKILL and resumed from its last checkpoint ends with the raw and
EMA weights of the run left alone; a save that dies half-way leaves the previous checkpoint intact and no
temporary file anywhere.

Killed runs are `train.py` subprocesses in a session of their own, killed by `helpers.ddp.KillAt` at a chosen
step (between two batches, or half-way through writing last.ckpt); references and resumes of one process run
in-process through the same CLI. Data: `gaussian` vectors (D = 4), 60 samples of which 48 train and 12
validate; a global batch of 16, so an epoch is 3 optimizer steps; 8 steps with a checkpoint after each and a
validation (with its sample grid) every 2; the MLP has dropout, so the global RNG matters too.
"""

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import TINY_MLP, warm
from helpers.weights import max_abs_diff, network_weights

from diffusion.cli.train import main
from diffusion.data.resumable import ResumableLoader, ResumableSampler
from diffusion.errors import DiskFull
from diffusion.training.atomic_writes import AtomicCheckpointIO
from diffusion.training.callbacks import Checkpoint

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
MAX_STEPS, STEPS_PER_EPOCH = 8, 3
KILL_STEP = 4  # one batch into the second epoch, right after that step's checkpoint and before its validation

BASE = [
    "--config", str(REPO / "configs" / "toy2d.yaml"), *TINY_MLP, "--model.network.init_args.dropout", "0.1",
    "--seed_everything", "0", "--data.init_args.dataset", "gaussian", "--data.init_args.dim", "4",
    "--data.init_args.num_samples", "60", "--data.init_args.val_fraction", "0.2",
    "--max_steps", str(MAX_STEPS), "--trainer.val_check_interval", "2", "--model.warmup_steps", "1",
    # A constant rate: extending a finished run can only equal the longer run when the rate does not depend on
    # max_steps (a cosine's does); the cosine's own resume is tested below with `schedule`.
    "--model.lr_schedule", "constant",
    "--checkpoint.every_n_train_steps", "1", "--checkpoint.save_top_k", "-1",
    "--sample_grid.num_samples", "4", "--sample_grid.sampling.steps", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
ONE_PROCESS = ["--devices", "1", "--accelerator", "cpu", "--data.init_args.batch_size", "16"]
TWO_PROCESSES = [
    "--devices", "2", "--strategy", "ddp", "--accelerator", "cpu", "--data.init_args.batch_size", "8",
]  # fmt: skip
# Raw weights must match to float32 rounding at worst; the remaining steps move them 100x more (asserted).
TOLERANCE = 1e-6


def args(save_dir: Path, *extra: str) -> list[str]:
    logger = ["--trainer.logger.init_args.save_dir", str(save_dir), "--trainer.logger.init_args.name", "run"]
    return [*BASE, *logger, *extra]


def kill_at(step: int, during_save_of: str | None = None) -> str:
    spec = {"class_path": "helpers.ddp.KillAt", "init_args": {"step": step, "during_save_of": during_save_of}}
    return "--trainer.callbacks=" + json.dumps([spec])


@dataclass
class Launch:
    returncode: int
    output: str


def launch(
    save_dir: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 150, ranks: int = 1
) -> Launch:
    """`python train.py ...` in a session of its own (KillAt kills that session's processes, and so does a
    timeout here); `ranks`: its DDP ranks, each started warm (helpers/warm.py), in one process group."""
    save_dir.mkdir(parents=True, exist_ok=True)
    inherited = ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE")  # pytest's in-process runs set the first
    environment = {k: v for k, v in os.environ.items() if k not in inherited}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), environment.get("PYTHONPATH")]))
    environment.update(env or {})
    process = warm.popen(
        [sys.executable, str(REPO / "train.py"), *args(save_dir, *extra)], cwd=save_dir, env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, ranks=ranks,
    )  # fmt: skip
    try:
        output = process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"train.py still running after {timeout} s:\n{process.communicate()[0][-4000:]}")
    return Launch(process.returncode, output)


def checkpoints(save_dir: Path) -> Path:
    return save_dir / "run" / "version_0" / "checkpoints"


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def final_checkpoint(save_dir: Path) -> dict:
    """The checkpoint of the final step, wherever the resumed run wrote it (its own version folder or the
    killed run's)."""
    found = [load(p) for p in (save_dir / "run").glob("version_*/checkpoints/last*.ckpt")]
    final = [c for c in found if c["global_step"] == MAX_STEPS]
    assert len(final) == 1, [c["global_step"] for c in found]
    return final[0]


def assert_same_final_weights(resumed: dict, reference: dict, killed_at: dict) -> None:
    for kind, weights in network_weights(reference).items():
        assert max_abs_diff(network_weights(resumed)[kind], weights) <= TOLERANCE, kind
        # The steps after the kill moved the weights far beyond the tolerance: equality is not for free
        # (by ~1e-2 at a constant rate, ~6e-4 at the end of a cosine decay).
        assert max_abs_diff(network_weights(killed_at)[kind], weights) > 100 * TOLERANCE, kind


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """reference(noise_mode, *extra) -> the final checkpoint of an uninterrupted one-process run (made once)."""
    made = {}

    def get(noise_mode: str, *extra: str) -> dict:
        if (noise_mode, extra) not in made:
            save_dir = tmp_path_factory.mktemp(f"reference_{noise_mode}")
            main(args(save_dir, *ONE_PROCESS, "--model.noise_mode", noise_mode, *extra))
            made[noise_mode, extra] = final_checkpoint(save_dir)
        return made[noise_mode, extra]

    return get


# ---- exact resume ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("global_batch", [None, 8], ids=["padded epochs", "whole global batches"])
@pytest.mark.parametrize("num_workers", [0, 2], ids=["in process", "2 workers"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_loader_resumed_after_k_batches_hands_out_the_rest_of_its_epoch(
    world_size, num_workers, global_batch
):
    """Lightning saves `state_dict()` with the checkpoint and calls `load_state_dict` on resume; workers
    prefetch batches ahead, which must not count as handed out."""
    dataset = list(range(100, 150))

    def loader(rank: int, epoch: int) -> ResumableLoader:
        sampler = ResumableSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=5, global_batch=global_batch
        )
        sampler.set_epoch(epoch)
        return ResumableLoader(dataset, batch_size=4, sampler=sampler, num_workers=num_workers)

    for rank in range(world_size):
        first = iter(original := loader(rank, epoch=1))
        next(first), next(first)
        state = original.state_dict()
        rest = [batch.tolist() for batch in first]
        assert len(rest) == len(original) - 2 >= 2
        resumed = loader(rank, epoch=0)
        resumed.load_state_dict(state)
        resumed.sampler.set_epoch(1)  # as Lightning does before the epoch runs
        assert [batch.tolist() for batch in resumed] == rest
        resumed.sampler.set_epoch(2)  # the next epoch is whole again
        assert len(list(resumed)) == len(original)


@pytest.mark.parametrize("noise_mode", ["fast", "per_sample"])
def test_a_run_killed_mid_epoch_resumes_to_the_weights_of_the_run_left_alone(tmp_path, reference, noise_mode):
    mode = ["--model.noise_mode", noise_mode]
    killed = launch(tmp_path, *ONE_PROCESS, *mode, kill_at(KILL_STEP))
    assert killed.returncode == -signal.SIGKILL, killed.output[-4000:]
    last = checkpoints(tmp_path) / "last.ckpt"
    killed_at = load(last)
    assert killed_at["global_step"] == KILL_STEP and KILL_STEP % STEPS_PER_EPOCH != 0  # mid-epoch
    main(args(tmp_path, *ONE_PROCESS, *mode, "--ckpt_path", str(last)))
    assert_same_final_weights(final_checkpoint(tmp_path), reference(noise_mode), killed_at)


def test_a_compiled_run_killed_mid_epoch_resumes_to_the_weights_of_the_compiled_run_left_alone(
    tmp_path, reference, graphs_handed_to_the_backend
):
    """The training graph (`--model.compile_training true`) through a kill and `--ckpt_path`: the killed subprocess
    compiles with aot_eager (helpers.ddp.CompileWith), the resume and the run left alone with the counting
    backend; each builds its graph anew and lands on the same weights."""
    compiled = ["--model.compile_training", "true"]
    compile_with = {"class_path": "helpers.ddp.CompileWith"}
    kill = {"class_path": "helpers.ddp.KillAt", "init_args": {"step": KILL_STEP}}
    killed = launch(
        tmp_path, *ONE_PROCESS, *compiled, "--trainer.callbacks=" + json.dumps([compile_with, kill])
    )
    assert killed.returncode == -signal.SIGKILL, killed.output[-4000:]
    last = checkpoints(tmp_path) / "last.ckpt"
    killed_at = load(last)
    assert killed_at["global_step"] == KILL_STEP
    main(args(tmp_path, *ONE_PROCESS, *compiled, "--ckpt_path", str(last)))
    assert len(graphs_handed_to_the_backend) == 1  # the resumed steps ran the training graph
    assert_same_final_weights(final_checkpoint(tmp_path), reference("fast", *compiled), killed_at)


@pytest.mark.parametrize(
    ("noise_mode", "stop_at"),
    [("fast", KILL_STEP + 1), ("per_sample", KILL_STEP + 1), ("fast", STEPS_PER_EPOCH)],
    ids=["fast noise, mid-epoch", "per-sample noise, mid-epoch", "fast noise, at an epoch's end"],
)
def test_a_finished_run_extended_with_a_larger_max_steps_ends_with_the_weights_of_the_longer_run(
    tmp_path, reference, noise_mode, stop_at
):
    """A run that ended cleanly at --max_steps stop_at, trained on to the reference's larger --max_steps with
    --ckpt_path last ("train 3 more steps"). No validation at stop_at, so its last.ckpt is the one written at
    train end, after Lightning closed the epoch and EMA swapped the averaged weights into the module."""
    mode = ["--model.noise_mode", noise_mode]
    step_saves_at_validation = ["--checkpoint.every_n_train_steps", "null"]  # the CLI's defaults
    main(args(tmp_path, *ONE_PROCESS, *mode, *step_saves_at_validation, "--max_steps", str(stop_at)))
    # Validation (and so the step's own checkpoint) comes every 2 steps: none at stop_at.
    assert stop_at % 2 and not (checkpoints(tmp_path) / f"step={stop_at}.ckpt").exists()
    stopped_at = load(checkpoints(tmp_path) / "last.ckpt")
    assert stopped_at["global_step"] == stop_at
    main(args(tmp_path, *ONE_PROCESS, *mode, *step_saves_at_validation, "--ckpt_path", "last"))
    assert_same_final_weights(final_checkpoint(tmp_path), reference(noise_mode), stopped_at)


def test_a_second_fit_of_the_same_trainer_with_a_larger_max_steps_ends_with_the_weights_of_the_longer_run(
    tmp_path, reference
):
    """The same in Python (a notebook): fit again with the same Trainer and callbacks. The EMA callback kept
    the first fit's raw weights at its end; the second fit's checkpoints must hold their own."""
    cli = main(args(tmp_path, *ONE_PROCESS, "--checkpoint.every_n_train_steps", "null", "--max_steps", "5"))
    stopped_at = load(checkpoints(tmp_path) / "last.ckpt")
    cli.trainer.fit_loop.epoch_loop.max_steps = MAX_STEPS
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path="last")
    assert_same_final_weights(final_checkpoint(tmp_path), reference("fast"), stopped_at)


class ShouldStopAt(L.Callback):
    """Ends the run after optimizer step `step` as Lightning's Timer (max_time) does: trainer.should_stop."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
@pytest.mark.parametrize("validation", [True, False], ids=["validating at the stop", "no validation"])
def test_a_run_stopped_by_a_callback_resumes_to_the_weights_of_the_run_left_alone(
    tmp_path, reference, validation, schedule
):
    """Lightning validates where should_stop is set (step 5: a validation the run left alone does not make,
    saved by it); without validation the run's last.ckpt is the one written at train end. With the cosine
    schedule the resumed run must continue the same decay to the same max_steps."""
    stop = {"class_path": "test_resume.ShouldStopAt", "init_args": {"step": KILL_STEP + 1}}
    no_validation = [] if validation else ["--trainer.limit_val_batches", "0"]
    lr = ["--model.lr_schedule", schedule]
    extra = ["--checkpoint.every_n_train_steps", "null", *no_validation, *lr]
    main(args(tmp_path, *ONE_PROCESS, *extra, "--trainer.callbacks=" + json.dumps([stop])))
    stopped_at = load(checkpoints(tmp_path) / "last.ckpt")
    assert stopped_at["global_step"] == KILL_STEP + 1
    main(args(tmp_path, *ONE_PROCESS, *extra, "--ckpt_path", "last"))
    assert_same_final_weights(final_checkpoint(tmp_path), reference("fast", *lr), stopped_at)


def test_validating_at_other_steps_leaves_the_training_weights_unchanged(tmp_path, reference):
    """A resumed run may change --trainer.val_check_interval: validation must not move the global RNG that
    dropout draws from (the val loader's iterator takes its seed from a generator of its own)."""
    main(args(tmp_path, *ONE_PROCESS, "--trainer.val_check_interval", "3"))  # the reference validates every 2
    weights = network_weights(final_checkpoint(tmp_path))
    for kind, expected in network_weights(reference("fast")).items():
        assert max_abs_diff(weights[kind], expected) <= TOLERANCE, kind


@pytest.mark.multiprocess
def test_a_ddp_run_killed_while_saving_resumes_to_the_weights_of_the_run_left_alone(tmp_path):
    """Two processes, the default fast noise (a generator per rank) and dropout (a global RNG per rank);
    killed half-way through writing last.ckpt at step 5, so it resumes from the intact last.ckpt of step 4."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        left_alone = pool.submit(launch, tmp_path / "left_alone", *TWO_PROCESSES, ranks=2)
        kill = kill_at(KILL_STEP + 1, during_save_of="last.ckpt")
        killed = pool.submit(launch, tmp_path / "killed", *TWO_PROCESSES, kill, ranks=2)
        left_alone, killed = left_alone.result(), killed.result()
    assert left_alone.returncode == 0, left_alone.output[-4000:]
    assert killed.returncode == -signal.SIGKILL, killed.output[-4000:]
    last = checkpoints(tmp_path / "killed") / "last.ckpt"
    killed_at = load(last)
    assert killed_at["global_step"] == KILL_STEP and len(killed_at["random_states"]) == 2
    resumed = launch(tmp_path / "killed", *TWO_PROCESSES, "--ckpt_path", str(last), ranks=2)
    assert resumed.returncode == 0, resumed.output[-4000:]
    reference = final_checkpoint(tmp_path / "left_alone")
    assert_same_final_weights(final_checkpoint(tmp_path / "killed"), reference, killed_at)


# ---- atomic saves ---------------------------------------------------------------------------------------
def test_a_run_killed_while_writing_last_ckpt_keeps_the_previous_one_and_resumes_exactly(tmp_path, reference):
    system_tmp = tmp_path / "system_tmp"  # the killed run's tempfile.gettempdir()
    system_tmp.mkdir()
    kill = kill_at(KILL_STEP + 1, during_save_of="last.ckpt")
    killed = launch(tmp_path, *ONE_PROCESS, kill, env={"TMPDIR": str(system_tmp)})
    assert killed.returncode == -signal.SIGKILL, killed.output[-4000:]
    folder = checkpoints(tmp_path)
    assert load(folder / "last.ckpt")["global_step"] == KILL_STEP  # the previous last.ckpt, intact
    assert load(folder / f"step={KILL_STEP + 1}.ckpt")["global_step"] == KILL_STEP + 1  # written before it
    # The half-written file is a hidden temporary beside them, and nothing was staged elsewhere.
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    assert len(leftovers) == 1 and leftovers[0].startswith(".last.ckpt.") and leftovers[0].endswith(".tmp")
    assert not list(system_tmp.iterdir())
    main(args(tmp_path, *ONE_PROCESS, "--ckpt_path", "last"))
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]  # the resumed run removed it
    assert_same_final_weights(final_checkpoint(tmp_path), reference("fast"), load(folder / "step=4.ckpt"))


FULL_DISK = OSError(errno.ENOSPC, "No space left on device")


def half_written_then_full(obj, file, *args, **kwargs):
    file.write(b"\x00" * 4096)  # some bytes reach the file, then the disk is full
    raise FULL_DISK


@pytest.mark.parametrize(
    ("function", "failing"),
    [(torch, "save"), (os, "fsync"), (os, "replace")],
    ids=["while writing", "at fsync", "at rename"],
)
def test_a_failed_save_keeps_the_previous_checkpoint_and_leaves_no_temporary_file(
    tmp_path, monkeypatch, function, failing
):
    system_tmp = tmp_path / "system_tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))  # tempfile.gettempdir() is now this folder
    folder = tmp_path / "checkpoints"
    writer = AtomicCheckpointIO()
    previous = {"state_dict": {"w": torch.arange(4.0)}, "global_step": 1}
    writer.save_checkpoint(previous, folder / "last.ckpt")
    assert sorted(os.listdir(folder)) == ["last.ckpt"]  # the rename left nothing behind

    def fail(*args, **kwargs):
        raise FULL_DISK

    monkeypatch.setattr(function, failing, half_written_then_full if failing == "save" else fail)
    new = {"state_dict": {"w": torch.randn(10_000)}, "global_step": 2}
    for name in ("last.ckpt", "step=2.ckpt"):  # over an existing checkpoint, and a new name
        with pytest.raises(DiskFull) as raised:  # said of the folder (tests/training/test_full_disk.py)
            writer.save_checkpoint(new, folder / name)
        assert raised.value.__cause__.errno == errno.ENOSPC and raised.value.folder == folder
    monkeypatch.undo()
    assert sorted(os.listdir(folder)) == ["last.ckpt"]
    assert torch.equal(load(folder / "last.ckpt")["state_dict"]["w"], previous["state_dict"]["w"])
    assert not list(system_tmp.iterdir())


@pytest.mark.parametrize("symlinks", [True, False], ids=["symlink", "copy where symlinks fail"])
def test_last_ckpt_as_a_link_is_replaced_in_one_step(tmp_path, monkeypatch, symlinks):
    """`--checkpoint.save_last link`: Lightning removes last.ckpt, then links (or copies) the newest file."""
    folder = tmp_path / "checkpoints"
    writer = AtomicCheckpointIO()
    for step in (1, 2):
        writer.save_checkpoint({"state_dict": {}, "global_step": step}, folder / f"step={step}.ckpt")
    last = folder / "last.ckpt"
    last.symlink_to("step=1.ckpt")
    rank_zero = SimpleNamespace(is_global_zero=True, strategy=SimpleNamespace(barrier=lambda *args: None))
    if not symlinks:

        def no_symlinks(*args, **kwargs):
            raise OSError("symbolic links need a privilege here")

        monkeypatch.setattr(Path, "symlink_to", no_symlinks)
    replace = os.replace

    def fail(*args, **kwargs):
        raise FULL_DISK

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(DiskFull):
        Checkpoint._link_checkpoint(rank_zero, str(folder / "step=2.ckpt"), str(last))
    assert load(last)["global_step"] == 1  # the failed replacement left the previous last.ckpt
    monkeypatch.setattr(os, "replace", replace)
    Checkpoint._link_checkpoint(rank_zero, str(folder / "step=2.ckpt"), str(last))
    assert load(last)["global_step"] == 2 and last.is_symlink() == symlinks
    assert sorted(os.listdir(folder)) == ["last.ckpt", "step=1.ckpt", "step=2.ckpt"]
