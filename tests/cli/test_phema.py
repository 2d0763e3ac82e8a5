"""`python -m diffusion.phema`: the checkpoint it writes (reconstructed EMA weights, raw weights as trained) is
taken by the sample command and `load_checkpoint` as any checkpoint, also class-conditional; `--sweep` prints
its table; every bad input ends in one line with exit status 2 and the user's files unchanged, train.py's
too (a snapshot budget that cannot hold one snapshot of each profile)."""

import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import QUICK, TINY_UNET, tiny_run
from helpers.full_disk import full_open
from helpers.user_errors import REPO, fill, in_a_config_file, run_in_process, train_args

from diffusion.cli import phema, sample
from diffusion.cli.train import main as train
from diffusion.training import atomic_writes
from diffusion.training.loading import load_checkpoint
from diffusion.training.post_hoc_ema import find_snapshots, read_weights

POST_HOC = ["--ema.post_hoc", "true", "--ema.snapshot_every", "2"]  # tiny runs: 4 steps, snapshots at 2 and 4


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    save_dir = tmp_path_factory.mktemp("runs")
    tiny_run(save_dir, *POST_HOC)
    return save_dir / "digits" / "version_0"


def network(state: dict) -> dict:
    return {k: v for k, v in state.items() if k.startswith("network.")}


def assert_equal_states(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_the_checkpoint_holds_the_reconstructed_ema_weights_and_the_raw_ones_as_trained(
    run, tmp_path, capsys
):
    out = tmp_path / "phema.ckpt"
    assert phema.main(["--run", str(run), "--sigma_rel", "0.05", "--out", str(out)]) == out
    assert "the EMA of sigma_rel 0.05 at step 4, from 4 snapshots" in capsys.readouterr().out
    written, last = load(out), load(run / "checkpoints" / "last.ckpt")
    own = next(s for s in find_snapshots(run / "post_hoc_ema") if (s.step, s.sigma_rel) == (4, 0.05))
    # A tracked sigma_rel is its own snapshot (up to float32 rounding of the float64 sum).
    for key, value in read_weights(own).items():
        torch.testing.assert_close(written["state_dict"][key], value, atol=1e-7, rtol=0)
    assert_equal_states(written["current_model_state"], last["current_model_state"])
    buffers = {k: v for k, v in last["state_dict"].items() if not k.startswith("network.")}
    assert buffers and all(torch.equal(written["state_dict"][k], v) for k, v in buffers.items())
    assert written["post_hoc_ema"]["sigma_rel"] == 0.05 and written["post_hoc_ema"]["step"] == 4
    assert written["hyper_parameters"] == last["hyper_parameters"] and written["global_step"] == 4

    other = tmp_path / "other.ckpt"
    phema.main(["--run", str(run), "--sigma_rel", "0.08", "--out", str(other), "--step", "2"])
    module = load_checkpoint(other)  # any command loads it
    reconstructed = network(load(other)["state_dict"])
    assert_equal_states(network(module.state_dict()), reconstructed)
    for snapshot in find_snapshots(run / "post_hoc_ema"):  # a new average, none of the snapshots
        assert (
            max((reconstructed[k] - v).abs().max().item() for k, v in read_weights(snapshot).items()) > 1e-6
        )
    samples = sample.main(
        ["--ckpt", str(other), "--num_samples", "4", "--steps", "2", "--out", str(tmp_path / "s")]
    )
    assert samples.is_file()


def test_a_class_conditional_run_reconstructs_and_samples_by_class(tmp_path):
    save_dir = tmp_path / "runs"
    config = [
        "--config",
        str(REPO / "configs" / "digits_conditional.yaml"),
    ]  # first: a config overrides flags
    train([*config, *TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", str(save_dir), *POST_HOC])
    run = save_dir / "digits_conditional" / "version_0"
    out = tmp_path / "phema.ckpt"
    phema.main(["--run", str(run), "--sigma_rel", "0.12", "--out", str(out)])
    assert any(".class_embed." in key for key in network(load(out)["state_dict"]))  # the class embedding too
    samples = sample.main([
        "--ckpt", str(out), "--num_samples", "4", "--steps", "2", "--class_label", "3", "--out", str(tmp_path / "s")
    ])  # fmt: skip
    assert samples.is_file()


def test_a_sweep_prints_the_runs_ema_and_every_sigma_rel_and_writes_the_best(run, tmp_path, capsys):
    best = tmp_path / "best.ckpt"
    flags = ["--sweep", "[0.05, 0.2]", "--num_samples", "8", "--sampler", "ddim", "--steps", "2"]
    phema.main(["--run", str(run), *flags, "--out", str(best)])
    output, notes = capsys.readouterr()
    # Round 18a's K2: 8 samples of 64-d pixel features named a "best" from noise without a word
    assert (
        "note: 8 images for 64-d features: their covariance is singular, so these distances are mostly the noise"
        in (notes)
    )
    table = [line for line in output.splitlines() if line.startswith("| ") and "---" not in line]
    assert table[0] == "| weights | sigma_rel | profile fit error | FD (8x8 pixels) |"
    assert re.fullmatch(r"\| the run's EMA \(decay 0\.999\) \| - \| - \| [\d.]+ \|", table[1]), table
    assert re.fullmatch(r"\| post-hoc EMA \| 0\.05 \| 0\.00% \| [\d.]+ \|", table[2]), table
    assert re.fullmatch(r"\| post-hoc EMA \| 0\.2 \| [\d.]+% \| [\d.]+ \|", table[3]), table
    scores = {row.split(" | ")[1]: float(row.split(" | ")[3].rstrip(" |")) for row in table[2:]}
    chosen = min(scores, key=scores.get)
    assert f"best: sigma_rel {chosen}" in output
    assert load(best)["post_hoc_ema"]["sigma_rel"] == float(chosen)


def test_sampling_and_sweep_flags_given_to_sigma_rel_are_said_unused(run, tmp_path, capsys):
    out = tmp_path / "p.ckpt"
    args = ["--run", str(run), "--sigma_rel", "0.1", "--out", str(out)]
    phema.main([*args, "--sampler", "ddim", "--steps", "5", "--num_samples", "5"])
    assert (
        "note: --sampler ddim, --steps 5, --num_samples 5 are not used: --sigma_rel writes a checkpoint with the "
        "run's own sampling settings, and these options sample and score a --sweep (to sample it with them: "
        f"python -m diffusion.sample --ckpt {out} ...)"
    ) in capsys.readouterr().err
    phema.main([*args, "--overwrite"])  # none given: no note
    assert "note:" not in capsys.readouterr().err


# ---- user errors -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def home(tmp_path_factory, run, digits_checkpoint) -> Path:
    """A user's folder: a run with snapshots, one without, and a checkpoint already written."""
    home = tmp_path_factory.mktemp("home")
    shutil.copytree(run, home / "runs" / "phema" / "version_0")
    shutil.copytree(digits_checkpoint.parents[1], home / "runs" / "digits" / "version_0")
    shutil.copyfile(run / "checkpoints" / "last.ckpt", home / "mine.ckpt")
    (home / "a_file").write_text("not a run")
    return home


RUN = ["--run", "{user}/runs/phema/version_0"]
PHEMA_CASES = {  # id: (flags, what the line must say)
    "neither": (
        RUN,
        r"^error: neither --sigma_rel nor --sweep is given — pass one of --sigma_rel and --sweep: --sigma_rel S "
        r"--out OUT.ckpt writes one checkpoint, --sweep",
    ),
    # Round 14's P8: "pass one of --sigma_rel and --sweep" said of both given (and of a file's keys, as flags)
    "both": (
        [*RUN, "--sigma_rel", "0.1", "--sweep", "[0.1]"],
        r"^error: --sigma_rel 0.1 and --sweep \[0.1\] are both given, and they are two modes: --sigma_rel writes "
        r"one checkpoint, --sweep scores several — drop one",
    ),
    "no_out": ([*RUN, "--sigma_rel", "0.1"], r"--sigma_rel needs --out — pass the checkpoint to write"),
    "sigma_rel_too_large": (
        [*RUN, "--sigma_rel", "0.5", "--out", "{user}/x.ckpt"],
        r"--sigma_rel=0.5 is out of range — pass a value in \(0, 0.2887\]",
    ),
    "sweep_sigma_rel_0": ([*RUN, "--sweep", "[0.1, 0]"], r"--sweep: sigma_rel=0.0 is out of range"),
    "sweep_empty": ([*RUN, "--sweep", "[]"], r"--sweep \[\] is empty"),
    "sweep_repeated": (
        [*RUN, "--sweep", "[0.1, 0.1]"],
        r"--sweep \[0.1, 0.1\] repeats a value — pass distinct ones",
    ),
    "out_exists": (
        [*RUN, "--sigma_rel", "0.1", "--out", "{user}/mine.ckpt"],
        r"--out .*mine.ckpt exists — pass --overwrite",
    ),
    "out_is_a_folder": ([*RUN, "--sigma_rel", "0.1", "--out", "{user}/runs"], r"--out .*runs is a folder"),
    # The line quoted the folder as if it were --out's value ("--out /proc: cannot write into /proc").
    "out_unwritable": (
        [*RUN, "--sigma_rel", "0.1", "--out", "/proc/x.ckpt"],
        r"^error: --out /proc/x.ckpt: cannot write into /proc \(.*\) — pick a folder you can write to",
    ),
    "out_in_a_new_folder_unwritable": (
        [*RUN, "--sigma_rel", "0.1", "--out", "/proc/sub/x.ckpt"],
        r"^error: --out /proc/sub/x.ckpt: cannot write into /proc \(",
    ),
    "out_under_a_file": (
        [*RUN, "--sigma_rel", "0.1", "--out", "{user}/a_file/x.ckpt"],
        r"^error: --out \S*/a_file/x.ckpt: \S*/a_file is a file, not a folder — pass a path through folders",
    ),
    # Round 9's Q6: written over the run's last.ckpt, a resume went on from the EMA weights as if raw
    "out_over_the_runs_resume_point": (
        [
            *RUN,
            "--sigma_rel",
            "0.1",
            "--out",
            "{user}/runs/phema/version_0/checkpoints/last.ckpt",
            "--overwrite",
        ],
        r"^error: --out \S*/checkpoints/last.ckpt is in a run's checkpoints folder, where train.py resumes from",
    ),
    "out_beside_the_runs_checkpoints": (
        [*RUN, "--sigma_rel", "0.1", "--out", "{user}/runs/phema/version_0/checkpoints/ema.ckpt"],
        r"^error: --out \S*/checkpoints/ema.ckpt is in a run's checkpoints folder, where .* — write it beside",
    ),
    "run_missing": (
        ["--run", "{user}/nope", "--sigma_rel", "0.1", "--out", "{user}/x.ckpt"],
        r"is not a folder",
    ),
    "run_is_a_file": (
        ["--run", "{user}/a_file", "--sigma_rel", "0.1", "--out", "{user}/x.ckpt"],
        r"not a folder",
    ),
    "run_without_snapshots": (
        ["--run", "{user}/runs/digits/version_0", "--sigma_rel", "0.1", "--out", "{user}/x.ckpt"],
        r"holds no post-hoc EMA snapshots .* — train with --ema.post_hoc true",
    ),
    # Round 14's P5: runs/<name> was said "holds no snapshots — train with --ema.post_hoc true"
    "run_a_folder_of_runs": (
        ["--run", "{user}/runs/phema", "--sigma_rel", "0.1", "--out", "{user}/x.ckpt"],
        r"^error: --run \S*runs/phema is a folder of runs, and its run version_0 holds the post-hoc EMA snapshots — "
        r"pass --run \S*runs/phema/version_0$",
    ),
    "run_a_folder_of_runs_without_snapshots": (
        ["--run", "{user}/runs/digits", "--sigma_rel", "0.1", "--out", "{user}/x.ckpt"],
        r"^error: --run \S*runs/digits is a folder of runs, and none of them \(version_0\) holds post-hoc EMA "
        r"snapshots — train with --ema.post_hoc true",
    ),
    "step_without_snapshots": (
        [*RUN, "--sigma_rel", "0.1", "--out", "{user}/x.ckpt", "--step", "3"],
        r"--step 3: no snapshot was written at that step — pick a step with snapshots \(the last ones: 2, 4\)",
    ),
    "ckpt_missing": (
        [*RUN, "--sigma_rel", "0.1", "--out", "{user}/x.ckpt", "--ckpt", "{user}/nope.ckpt"],
        r"no checkpoint at .*nope.ckpt",
    ),
    # Round 10's S2: another run's checkpoint of another step was written under this run's EMA, said "on last.ckpt"
    "ckpt_of_another_step": (
        [
            *RUN,
            "--sigma_rel",
            "0.1",
            "--out",
            "{user}/x.ckpt",
            "--step",
            "2",
            "--ckpt",
            "{user}/runs/phema/version_0/checkpoints/last.ckpt",
        ],
        r"^error: --ckpt \S*/checkpoints/last.ckpt is of step 4, and the EMA is reconstructed at step 2 from --run "
        r"\S*phema/version_0 — pass a checkpoint of step 2 of this run, or leave --ckpt out",
    ),  # fmt: skip
    # FD's covariance needs 2 samples: a bug's traceback once every row was sampled.
    "sweep_of_one_sample": (
        [*RUN, "--sweep", "[0.1, 0.05]", "--num_samples", "1"],
        r"^error: --num_samples 1: a --sweep scores each row by its FD, which needs at least 2 samples — pass "
        r"--num_samples 2 or more",
    ),
    # An empty path (an unset shell variable) meant the working folder.
    "run_empty": (
        ["--run", "", "--sigma_rel", "0.1", "--out", "{user}/x.ckpt"],
        r'^error: --run "" is an empty path — pass a path',
    ),
    "out_empty": (
        [*RUN, "--sigma_rel", "0.1", "--out", ""],
        r'^error: --out "" is an empty path — pass a path',
    ),
}


@pytest.mark.parametrize(("flags", "expected"), PHEMA_CASES.values(), ids=PHEMA_CASES.keys())
def test_phema_reports_a_bad_input_in_one_line(flags, expected, home, capsys):
    assert re.search(expected, run_in_process(phema.main, fill(flags, home), home, capsys))


IN_A_CONFIG_FILE = {  # id of a case of PHEMA_CASES, its flags written in a file: what the line must say
    "sigma_rel_too_large": r"^error: \S*run.yaml: sigma_rel 0.5 is out of range — pass a value in",
    "sweep_repeated": r"^error: \S*run.yaml: sweep \[0.1, 0.1\] repeats a value — pass distinct ones",
    "run_missing": r"^error: \S*run.yaml: run \S*nope is not a folder — pass a run folder",
    "run_without_snapshots": r"^error: \S*run.yaml: run \S*version_0 holds no post-hoc EMA snapshots .* — train with "
    r"--ema.post_hoc true",
    "step_without_snapshots": r"^error: \S*run.yaml: step 3: no snapshot was written at that step",
    "out_exists": r"^error: \S*run.yaml: out \S*mine.ckpt exists — pass --overwrite",
    "both": r"^error: \S*run.yaml: sigma_rel 0.1 and \S*run.yaml: sweep \[0.1\] are both given, and they are two "
    r"modes: --sigma_rel writes one checkpoint",  # the values said as the file's, the modes as flags
    "neither": r"^error: neither --sigma_rel nor --sweep is given — pass one of --sigma_rel and --sweep",
    "run_a_folder_of_runs": r"^error: \S*run.yaml: run \S*runs/phema is a folder of runs, and its run version_0",
    "sweep_of_one_sample": r"^error: \S*run.yaml: num_samples 1: a --sweep scores each row by its FD",
}


@pytest.mark.parametrize(("case", "expected"), IN_A_CONFIG_FILE.items(), ids=IN_A_CONFIG_FILE.keys())
def test_a_bad_value_in_a_config_file_is_said_as_the_files_key(case, expected, home, capsys):
    """phema's checks after the parse name what the user wrote: a value a --config file gave, by the file and
    its key (they named the flag: `--sigma_rel=0.5` for a file's `sigma_rel: 0.5`)."""
    config = in_a_config_file(fill(PHEMA_CASES[case][0], home), home)
    assert re.search(expected, run_in_process(phema.main, config, home, capsys))


@pytest.mark.parametrize("case", ["run_without_snapshots", "out_exists", "step_without_snapshots"])
def test_print_config_refuses_what_phema_refuses(case, home, capsys):
    """Printed once phema's own checks pass: no config of a command that would stop (it printed, exit 0)."""
    flags, expected = PHEMA_CASES[case]
    assert re.search(
        expected, run_in_process(phema.main, fill(["--print_config", *flags], home), home, capsys)
    )


def test_train_refuses_a_snapshot_budget_below_one_snapshot_of_each_profile(home, capsys):
    flags = ["--ema.post_hoc", "true", "--ema.max_snapshot_gb", "1e-5"]
    line = run_in_process(train, train_args(flags, home, home / "runs"), home, capsys)
    assert re.search(
        r"--ema.max_snapshot_gb 1e-5 cannot hold one post-hoc EMA snapshot of each of the 2 profiles "
        r"\(2 x [\d.]+ MB\) — pass --ema.max_snapshot_gb [\d.e-]+ \(a snapshot every 100 steps\)",
        line,
    )


def test_a_full_disk_at_the_written_checkpoint_names_it_and_the_fix(run, tmp_path, monkeypatch, capsys):
    out = tmp_path / "phema.ckpt"
    monkeypatch.setattr(atomic_writes, "open", full_open(1000), raising=False)
    with pytest.raises(SystemExit) as exited:
        phema.main(["--run", str(run), "--sigma_rel", "0.05", "--out", str(out)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: no space left on the disk of {tmp_path} while saving phema.ckpt — free space there, or pass "
        "another --out"
    )
    assert not out.exists() and not list(tmp_path.iterdir())


def test_the_best_of_a_sweep_is_said_beside_the_runs_ema_without_rounding_a_worse_one_to_zero():
    # Round 23a (noted): an FD 0.04% worse than the run's EMA was printed as "+0.0% against the run's EMA"
    assert phema.against_the_runs_ema(9.79, 10.0) == "-2.1% against the run's EMA"
    assert (
        phema.against_the_runs_ema(10.004, 10.0)
        == "+0.04% against the run's EMA: no sigma_rel of the sweep beats it"
    )
    assert phema.against_the_runs_ema(9.996, 10.0) == "-0.04% against the run's EMA"
    assert (
        phema.against_the_runs_ema(10.0, 10.0)
        == "+0.0% against the run's EMA: no sigma_rel of the sweep beats it"
    )
