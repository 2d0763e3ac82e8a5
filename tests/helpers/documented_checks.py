"""What tests/test_documented_commands.py checks after a documented command ran (`Ran`: its folder, exit status,
return value and output; one check per kind of result: a trained run, samples, scores, an export, ...), and the
stand-ins it runs a command under where what the command reads is not here (CIFAR-10's pixels, W&B's run)."""

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from diffusion.training.loading import load_checkpoint
from diffusion.training.post_hoc_ema import find_snapshots


# ---- what a run must have written ------------------------------------------------------------------------------
@dataclass
class Ran:
    """A command's run: its working folder, exit status (None: it raised), what its main returned and printed."""

    folder: Path | None  # None: not run
    code: int | None
    value: object = None
    output: str = ""
    error: str = ""


def checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def trained(name: str, steps: int = 2, version: str = "version_0", **expected) -> Callable[[Ran], None]:
    """runs/<name>/<version> (and no other version; `version` a glob, `torchrun-*` for a job's run whose id is
    torchrun's) holds last.ckpt at `steps`, the step's grid, loss.png and config.yaml; `expected`: hyperparameters,
    `network_<arg>` of the network, `trainer_<arg>` of the saved config."""

    def check(ran: Ran) -> None:
        runs = sorted((ran.folder / "runs" / name).glob(version))
        assert len(runs) == 1, runs
        run = runs[0]
        state = checkpoint(run / "checkpoints" / "last.ckpt")
        assert state["global_step"] == steps
        assert (run / "samples" / f"step_{steps:07d}.png").is_file() and (run / "loss.png").is_file()
        assert not (run.parent / "version_1").exists()
        config = yaml.safe_load((run / "config.yaml").read_text())
        network = state["hyper_parameters"]["network"]["init_args"]
        for key, value in expected.items():
            if key.startswith("trainer_"):
                assert str(config["trainer"][key.removeprefix("trainer_")]) == str(value), key
            elif key.startswith("network_"):
                assert network[key.removeprefix("network_")] == value, key
            else:
                assert state["hyper_parameters"][key] == value, key

    return check


def prepared_set(out: str, sample_shape: tuple[int, ...], labelled: bool) -> Callable[[Ran], None]:
    """OUT is a prepared set that opens (its checks pass) with these samples, labelled or not, and a validation part."""

    def check(ran: Ran) -> None:
        from diffusion.data.prepared import open_prepared

        prepared = open_prepared(str(ran.folder / out))
        assert prepared.sample_shape == sample_shape and (prepared.class_names is not None) == labelled
        assert prepared.counts["train"] > 0 and prepared.counts.get("val", 0) > 0

    return check


def streamed_from(out: str) -> Callable[[Ran], None]:
    """The run trained on the prepared set at OUT: its saved config names it."""

    def check(ran: Ran) -> None:
        configs = list((ran.folder / "runs").glob("*/version_0/config.yaml"))
        assert len(configs) == 1, configs
        data = yaml.safe_load(configs[0].read_text())["data"]["init_args"]
        assert data["dataset"] == "streaming" and data["root"] == out, data

    return check


def samples(count: int, shape: tuple[int, ...], labels: list[int] | None = None) -> Callable[[Ran], None]:
    """samples/samples.npz: `count` uint8 images (H, W, C) = `shape`, not all one value, and the labels of a
    class-conditional model; grid.png beside it."""

    def check(ran: Ran) -> None:
        with np.load(ran.folder / "samples" / "samples.npz") as written:
            assert written["arr_0"].shape == (count, *shape) and written["arr_0"].dtype == np.uint8
            assert written["arr_0"].std() > 0
            assert (written["arr_1"].tolist() if "arr_1" in written else None) == labels
        assert (ran.folder / "samples" / "grid.png").is_file()

    return check


def scores(*names: str) -> Callable[[Ran], None]:
    """evaluate returned (and printed) these values, finite."""

    def check(ran: Ran) -> None:
        assert set(names) <= set(ran.value) and all(np.isfinite(ran.value[name]) for name in names), ran.value

    return check


def exported(out: str, format: str) -> Callable[[Ran], None]:
    """OUT holds the export: safetensors that load_checkpoint reads back as the digits model, or a DDPMPipeline's
    files with its UNet sized for the digits."""

    def check(ran: Ran) -> None:
        folder = ran.folder / out
        if format == "safetensors":
            assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
            assert load_checkpoint(folder).sample_shape == (1, 8, 8)
        else:
            assert json.loads((folder / "model_index.json").read_text())["_class_name"] == "DDPMPipeline"
            unet = json.loads((folder / "unet" / "config.json").read_text())
            assert (unet["sample_size"], unet["in_channels"]) == (8, 1)
            assert (folder / "scheduler" / "scheduler_config.json").is_file()

    return check


def phema_checkpoint(sigma_rel: float) -> Callable[[Ran], None]:
    def check(ran: Ran) -> None:
        written = checkpoint(ran.folder / "phema.ckpt")
        assert written["post_hoc_ema"]["sigma_rel"] == pytest.approx(sigma_rel)
        assert written["global_step"] == 2

    return check


def sweep_table(*sigma_rels: float, out: bool = False) -> Callable[[Ran], None]:
    """The sweep's table: the run's EMA and one row per sigma_rel; with --out, the best one's checkpoint."""

    def check(ran: Ran) -> None:
        rows = re.findall(r"^\| post-hoc EMA \| ([\d.]+) \|", ran.output, flags=re.M)
        assert [float(row) for row in rows] == list(sigma_rels) and "| the run's EMA" in ran.output
        assert (ran.folder / "phema.ckpt").is_file() == out

    return check


def every(*checks: Callable[[Ran], None]) -> Callable[[Ran], None]:
    def check(ran: Ran) -> None:
        for one in checks:
            one(ran)

    return check


def printed_config(ran: Ran) -> None:
    config = yaml.safe_load(ran.output)
    assert config["data"]["init_args"]["dataset"] == "digits" and config["trainer"]["max_steps"] == 2400


def bits_per_dim(ran: Ran) -> None:
    assert ran.value["num_images"] == 2 and 0 < ran.value["bits_per_dim"] < 20


def resumed(ran: Ran) -> None:
    run = ran.folder / "runs" / "digits" / "version_0"
    assert checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 4
    assert (run / "config-resumed-at-step-2.yaml").is_file() and not (run.parent / "version_1").exists()


def the_jobs_run(name: str, version: str) -> Callable[[Ran], None]:
    """`--ckpt_path auto`: the job's run, runs/<name>/<version> (a glob), the only one, whose config.yaml records
    `ckpt_path: auto` and its version (run again with --config, it resumes that run)."""

    def check(ran: Ran) -> None:
        (run,) = (ran.folder / "runs" / name).iterdir()
        assert run.match(version), run
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert config["ckpt_path"] == "auto"
        assert config["trainer"]["logger"]["init_args"]["version"] == run.name

    return check


def post_hoc_snapshots(ran: Ran) -> None:
    snapshots = find_snapshots(ran.folder / "runs" / "digits" / "version_0" / "post_hoc_ema")
    assert {snapshot.step for snapshot in snapshots} == {1, 2}


def statistics_file(ran: Ran) -> None:
    with np.load(ran.folder / "cifar10_train.npz") as stats:  # of 8x8 pixels of 3 channels
        assert stats["mu"].shape == (192,) and stats["sigma"].shape == (192, 192)
        assert stats["features"] == "pixels"


def fid_monitored(ran: Ran) -> None:
    state = checkpoint(ran.folder / "runs" / "cifar10" / "version_0" / "checkpoints" / "last.ckpt")
    (saver,) = [value for key, value in state["callbacks"].items() if "val/fid" in key]
    assert np.isfinite(float(saver["best_model_score"]))


def step_report(ran: Ran) -> None:
    (line,) = (ran.folder / "runs" / "speed.jsonl").read_text().splitlines()
    report = json.loads(line)
    assert report["median_ms"] > 0 and report["peak_tflops"] == 790


def a_checkpoint_under(folder: str) -> Callable[[Ran], None]:
    def check(ran: Ran) -> None:
        (last,) = (ran.folder / folder).rglob("last.ckpt")
        assert checkpoint(last)["global_step"] == 2

    return check


def csv_log(ran: Ran) -> None:
    columns = (ran.folder / "runs" / "digits" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "val/loss" in columns.split(",")


def wandb_offline_run(ran: Ran) -> None:
    """W&B's own files, in the logger's save_dir."""
    assert list((ran.folder / "runs" / "wandb").glob("offline-run-*"))


def two_ranks(ran: Ran) -> None:
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in ran.output


# ---- stand-ins for what is not here ----------------------------------------------------------------------------
@contextlib.contextmanager
def cifar10_pixels() -> Iterator[None]:
    """`--reference cifar10` reads the recipe's ImageDataModule over random pixels (SyntheticCIFAR10)."""
    with pytest.MonkeyPatch.context() as patch:
        from benchmarks.speed.speed_data import SyntheticCIFAR10

        patch.setattr("diffusion.metrics.image_sets.ImageDataModule", SyntheticCIFAR10)
        yield


@contextlib.contextmanager
def wandb_run_ends() -> Iterator[None]:
    """The W&B run ends with the command, as it does when the command's process exits (a later W&B logger in this
    process would attach to it)."""
    try:
        yield
    finally:
        import wandb

        wandb.finish()
