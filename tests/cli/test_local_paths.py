"""Paths the commands cannot use as given, said as what they are (round 15a's R1-R3): an object-storage URL where a
command reads or writes local files only (pathlib read `s3://b/x` as the local folder `s3:/b/x`, wrote there and
said "wrote ... to s3:/b/x"); a torch checkpoint named .safetensors (torch.load read it as safetensors: a "bug in
diffusion" traceback); a folder of snapshots, an export or a diffusers model given for a training checkpoint
(said "holds no checkpoint")."""

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers.user_errors import fill, run_in_process

from diffusion import load_checkpoint
from diffusion.cli import evaluate, export, phema, sample
from diffusion.cli.flags import check_writable_folder, given_checkpoint
from diffusion.errors import UserError
from diffusion.training import checkpoint_files, run_folders
from diffusion.training.checkpoint_files import read_checkpoint, read_network_weights

CKPT = "{user}/runs/digits/version_0/checkpoints/last.ckpt"
RUN = "{user}/runs/digits/version_0"
SAMPLES = "{user}/samples/samples.npz"
WRITES_LOCAL = (
    r"is an object-storage URL, and {} writes local files only — pass a local path, and copy the result up"
)
READS_LOCAL = r"is an object-storage URL, and a {} is read from a local path only — copy it to a local path"

OUTPUTS = {
    "sample": (sample.main, ["--ckpt", CKPT, "--num_samples", "2", "--steps", "2", "--out", "s3://bkt/smp"]),
    "export": (export.main, ["--ckpt", CKPT, "--format", "safetensors", "--out", "gs://bkt/x"]),
    "export_diffusers": (export.main, ["--ckpt", CKPT, "--format", "diffusers", "--out", "az://c/x"]),
    "phema": (phema.main, ["--run", RUN, "--sigma_rel", "0.1", "--out", "s3://bkt/p.ckpt"]),
    "evaluate": (
        evaluate.main,
        [
            "--samples",
            SAMPLES,
            "--reference",
            "digits",
            "--features",
            "pixels",
            "--save_stats",
            "az://c/st.npz",
        ],
    ),
}


@pytest.mark.parametrize("case", OUTPUTS)
def test_an_object_storage_output_is_refused(case, user, capsys, tmp_path):
    command, flags = OUTPUTS[case]
    line = run_in_process(command, fill(flags, user), user, capsys)
    url = flags[-1]
    flag = flags[-2]
    assert re.search(f"^error: {flag} {url} " + WRITES_LOCAL.format(case.split("_")[0]), line), line
    assert not list(tmp_path.glob("*:")), "a local folder named after the URL's scheme was made"


INPUTS = {
    "sample_ckpt": (sample.main, ["--ckpt", "s3://bkt/x.ckpt", "--out", "{user}/new"], "--ckpt", "model"),
    "export_json": (
        export.main,
        ["--ckpt", "gs://b/config.json", "--format", "safetensors", "--out", "{user}/new"],
        "--ckpt",
        "model",
    ),
    "evaluate_samples": (
        evaluate.main,
        ["--samples", "s3://b/s.npz", "--reference", "digits"],
        "--samples",
        "NumPy file",
    ),
    "phema_run": (
        phema.main,
        ["--run", "s3://b/run", "--sigma_rel", "0.1", "--out", "{user}/p.ckpt"],
        "--run",
        "run folder",
    ),
}


@pytest.mark.parametrize("case", INPUTS)
def test_an_object_storage_input_is_said_as_one(case, user, capsys):
    """Said "no checkpoint at s3:/bkt/x.ckpt" (the URL's // collapsed) or "does not exist"."""
    command, flags, flag, what = INPUTS[case]
    line = run_in_process(command, fill(flags, user), user, capsys)
    url = flags[flags.index(flag) + 1]
    assert re.search(f"^error: {flag} {url} " + READS_LOCAL.format(what), line), line


@pytest.mark.skipif(
    importlib.util.find_spec("s3fs") is not None, reason="s3fs installed: Lightning writes there"
)
def test_a_trainer_folder_on_object_storage_without_its_fsspec_package():
    """train.py's folders go through Lightning's fsspec, which may write to s3:// (not refused); without s3fs its
    ImportError ended the run as a bug in diffusion."""
    with pytest.raises(UserError, match=r"s3://b/runs is an object-storage URL, which Lightning writes through "
                       r"fsspec, and fsspec cannot write there \(.*s3fs"):  # fmt: skip
        check_writable_folder("s3://b/runs", "--trainer.logger.init_args.save_dir")


def test_phema_refuses_an_out_that_is_no_ckpt_name(user, capsys, tmp_path):
    """It wrote a torch checkpoint under the name x.safetensors without a word."""
    out = tmp_path / "x.safetensors"
    args = fill(["--run", RUN, "--sigma_rel", "0.1", "--out", str(out)], user)
    line = run_in_process(phema.main, args, user, capsys)
    assert line == (
        f"error: --out {out} is not a .ckpt name, and phema writes a training checkpoint (torch.save) — name it "
        f".ckpt: --out {tmp_path / 'x.ckpt'} (python -m diffusion.export writes safetensors from it)"
    )
    assert not out.exists()


@pytest.fixture
def named_safetensors(user, tmp_path) -> Path:
    path = tmp_path / "ck.safetensors"
    shutil.copyfile(fill([CKPT], user)[0], path)
    return path


RENAME = r"is a PyTorch checkpoint \(torch.save\) named .safetensors — rename it to .ckpt"


@pytest.mark.parametrize("command", [sample, export])
def test_a_checkpoint_named_safetensors_is_said_as_one(command, named_safetensors, user, capsys, tmp_path):
    """torch.load reads a file named .safetensors as one: "this is a bug in diffusion" and a SafetensorError."""
    args = ["--ckpt", str(named_safetensors), "--out", str(tmp_path / "out")]
    args += ["--format", "safetensors"] if command is export else []
    line = run_in_process(command.main, args, user, capsys)
    assert re.search(f"^error: --ckpt {named_safetensors} {RENAME}", line), line


def test_a_checkpoint_named_safetensors_in_python(named_safetensors):
    """load_checkpoint, and train.py's --ckpt_path (read_checkpoint) and --model.init_from (read_network_weights)."""
    for read in (load_checkpoint, read_checkpoint, read_network_weights):
        with pytest.raises(ValueError, match=RENAME):
            read(named_safetensors)


def test_a_snapshots_folder_given_for_a_checkpoint(user, capsys, tmp_path):
    """sample said "is a folder, and it holds no checkpoint (*.ckpt)" where export said what the folder is."""
    folder = tmp_path / "run" / "post_hoc_ema"
    folder.mkdir(parents=True)
    torch.save({}, folder / "step=4-sigma_rel=0.05.pt")
    line = run_in_process(sample.main, ["--ckpt", str(folder), "--out", str(tmp_path / "s")], user, capsys)
    assert line == (
        f"error: --ckpt {folder} is a post-hoc EMA snapshots folder, which holds one profile's averages, not a "
        f"model — reconstruct a model from the snapshots first (python -m diffusion.phema with the run "
        f"{folder.parent} and a sigma_rel writes a .ckpt), then pass that checkpoint"
    )


def test_the_snapshot_names_agree():
    """checkpoint_files cannot import run_folders (which imports it): its copies of the names are theirs."""
    assert (checkpoint_files.POST_HOC_EMA, checkpoint_files.SNAPSHOT_FILES) == (
        run_folders.POST_HOC_EMA,
        run_folders.SNAPSHOT_FILES,
    )


def test_an_export_given_for_a_training_checkpoint(user, capsys, tmp_path):
    """train.py's --ckpt_path and phema's --ckpt (a training checkpoint, not a model) said "holds no checkpoint"."""
    folder = tmp_path / "exported"
    export.main(["--ckpt", fill([CKPT], user)[0], "--format", "safetensors", "--out", str(folder)])
    capsys.readouterr()
    one_set = (
        "is an export .python -m diffusion.export., which holds one set of weights and no training state"
    )
    with pytest.raises(ValueError, match=f"^--ckpt_path {folder} {one_set}"):
        read_checkpoint(folder, "--ckpt_path")  # train.py's --ckpt_path
    with pytest.raises(UserError, match=f"^--ckpt {folder} {one_set}"):
        given_checkpoint(str(folder))  # phema's --ckpt


@pytest.mark.skipif(
    importlib.util.find_spec("gcsfs") is not None, reason="gcsfs installed: Lightning writes there"
)
def test_a_checkpoint_dirpath_on_object_storage_without_its_fsspec_package(capsys, tmp_path, monkeypatch):
    """Lightning built its checkpoint callback on gs:// before any check: an ImportError, "a bug in diffusion"."""
    from helpers.parse_errors import train_line

    monkeypatch.chdir(tmp_path)
    line = train_line(["--checkpoint.dirpath", "gs://b/c"], capsys)
    assert re.match(r"--checkpoint.dirpath gs://b/c is an object-storage URL, which Lightning writes through fsspec, "
                    r"and fsspec cannot write there \(.*gcsfs", line), line  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # no local folder named gs:


GOOD_SAMPLE = ["--sampler", "ddim", "--steps", "2", "--num_samples", "2"]


@pytest.mark.parametrize("flag", ["--out", "--ckpt"])
def test_sample_refuses_an_empty_path(flag, user, tmp_path, capsys, monkeypatch):
    """`--out ""` (an unset shell variable) wrote into the working folder, `--ckpt ""` sampled a checkpoint found
    there: refused, naming the flag. Run in the user's folder, which run_in_process checks is left unchanged."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(user)
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    args = ["--ckpt", str(good), "--out", str(tmp_path / "new"), *GOOD_SAMPLE, flag, ""]
    line = run_in_process(sample.main, args, user, capsys)
    assert re.fullmatch(
        rf'error: {flag} "" is an empty path — pass a path \(an unset shell variable .*', line
    )


def test_sample_refuses_an_empty_path_of_a_config_file_by_its_key(user, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(user)
    (tmp_path / "run.yaml").write_text('out: ""\n')
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    args = ["--ckpt", str(good), *GOOD_SAMPLE, "--config", str(tmp_path / "run.yaml")]
    line = run_in_process(sample.main, args, user, capsys)
    assert re.match(r'error: \S*run.yaml: out "" is an empty path — pass a path', line), line


@pytest.mark.parametrize("flag", ["--samples", "--reference", "--save_stats", "--data_root"])
def test_evaluate_refuses_an_empty_path(flag, user, capsys, monkeypatch):
    monkeypatch.chdir(user)
    samples = str(user / "samples" / "samples.npz")
    args = ["--samples", samples, "--reference", "digits", "--features", "pixels", flag, ""]
    line = run_in_process(evaluate.main, args, user, capsys)
    assert re.fullmatch(rf'error: {flag} "" is an empty path — pass a path .*', line), line
