"""The benchmark scripts' own flags (benchmarks/arguments.py): a list written with spaces reads as the same list, and
a bad value or a missing run ends in argparse's one error line and exit status 2, before any time is spent: no
traceback, no argparse internals (`invalid <lambda> value`)."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.quality import ddim_eta, learned_variance, post_hoc_ema, sampler_sweep
from benchmarks.speed import speed

ROOT = Path(__file__).resolve().parents[2]

REFUSED = {  # id: (script, flags, what the error line says)
    "sweep_missing_run": (sampler_sweep, ["--run", "runs/nope"], r"--run runs/nope: no such file or folder — pass"),
    "sweep_run_without_checkpoint": (sampler_sweep, ["--run", "{tmp}"], r"--run .*: no checkpoint under .*digits"),
    "sweep_evaluation_not_a_number": (
        sampler_sweep, ["--run", "{tmp}", "--evaluations", "10,", "x"],
        r"--evaluations 10, x: x is not a valid int — pass a comma-separated list, e.g. --evaluations 10,20,35",
    ),
    "sweep_unknown_sampler": (
        sampler_sweep, ["--run", "{tmp}", "--samplers", "ddim,", "nope"], r"--samplers ddim, nope: nope is not one"
    ),
    "sweep_reference_without_count": (
        sampler_sweep, ["--run", "{tmp}", "--reference", "ddpm"], r"--reference ddpm: not SAMPLER:EVALUATIONS"
    ),
    "post_hoc_missing_run": (post_hoc_ema, ["--run", "runs/nope"], r"--run runs/nope: no such file or folder"),
    "post_hoc_run_without_checkpoint": (post_hoc_ema, ["--run", "{tmp}"], r"--run .*: no readable checkpoint in"),
    "post_hoc_sigma_rel": (
        post_hoc_ema, ["--run", "{tmp}", "--sigma_rels", "0.05,", "wide"], r"--sigma_rels 0.05, wide: wide is not"
    ),
    "learned_variance_missing_run": (learned_variance, ["--fixed", "runs/nope"], r"--fixed runs/nope: no such file"),
    "ddim_eta_missing_ckpt": (ddim_eta, ["--ckpt", "nope.ckpt"], r"--ckpt nope.ckpt: no such file or folder"),
    "speed_unknown_sampler": (speed, ["--samplers", "ddim:50,", "nope:20"], r"--samplers ddim:50, nope:20: nope is"),
    "speed_sampler_without_steps": (speed, ["--samplers", "ddim"], r"ddim is not a valid SAMPLER:STEPS"),
    "speed_missing_config": (speed, ["--config", "nope.yaml"], r"--config nope.yaml: no such file or folder"),
}  # fmt: skip


@pytest.mark.parametrize(("script", "flags", "expected"), REFUSED.values(), ids=REFUSED.keys())
def test_a_bad_flag_ends_in_one_error_line_and_exit_2(script, flags, expected, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main([flag.format(tmp=tmp_path) for flag in flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "<lambda>" not in err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and re.search(expected, errors[0]), err


@pytest.mark.parametrize(
    "written", [["ddim:50,dpmpp_2m:20"], ["ddim:50,", "dpmpp_2m:20"], ["ddim:50", "dpmpp_2m:20"]]
)
def test_a_list_reads_alike_with_commas_spaces_or_both(written):
    args, _ = speed.parse_args(["--samplers", *written, "--sampling_precisions", "32,", "bf16-mixed"])
    assert args.samplers == ["ddim:50", "dpmpp_2m:20"] and args.sampling_precisions == ["32", "bf16-mixed"]
    assert speed.parse_args(["--samplers", ""])[0].samplers == []  # none (benchmarks/gpu/gpu_suite.sh)


def test_the_command_a_results_file_prints_runs_as_typed():
    # speed.md names the command it came from; an empty list (--samplers "") or a label with spaces stays one argument.
    argv = ["--samplers", "", "--", "--trainer.callbacks.label", "train.py (cold)"]
    command = speed.parse_args(argv)[0].command
    assert shlex.split(command) == ["python", "benchmarks/speed/speed.py", *argv]


def provenance_in_a_repository(tmp_path: Path, changed_before_import: bool) -> str:
    """A benchmark's results line, in a fresh repository holding benchmarks/provenance.py, where the run writes
    into a tracked file (a picture, an earlier results file) before it asks for the line."""
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    for name in ("__init__.py", "provenance.py"):
        (repo / "benchmarks" / name).write_bytes((ROOT / "benchmarks" / name).read_bytes())
    (repo / "grid.png").write_text("before")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "start"]):
        subprocess.run([*git, *command], check=True)
    if changed_before_import:
        (repo / "grid.png").write_text("changed by hand")
    script = (
        "from benchmarks import provenance; open('grid.png', 'w').write('drawn by this run'); "
        "print(provenance.provenance())"
    )
    return subprocess.run(
        [sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def test_the_results_line_names_the_commit_as_the_run_found_it(tmp_path):
    # What the run itself writes before its results line does not mark its commit changed; a tree changed
    # before the run started does.
    assert "(uncommitted changes)" not in provenance_in_a_repository(
        tmp_path / "a", changed_before_import=False
    )
    assert "(uncommitted changes)" in provenance_in_a_repository(tmp_path / "b", changed_before_import=True)
