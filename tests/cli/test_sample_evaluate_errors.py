"""The sample and evaluate CLIs' user errors: one line, `error: <what is wrong> — <how to fix it>`, exit status
2, no traceback, and the user's files unchanged (the contract and train.py's cases: tests/cli/test_train_errors.py)."""

import importlib.util
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.user_errors import fill, in_a_config_file, run_in_process
from torchvision import datasets

from diffusion.cli import evaluate, sample
from diffusion.cli.command_line import flags_written

SAMPLE_CASES = {
    "prefix_of_a_flag": (
        ["--step", "3"],
        r"^error: --step is not an option of this command — write --steps if that",
    ),
    "s_tmax_below_s_tmin": (
        ["--sampler", "heun", "--s_churn", "1", "--s_tmin", "5", "--s_tmax", "1"],
        r"^error: --s_tmax 1 is below --s_tmin 5 — pass --s_tmax >= --s_tmin",
    ),
    "num_samples_0": (["--num_samples", "0"], r"--num_samples 0 is out of range — pass a value > 0"),
    "batch_size_0": (["--batch_size", "0"], r"--batch_size 0 is out of range"),
    "devices_0": (["--devices", "0"], r"--devices 0 is out of range"),
    "steps_0": (
        ["--steps", "0"],
        r"^error: --steps 0 is out of range \(must be >= 1\) — pass a step count, or leave it unset",
    ),
    "eta_negative": (
        ["--eta", "-1"],
        r"^error: --eta -1 is out of range \(must be in \[0, 1\]\) — pass 0 for deterministic DDIM",
    ),
    "eta_100": (["--eta", "100"], r"^error: --eta 100 is out of range \(must be in \[0, 1\]\)"),
    "steps_beyond_the_schedule": (
        ["--steps", "5000"],
        r"--steps 5000 is more steps than the schedule's num_timesteps=1000 — pass at most 1000",
    ),
    "unknown_sampler": (
        ["--sampler", "ddqm"],
        r"--sampler ddqm is not one of the choices — choose one of 'ddpm'",
    ),
    "unknown_flag": (
        ["--temperature", "0.5"],
        r"--temperature is not an option of this command — see --help",
    ),
    "config_typo": (
        ["--config", "{user}/typo.yaml"],
        r"typo.yaml: trainer is not an option of this command — see --help",
    ),
    "cuda_without_a_gpu": (["--device", "cuda"], r"--device cuda: no CUDA GPU .* — use --device cpu"),
    "not_a_device": (["--device", "tpu9"], r"--device tpu9 is not a device"),
    # Round 9's Q1: `--accelerator gpu --device cpu` blamed a --device cuda nobody wrote
    "accelerator_and_device_differ": (
        ["--accelerator", "gpu", "--device", "cpu"],
        r"^error: --accelerator gpu and --device cpu name different kinds of device — give one of them",
    ),
    # One device by its index for several processes: the index was dropped (ranks take devices 0..N-1)
    "one_indexed_device_for_several_processes": (
        ["--device", "cuda:1", "--devices", "2"],
        r"^error: --device cuda:1 names one device, and --devices/--num_nodes start 2 processes, one per device "
        r"\(0, 1, \.\.\.\): the index would not be used — drop --device",
    ),
    "accelerator_without_a_gpu": (
        ["--accelerator", "gpu"],
        r"--accelerator gpu: no CUDA GPU .* — use --accelerator cpu",
    ),
    "truncated": (["--ckpt", "{user}/truncated.ckpt"], r"truncated.ckpt is truncated or not a PyTorch"),
    "empty": (["--ckpt", "{user}/empty.ckpt"], r"empty.ckpt is empty"),
    "random_bytes": (["--ckpt", "{user}/random.ckpt"], r"random.ckpt is truncated or not a PyTorch"),
    "a_folder": (
        ["--ckpt", "{user}/runs/toy2d"],
        r"toy2d is a folder holding 2 checkpoints \(version_0/checkpoints/last.ckpt, .*\) — pass the one",
    ),
    "missing": (["--ckpt", "{user}/nope.ckpt"], r"no checkpoint at .*nope.ckpt"),
    "bare_weights": (["--ckpt", "{user}/weights.pt"], r"weights.pt is not a checkpoint written by train.py"),
    "out_is_a_file": (["--out", "{user}/a_file"], r"--out .*a_file is a file, not a folder"),
    "out_under_a_file": (["--out", "{user}/a_file/samples"], r"a_file is a file, not a folder"),
    "samples_exist": (["--out", "{user}/samples"], r"samples.npz exists — pass --overwrite"),
    "grid_exists": (["--out", "{user}/grid_only"], r"grid.png exists — pass --overwrite"),
    # with --overwrite, the OS's IsADirectoryError after the sampling, grid.png moved in (tester 22b, S5)
    "samples_npz_a_folder": (
        ["--out", "{user}/npz_a_folder", "--overwrite"],
        r"--out .*npz_a_folder: .*samples.npz is a folder, where the file samples.npz goes — move that folder away",
    ),
    "guidance_negative": (
        ["--guidance_scale", "-1"],
        r"^error: --guidance_scale -1 is out of range \(must be a finite number >= 0\) — pass 0 for unconditional",
    ),
    "guidance_infinite": (
        ["--guidance_scale", "inf"],
        r"^error: --guidance_scale inf: NaN and infinity are no values of this option — pass a finite number",
    ),
    # torch takes seeds modulo 2**64: 2**70 drew seed 0's samples, and -1 those of 2**64 - 1.
    "seed_beyond_2_64": (
        ["--seed", "1180591620717411303424"],
        r"^error: --seed 1180591620717411303424 is out of range \(must be a whole number in \[0, 2\*\*64 - 1\]\) — "
        r"pass a seed from 0 to "
        r"18446744073709551615",
    ),
    "seed_negative": (
        ["--seed", "-1"],
        r"^error: --seed -1 is out of range \(must be a whole number in \[0, 2\*\*64",
    ),
    "class_of_an_unconditional_model": (
        ["--class_label", "3"],
        r"--class_label: this checkpoint is unconditional .* — sample it without --class_label",
    ),
    "guidance_of_an_unconditional_model": (
        ["--guidance_scale", "2"],
        r"--guidance_scale: this checkpoint is unconditional",
    ),
}


if Path("/proc/self").is_dir():
    SAMPLE_CASES["out_unwritable"] = (
        ["--out", "/proc/samples"],
        r"--out /proc/samples: cannot write into /proc",
    )


@pytest.mark.parametrize(("flags", "expected"), SAMPLE_CASES.values(), ids=SAMPLE_CASES.keys())
def test_sample_reports_a_bad_input_in_one_line(flags, expected, user, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on machines with a GPU
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    args = ["--ckpt", str(good), "--out", str(user / "new"), "--sampler", "ddim", "--steps", "2", "--num_samples",
            "2", *fill(flags, user)]  # fmt: skip
    assert re.search(expected, run_in_process(sample.main, args, user, capsys))


SAMPLE_IN_A_CONFIG_FILE = {  # id of a case of SAMPLE_CASES, its flags written in a file: what the line must say
    "eta_negative": r"^error: \S*run.yaml: eta -1.0 is out of range \(must be in \[0, 1\]\) — pass 0",
    "steps_beyond_the_schedule": r"^error: \S*run.yaml: steps 5000 is more steps than the schedule's",
    "class_of_an_unconditional_model": r"^error: \S*run.yaml: class_label: this checkpoint is unconditional .* — "
    r"sample it without --class_label",
    "out_is_a_file": r"^error: \S*run.yaml: out \S*a_file is a file, not a folder",
    "missing": r"^error: \S*run.yaml: ckpt: no checkpoint at \S*nope.ckpt",
}


@pytest.mark.parametrize(
    ("case", "expected"), SAMPLE_IN_A_CONFIG_FILE.items(), ids=SAMPLE_IN_A_CONFIG_FILE.keys()
)
def test_sample_says_a_bad_value_of_a_config_file_by_the_files_key(case, expected, user, capsys, monkeypatch):
    """The checks after the parse name what the user wrote: a value a --config file gave (after the flags, so it
    is the one taken), by the file and its key."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    flags = fill(SAMPLE_CASES[case][0], user)
    in_the_file = {key for key, _ in flags_written(flags)}  # a flag before the file that sets it is refused
    base = {"ckpt": str(good), "out": str(user / "new"), "sampler": "ddim", "steps": "2", "num_samples": "2"}
    args = [word for key, value in base.items() if key not in in_the_file for word in (f"--{key}", value)]
    args += in_a_config_file(flags, user)
    assert re.search(expected, run_in_process(sample.main, args, user, capsys))


def test_sample_says_a_nan_of_a_config_file_by_the_files_key(user, capsys, monkeypatch):
    # YAML's .nan passes the parser, and the range check's line named the flag: NaN equals no value it was matched to
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (user / "run.yaml").write_text("sampler: ddim\neta: .nan\n")
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    args = ["--ckpt", str(good), "--out", str(user / "new"), "--config", str(user / "run.yaml")]
    line = run_in_process(sample.main, args, user, capsys)
    assert line.startswith(f"error: {user / 'run.yaml'}: eta nan is out of range (must be in [0, 1])"), line


EVALUATE_CASES = {
    "seed_negative": (
        ["--seed", "-1"],
        r"^error: --seed -1 is out of range \(must be a whole number in \[0, 2\*\*64",
    ),
    "missing_samples": (
        ["--samples", "{user}/nope.npz"],
        r"--samples .*nope.npz does not exist — save uint8",
    ),
    "random_bytes": (
        ["--samples", "{user}/random.ckpt"],
        r"random.ckpt is not a \.npy file or an \.npz archive — save uint8 images .* np.savez",
    ),
    # A zip cut short: zipfile's BadZipFile, with a traceback before.
    "truncated_samples": (
        ["--samples", "{user}/truncated.ckpt"],
        r"truncated.ckpt is truncated or corrupt .* — save uint8 images",
    ),
    "truncated_reference": (
        ["--reference", "{user}/truncated.ckpt"],
        r"truncated.ckpt is truncated or corrupt",
    ),
    "folder_without_data_root": (
        ["--reference", "folder", "--data_root", "{user}/nope"],
        r"image folder .*nope does not exist — point --data_root at your images",
    ),
    "folder_without_images": (
        ["--reference", "folder", "--data_root", "{user}/samples"],
        r"no images found under .*samples .* — put your images there, or point --data_root at",
    ),
    "inception_weights_missing": (
        ["--features", "inception", "--inception_weights", "{user}/nope.pth"],
        r"--inception_weights .*nope.pth does not exist — pass torch-fidelity's weights",
    ),
    "unknown_reference": (["--reference", "imagenet"], r"'imagenet' is neither .* datasets"),
    "unknown_features": (["--features", "clip"], r"--features clip is not one of the choices"),
    "kid_subset_size_1": (
        ["--kid_subset_size", "1"],
        r"--kid_subset_size 1 is out of range — pass a value >= 2",
    ),
    "batch_size_0": (["--batch_size", "0"], r"--batch_size 0 is out of range"),
    "not_a_device": (["--device", "tpu9"], r"--device tpu9 is not a device — pass cpu, cuda or cuda:N"),
    "missing_reference": (["--reference", "{user}/nope.npz"], r"--reference .*nope.npz does not exist"),
    "unknown_metric": (
        ["--metrics", "fd"],
        r"--metrics .*fd.* is not one of the choices — choose one of 'fid'",
    ),
    "inception_score_of_pixels": (
        ["--metrics", "fid", "is"],
        r"--metrics is: the Inception Score needs Inception features .* — pass --features inception",
    ),
    "kid_against_statistics": (
        ["--reference", "{user}/stats/pixels.npz", "--metrics", "fid", "kid"],
        r"--metrics kid: .*pixels.npz holds FID statistics .* KID needs the reference images' features — pass",
    ),
    "statistics_of_other_features": (
        ["--reference", "{user}/stats/of_inception.npz"],
        r"of_inception.npz holds statistics of inception features, not pixels — use features inception",
    ),
    "statistics_of_another_dimension": (
        ["--reference", "{user}/stats/three_d.npz"],
        r"three_d.npz holds 3-d statistics but pixels features of these images are 64-d — use the statistics",
    ),
    "statistics_without_sigma": (
        ["--reference", "{user}/stats/only_mu.npz"],
        r"only_mu.npz has no sigma .* so it is no FID statistics file — write one with python -m diffusion.evaluate",
    ),
    "num_reference_of_statistics": (
        ["--reference", "{user}/stats/pixels.npz", "--num_reference", "10"],
        r"--num_reference picks reference images, and .*pixels.npz holds statistics, not images — leave",
    ),
    "save_stats_exists": (
        ["--save_stats", "{user}/stats/pixels.npz"],
        r"--save_stats .*pixels.npz exists — pass --overwrite to replace it",
    ),
    "save_stats_not_npz": (
        ["--save_stats", "{user}/stats/new.txt"],
        r"does not end in .npz — pass a name like",
    ),
    "save_stats_in_no_folder": (
        ["--save_stats", "{user}/nope/new.npz"],
        r"no folder .*nope — create it first",
    ),
    "save_stats_of_statistics": (
        ["--reference", "{user}/stats/pixels.npz", "--save_stats", "{user}/stats/new.npz"],
        r"holds FID statistics already, and --save_stats writes those of images — pass a dataset name",
    ),
    "no_reference": (
        ["--reference", "null"],
        r"FID and KID compare the samples with a --reference, and none is given — pass --reference",
    ),
    "nothing_to_evaluate": (["--samples", "null"], r"nothing to evaluate — pass --samples samples.npz"),
    # All 4 images were taken for 100, without a word (and --save_stats saved them as if of 100).
    "num_reference_beyond_the_reference": (
        ["--num_reference", "100"],
        r"--num_reference 100: the reference .*samples.npz holds only 4 images — pass --num_reference 4 or fewer",
    ),
}


if importlib.util.find_spec("torch_fidelity") is not None:  # an optional extra: pip install -e '.[fid]'
    EVALUATE_CASES["inception_weights_not_torch"] = (  # was an UnpicklingError traceback
        ["--features", "inception", "--inception_weights", "{user}/a_file"],
        r"--inception_weights .*a_file is not a readable PyTorch weights file .* — pass torch-fidelity's",
    )
    EVALUATE_CASES["inception_weights_a_zip"] = (
        ["--features", "inception", "--inception_weights", "{user}/samples/samples.npz"],
        r"samples.npz is not a readable PyTorch weights file",
    )


@pytest.mark.parametrize(("flags", "expected"), EVALUATE_CASES.values(), ids=EVALUATE_CASES.keys())
def test_evaluate_reports_a_bad_input_in_one_line(flags, expected, user, capsys):
    samples = str(user / "samples" / "samples.npz")
    args = ["--samples", samples, "--reference", samples, "--features", "pixels", *fill(flags, user)]
    assert re.search(expected, run_in_process(evaluate.main, args, user, capsys))


@pytest.mark.parametrize("case", ["missing_samples", "missing_reference", "folder_without_data_root"])
def test_print_config_refuses_what_evaluate_refuses(case, user, capsys):
    """Printed once the inputs are read and checked: no config of a command that would stop (it printed, exit 0)."""
    flags, expected = EVALUATE_CASES[case]
    samples = str(user / "samples" / "samples.npz")
    args = ["--samples", samples, "--reference", samples, "--features", "pixels", *fill(flags, user)]
    assert re.search(expected, run_in_process(evaluate.main, [*args, "--print_config"], user, capsys))


def test_evaluate_refuses_no_metric_of_a_config_file_by_its_key(user, capsys):
    """`--metrics "[]"` is refused by the parser; `metrics: []` in a --config file passed it, computed nothing and
    ended with exit status 0."""
    samples = str(user / "samples" / "samples.npz")
    args = ["--samples", samples, "--reference", samples, "--features", "pixels",
            *in_a_config_file(["--metrics", "[]"], user)]  # fmt: skip
    line = run_in_process(evaluate.main, args, user, capsys)
    assert re.fullmatch(
        r"error: \S*run.yaml: metrics \[\] names no metric — name some of fid kid is, or leave --metrics out .*",
        line,
    ), line


def test_a_list_where_one_label_goes_is_said_in_plain_words(user, capsys):
    """A list where one value of `int | str` goes: the kinds said with their article ('not a int or str' was)."""
    args = ["--ckpt", str(user / "model.ckpt"), "--out", str(user / "out"),
            *in_a_config_file(["--class_label", "[1, 2]"], user)]  # fmt: skip
    line = run_in_process(sample.main, args, user, capsys)
    assert re.fullmatch(
        r"error: \S*run.yaml: class_label \[1, 2\] is a list, not an int or str — write one value .*", line
    ), line


def test_evaluate_tiny_samples_against_a_dataset_name_their_size(tmp_path, capsys):
    np.savez(tmp_path / "tiny.npz", np.zeros((4, 2, 2, 1), np.uint8))
    args = ["--samples", str(tmp_path / "tiny.npz"), "--reference", "digits", "--features", "pixels"]
    line = run_in_process(evaluate.main, args, tmp_path, capsys)
    assert re.search(r"the samples are 2x2, smaller than the 8x8 .* — compare them with an .npz of 2x2", line)


def test_evaluate_offline_download_says_where_to_put_the_files(tmp_path, capsys, monkeypatch):
    def offline(self):  # what torchvision's MNIST raises once every mirror failed
        raise RuntimeError(
            "Error downloading train-images-idx3-ubyte.gz:\nTried https://x/, got:\n<urlopen error>\n"
        )

    monkeypatch.setattr(datasets.MNIST, "download", offline)
    args = ["--samples", str(tmp_path / "s.npz"), "--reference", "mnist", "--data_root", str(tmp_path / "data"),
            "--features", "pixels"]  # fmt: skip
    np.savez(tmp_path / "s.npz", np.zeros((4, 28, 28, 1), np.uint8))
    line = run_in_process(evaluate.main, args, tmp_path, capsys)
    assert re.search(r"could not download mnist into .* — check the network .* into .*data/MNIST/raw", line)


def test_existing_samples_are_replaced_only_with_overwrite(user, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(user / "samples", out)
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    path = sample.main(["--ckpt", str(good), "--out", str(out), "--sampler", "ddim", "--steps", "2",
                        "--num_samples", "3", "--device", "cpu", "--overwrite"])  # fmt: skip
    assert np.load(path)["arr_0"].shape == (3, 8, 8, 1)  # the user's 4 blank images replaced


@pytest.mark.parametrize("flag", ["--samples", "--reference"])
def test_save_stats_onto_its_own_input_is_refused_and_the_input_kept(flag, tmp_path, capsys):
    # Round 13's Y1: with --overwrite, the user's samples were replaced by the reference's statistics
    images = tmp_path / "s.npz"
    np.savez(images, np.full((8, 8, 8, 1), 7, np.uint8))
    before = images.read_bytes()
    given = [
        flag,
        str(images),
        *(["--reference", "digits", "--metrics", "fid"] if flag == "--samples" else []),
    ]
    argv = [*given, "--features", "pixels", "--save_stats", str(images), "--overwrite"]
    assert run_in_process(evaluate.main, argv, tmp_path, capsys) == (
        f"error: --save_stats {images} is the {flag} file itself, which it would replace — pass another file name "
        "for the statistics, e.g. --save_stats reference_stats.npz"
    )
    assert images.read_bytes() == before
