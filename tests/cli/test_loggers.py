"""Any Lightning logger: TensorBoard is the default, and a CSV log, Weights & Biases (offline) and MLflow (a local
file store) get the metrics and the sample grids too; each run's checkpoints, config.yaml and grids share one run folder
(`<save_dir>/<name>/<version>/`, as Lightning derives the checkpoints' folder from the logger), which
`--ckpt_path last` finds and goes on writing into. A folder none of them can write is one line naming its flag."""

import csv
import importlib.util
import os
import re

import pytest
import torch
import wandb
from helpers import QUICK, TINY_UNET, VALIDATING_EVERY_2
from helpers.user_errors import run_in_process
from lightning.pytorch.loggers import WandbLogger
from mlflow.tracking import MlflowClient

from diffusion.cli.train import main as train

CSV = ["--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.init_args.name", "digits"]
WANDB = ["--trainer.logger", "lightning.pytorch.loggers.WandbLogger", "--trainer.logger.init_args.project", "digits",
         "--trainer.logger.init_args.offline", "true"]  # fmt: skip


def mlflow_logger(store) -> list[str]:
    return ["--trainer.logger", "lightning.pytorch.loggers.MLFlowLogger", "--trainer.logger.init_args.experiment_name",
            "digits", "--trainer.logger.init_args.tracking_uri", f"file:{store}"]  # fmt: skip


def run(logger: list[str], save_dir, *extra: str):
    return train(
        [*TINY_UNET, *QUICK, *VALIDATING_EVERY_2, "--trainer.log_every_n_steps", "1", *logger, "--trainer.logger.init_args.save_dir",
         str(save_dir), *extra]
    )  # fmt: skip


def test_a_csv_log_gets_the_metrics_and_ckpt_path_last_goes_on_in_its_folder(tmp_path):
    run(CSV, tmp_path)
    folder = tmp_path / "digits" / "version_0"
    with (folder / "metrics.csv").open() as file:
        columns = next(csv.reader(file))
    assert {"train/loss", "val/loss"} <= set(columns)
    assert (folder / "checkpoints" / "last.ckpt").is_file() and (folder / "config.yaml").is_file()
    assert sorted(path.name for path in (folder / "samples").glob("step_*.png")) == [
        "step_0000002.png", "step_0000004.png"
    ]  # fmt: skip

    run(CSV, tmp_path, "--ckpt_path", "last", "--max_steps", "6")
    assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    assert (folder / "config-resumed-at-step-4.yaml").is_file() and (
        folder / "samples" / "step_0000006.png"
    ).is_file()
    assert not (tmp_path / "digits" / "version_1").exists()


@pytest.fixture
def wandb_calls(monkeypatch) -> dict[str, list]:
    """What reached the W&B logger (W&B itself stores it in its offline run files)."""
    calls = {"metrics": [], "images": []}
    log_metrics, log_image = WandbLogger.log_metrics, WandbLogger.log_image

    def record_metrics(self, metrics, step=None):
        calls["metrics"].append(dict(metrics))
        return log_metrics(self, metrics, step)

    def record_image(self, key, images, step=None, **kwargs):
        calls["images"].append((key, list(images), step))
        return log_image(self, key, images, step, **kwargs)

    monkeypatch.setattr(WandbLogger, "log_metrics", record_metrics)
    monkeypatch.setattr(WandbLogger, "log_image", record_image)
    monkeypatch.setenv("WANDB_SILENT", "true")
    return calls


def test_weights_and_biases_offline_gets_metrics_and_grids_and_ckpt_path_last_resumes_its_run(
    tmp_path, wandb_calls
):
    run(WANDB, tmp_path)
    (folder,) = [path.parent.parent for path in (tmp_path / "digits").glob("*/checkpoints/last.ckpt")]
    assert (folder / "config.yaml").is_file()  # the run's folder, not W&B's save_dir shared by every run
    assert any("train/loss" in metrics for metrics in wandb_calls["metrics"])
    assert any("val/loss" in metrics for metrics in wandb_calls["metrics"])
    assert [(key, step) for key, _, step in wandb_calls["images"]] == [("samples", 2), ("samples", 4)]
    assert all(
        (folder / "samples").joinpath(f"step_{step:07d}.png").is_file()
        for _, _, step in wandb_calls["images"]
    )

    wandb.finish()  # as the first run's process would at exit: else the next logger attaches to its run
    run(WANDB, tmp_path, "--ckpt_path", "last", "--max_steps", "6")
    assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    assert len(list((tmp_path / "digits").glob("*/checkpoints"))) == 1  # it went on in the same run
    assert (folder / "config-resumed-at-step-4.yaml").is_file()


def test_a_logger_whose_package_is_missing_is_named_in_one_line(tmp_path, monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a)
    )
    with pytest.raises(SystemExit) as exit_info:
        run(WANDB, tmp_path)
    assert exit_info.value.code == 2
    assert (
        "WandbLogger needs the wandb package, which is not installed — pip install wandb"
        in capsys.readouterr().err
    )
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def no_file_store_opt_in(monkeypatch) -> None:
    """MLFLOW_ALLOW_FILE_STORE unset, as on a user's machine (set, then deleted, so that it is restored after)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "unset")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")


def test_mlflow_gets_metrics_and_grids_and_ckpt_path_last_resumes_its_newest_run(
    tmp_path, no_file_store_opt_in
):
    store = tmp_path / "mlruns"
    run(mlflow_logger(store), tmp_path)
    run(mlflow_logger(store), tmp_path, "--max_steps", "2")  # the newest run
    client = MlflowClient(f"file:{store}")
    experiment = client.get_experiment_by_name("digits").experiment_id
    older, newest = sorted(client.search_runs([experiment]), key=lambda found: found.info.start_time)
    assert {"train/loss", "val/loss"} <= set(older.data.metrics)
    assert [artifact.path for artifact in client.list_artifacts(older.info.run_id, "samples")] == [
        "samples/step_0000002.png", "samples/step_0000004.png"
    ]  # fmt: skip
    folder = store / experiment / newest.info.run_id  # Lightning's run folder is the MLflow run's
    assert (folder / "checkpoints" / "last.ckpt").is_file() and (folder / "config.yaml").is_file()

    run(mlflow_logger(store), tmp_path, "--ckpt_path", "last", "--max_steps", "6")
    assert {found.info.run_id for found in client.search_runs([experiment])} == {
        older.info.run_id, newest.info.run_id
    }  # fmt: skip
    assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    assert (folder / "config-resumed-at-step-2.yaml").is_file()
    assert len(client.get_metric_history(newest.info.run_id, "val/loss")) == 3  # steps 2, 4, 6 in the one run
    assert [artifact.path for artifact in client.list_artifacts(newest.info.run_id, "samples")] == [
        "samples/step_0000002.png", "samples/step_0000004.png", "samples/step_0000006.png"
    ]  # fmt: skip
    older_folder = store / experiment / older.info.run_id
    assert torch.load(older_folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


@pytest.mark.parametrize(
    "tracking_uri, expected",
    [
        ("http://localhost:5000", "--ckpt_path last finds the runs of an MLflow file store, and this run logs to the "
         "tracking server http://localhost:5000 — pass the path of a checkpoint"),
        ("file:{tmp_path}/mlruns", "--ckpt_path last: no MLflow experiment 'digits' in {tmp_path}/mlruns — train "
         "first"),
    ],
)  # fmt: skip
def test_ckpt_path_last_without_an_mlflow_run_to_find_says_what_to_pass(
    tmp_path, capsys, tracking_uri, expected
):
    logger = [*mlflow_logger(tmp_path / "mlruns")[:-1], tracking_uri.format(tmp_path=tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        run(logger, tmp_path, "--ckpt_path", "last")
    assert exit_info.value.code == 2
    assert expected.format(tmp_path=tmp_path) in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no store made on the way


def test_a_checkpoint_of_another_logger_resumed_with_mlflow_goes_on_in_a_new_mlflow_run(
    tmp_path, digits_checkpoint, no_file_store_opt_in
):
    tensorboard_run = digits_checkpoint.parents[1]
    files = sorted(tensorboard_run.rglob("*"))
    store = tmp_path / "mlruns"
    run(mlflow_logger(store), tmp_path, "--ckpt_path", str(digits_checkpoint), "--max_steps", "6")
    (folder,) = [path.parents[1] for path in store.glob("*/*/checkpoints/last.ckpt")]
    assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    assert (folder / "config.yaml").is_file()
    assert sorted(tensorboard_run.rglob("*")) == files  # the TensorBoard run is left as it was


UNWRITABLE_CASES = {  # id: (logger flags, the flag that names the folder)
    "tensorboard": ([], "save_dir"),
    "csv": (CSV, "save_dir"),
    "wandb": (WANDB, "save_dir"),
    "mlflow": (["--trainer.logger", "lightning.pytorch.loggers.MLFlowLogger"], "save_dir"),
    "mlflow_file_store": (mlflow_logger("{folder}"), "tracking_uri"),
}


@pytest.mark.parametrize(("logger", "flag"), UNWRITABLE_CASES.values(), ids=UNWRITABLE_CASES.keys())
def test_an_unwritable_folder_of_any_logger_is_one_line_naming_its_flag(logger, flag, tmp_path, capsys):
    if os.geteuid() == 0:  # root writes into a read-only folder: a path under a file is one no one can create
        (tmp_path / "a_file").write_text("not a folder")
        folder, problem = (
            tmp_path / "a_file" / "runs",
            r"a_file is a file, not a folder — pass a path through",
        )
    else:
        (tmp_path / "read_only").mkdir(mode=0o500)
        folder, problem = tmp_path / "read_only" / "runs", r"cannot write into .*read_only .* — pick a folder"
    args = [*TINY_UNET, *QUICK, *[arg.format(folder=folder) for arg in logger]]
    if flag == "save_dir":
        args += ["--trainer.logger.init_args.save_dir", str(folder)]
    line = run_in_process(train, args, tmp_path, capsys)
    assert re.search(rf"--trainer.logger.init_args.{flag} .*{folder}: .*{problem}", line), line


@pytest.mark.parametrize("logger", [[], CSV], ids=["tensorboard", "csv"])
def test_a_negative_run_version_is_refused(logger, tmp_path, capsys):
    """`--trainer.logger.init_args.version -1` made runs/NAME/version_-1 without a word (tester round 14a)."""
    args = [*TINY_UNET, *QUICK, *logger, "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]
    line = run_in_process(train, [*args, "--trainer.logger.init_args.version", "-1"], tmp_path, capsys)
    assert line == (
        "error: --trainer.logger.init_args.version -1 is negative — pass a version number >= 0 (or a name), or "
        "leave it out for the next free version_N"
    )
    assert not (tmp_path / "runs").exists()
