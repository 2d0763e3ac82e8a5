"""The export CLI's user errors: one line, `error: <what is wrong> — <how to fix it>`, exit status 2, no traceback,
and the user's files unchanged, --out not created (the contract: tests/cli/test_train_errors.py)."""

import re
import sys

import pytest
from helpers.full_disk import full_open
from helpers.user_errors import fill, run_in_process

from diffusion.cli import export

TOY2D = "{user}/runs/toy2d/version_0/checkpoints/last.ckpt"

EXPORT_CASES = {
    "unknown_format": (["--format", "onnx"], r"--format onnx is not one of the choices — choose one of 'safetensors'"),
    "unknown_weights": (["--weights", "best"], r"--weights best is not one of the choices — choose one of 'ema'"),
    "unknown_flag": (["--steps", "5"], r"--steps is not an option of this command — see --help"),
    "truncated": (["--ckpt", "{user}/truncated.ckpt"], r"truncated.ckpt is truncated or not a PyTorch"),
    "empty": (["--ckpt", "{user}/empty.ckpt"], r"empty.ckpt is empty"),
    "a_folder": (["--ckpt", "{user}/runs/toy2d"], r"toy2d is a folder holding 2 checkpoints \(version_0/checkpoints/last.ckpt, .*\) — pass the one"),
    "missing": (["--ckpt", "{user}/nope.ckpt"], r"no checkpoint at .*nope.ckpt"),
    "bare_weights": (["--ckpt", "{user}/weights.pt"], r"weights.pt is not a checkpoint written by train.py"),
    "out_is_a_file": (["--out", "{user}/a_file"], r"--out .*a_file is a file, not a folder"),
    "out_under_a_file": (["--out", "{user}/a_file/export"], r"a_file is a file, not a folder"),
    "out_not_empty": (["--out", "{user}/samples"], r"--out .*samples is not empty, and holds no export \(samples.npz\) — pass a new --out"),
    # Round 10's S6: `--out x.ckpt` made a folder that looked like a checkpoint (sample --ckpt took it as an export)
    "out_names_a_file": (["--out", "{user}/e10.safetensors"], r"^error: --out \S*e10.safetensors names a file, and an export is a folder .* — pass a folder: --out \S*/e10$"),
    # Round 13's Y2: said "not empty — pass --overwrite", which mixed an export into the run's folders
    "out_a_checkpoints_folder": (["--out", "{user}/runs/digits/version_0/checkpoints", "--overwrite"], r"^error: --out \S*checkpoints holds a run's checkpoints, and an export is a folder of its own — pass a new folder, e.g. --out \S*checkpoints_export$"),
    "out_a_run_folder": (["--out", "{user}/runs/digits/version_0", "--overwrite"], r"^error: --out \S*version_0 holds a run \(its checkpoints folder\), and an export is a folder of its own"),
    "out_empty": (["--out", ""], r'^error: --out "" is an empty path — pass a path'),  # was the working folder
    "ckpt_empty": (["--ckpt", ""], r'^error: --ckpt "" is an empty path — pass a path'),
    "a_vector_model_to_diffusers": (
        ["--ckpt", TOY2D, "--format", "diffusers"],
        r"a MLP network has no diffusers UNet2DModel counterpart .* — export with --format safetensors",
    ),
}  # fmt: skip


def export_args(flags: list[str], user) -> list[str]:
    good = user / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    return ["--ckpt", str(good), "--format", "safetensors", "--out", str(user / "new"), *fill(flags, user)]


@pytest.mark.parametrize(("flags", "expected"), EXPORT_CASES.values(), ids=EXPORT_CASES.keys())
def test_export_reports_a_bad_input_in_one_line(flags, expected, user, capsys):
    assert re.search(expected, run_in_process(export.main, export_args(flags, user), user, capsys))


@pytest.mark.parametrize("case", ["missing", "out_not_empty", "a_vector_model_to_diffusers"])
def test_print_config_refuses_what_export_refuses(case, user, capsys):
    """Printed once export's own checks pass: no config of an export that would stop (it printed, exit 0)."""
    flags, expected = EXPORT_CASES[case]
    assert re.search(
        expected, run_in_process(export.main, ["--print_config", *export_args(flags, user)], user, capsys)
    )


@pytest.mark.parametrize("missing", ["--ckpt", "--format", "--out"])
def test_export_names_a_missing_required_flag(missing, user, capsys):
    args = export_args([], user)
    del args[args.index(missing) : args.index(missing) + 2]
    line = run_in_process(export.main, args, user, capsys)
    assert f"{missing} is required" in line


def test_diffusers_missing_says_to_install_it(user, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # `import diffusers` raises ImportError
    line = run_in_process(export.main, export_args(["--format", "diffusers"], user), user, capsys)
    assert re.search(
        r"--format diffusers needs the diffusers package, which is not installed — pip install diffusers",
        line,
    )


def test_a_full_disk_while_exporting_is_one_line_naming_the_folder_and_leaves_nothing(
    user, capsys, monkeypatch
):
    from diffusion.training import exported

    monkeypatch.setattr(exported, "open", full_open(1000), raising=False)  # the weights' file fills the disk
    line = run_in_process(export.main, export_args([], user), user, capsys)
    assert re.fullmatch(
        r"error: no space left on the disk of .*new while saving the export — free space there, or pass another "
        r"--out",
        line,
    ), line
    assert not (user / "new").exists() and not list(user.glob(".new.*"))  # nothing left (run_in_process too)


def test_weights_null_in_a_config_file_is_refused_as_the_flag_is(user, capsys):
    """`weights: null` (a blank line of --print_config's) exported the EMA weights labelled "raw": refused in one
    line naming the file's key, as `--weights null` is."""
    (user / "export.yaml").write_text("weights: null\n")
    args = [*export_args([], user), "--config", str(user / "export.yaml")]
    line = run_in_process(export.main, args, user, capsys)
    assert re.search(r"export.yaml: weights null: this option takes .*, not null — remove the line", line), (
        line
    )
    (user / "export.yaml").unlink()


@pytest.mark.parametrize(
    ("asked", "has_ema", "recorded"),
    [
        ("ema", True, "ema"),
        (None, True, "ema"),
        ("raw", True, "raw"),
        ("ema", False, "raw"),
        (None, False, "raw"),
    ],
)
def test_the_export_records_the_weights_load_checkpoint_loaded(asked, has_ema, recorded):
    """None loads the EMA weights (load_checkpoint's default): recorded as "ema", never as "raw"."""
    checkpoint = {"state_dict": {}, **({"current_model_state": {}} if has_ema else {})}
    assert export.weights_written(asked, checkpoint) == recorded


def test_a_full_disk_while_exporting_for_diffusers_is_one_line_naming_the_folder(user, capsys, monkeypatch):
    """The pipeline's weights are written by Python (safetensors' own writer said a full disk as a SafetensorError,
    a bug's traceback; the real full disk: tests/training/test_full_disk.py)."""
    pytest.importorskip("diffusers")  # an optional extra
    from diffusion.cli import to_diffusers

    monkeypatch.setattr(to_diffusers, "open", full_open(1000), raising=False)  # the weights fill the disk
    line = run_in_process(export.main, export_args(["--format", "diffusers"], user), user, capsys)
    assert re.fullmatch(
        r"error: no space left on the disk of .*new while saving the export — free space there, or pass another "
        r"--out",
        line,
    ), line
    assert not (user / "new").exists() and not list(user.glob(".new.*"))


def write_export_calls(folder):
    from helpers import tiny_vector_model

    from diffusion.cli.to_diffusers import save_pipeline
    from diffusion.training.exported import write_export

    model, network = tiny_vector_model(steps=3), {"class_path": "diffusion.models.MLP", "init_args": {}}
    (folder / "a_file").write_text("not a folder")
    return {
        "weights-unknown": (lambda: write_export(model, network, folder, "foo"), ValueError, "weights='foo'"),
        "network-without-init-args": (lambda: write_export(model, {}, folder, "ema"), ValueError, "network={}"),
        "network-not-a-dict": (lambda: write_export(model, "UNet", folder, "ema"), TypeError, "network='UNet'"),
        "module-none": (lambda: write_export(None, network, folder, "ema"), TypeError, "module=None"),
        "folder-missing": (lambda: write_export(model, network, folder / "nope", "ema"), FileNotFoundError, "folder="),
        "folder-a-file": (lambda: write_export(model, network, folder / "a_file", "ema"), ValueError, "is a file"),
        "pipeline-module-str": (lambda: save_pipeline("m", folder), TypeError, "module='m'"),
        "pipeline-folder-a-file": (lambda: save_pipeline(model, folder / "a_file"), ValueError, "is a file"),
        "pipeline-folder-int": (lambda: save_pipeline(model, 3), TypeError, "folder=3"),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "weights-unknown", "network-without-init-args", "network-not-a-dict", "module-none", "folder-missing",
        "folder-a-file", "pipeline-module-str", "pipeline-folder-a-file", "pipeline-folder-int",
    ],
)  # fmt: skip
def test_the_export_writers_refuse_a_bad_argument_naming_it(case, tmp_path):
    """They raised KeyError('init_args'), AttributeError ('NoneType' has no attribute 'network') and diffusers'
    AssertionError (a file for the folder), after part of the work; now one line naming the argument, before it."""
    from diffusion.errors import UserError

    call, kind, named = write_export_calls(tmp_path)[case]
    with pytest.raises(kind) as raised:
        call()
    assert isinstance(raised.value, UserError) and named in str(raised.value), raised.value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written


@pytest.mark.parametrize(
    ("export_format", "what"),
    [("safetensors", r"an export \(python -m diffusion.export\)"), ("diffusers", "a diffusers folder")],
)
def test_an_export_as_ckpt_is_said_an_export_not_a_folder_without_checkpoints(
    export_format, what, user, capsys, tmp_path
):
    """An export (which sample's --ckpt takes) given as export's --ckpt: said as what it is, with the checkpoint to
    pass instead; it was "a folder, and it holds no checkpoint (*.ckpt)", as if it were empty."""
    exported = tmp_path / f"as_{export_format}"  # not in `user`, which the module's tests share
    export.main([*export_args([], user)[:2], "--format", export_format, "--out", str(exported)])
    capsys.readouterr()
    for given in [exported, *([exported / "config.json"] if export_format == "safetensors" else [])]:
        args = ["--ckpt", str(given), "--format", "safetensors", "--out", str(user / "new")]
        line = run_in_process(export.main, args, user, capsys)
        assert re.search(
            rf"^error: --ckpt {re.escape(str(given))} is {what}, which holds one set of weights and no training "
            r"state — export converts training checkpoints: pass the checkpoint it was exported from ",
            line,
        ), line


@pytest.mark.parametrize("given", ["post_hoc_ema/step=4-0.050.pt", "post_hoc_ema"])
def test_a_post_hoc_ema_snapshot_as_ckpt_says_to_reconstruct_first(given, user, tmp_path, capsys):
    """Round 10's S7: a snapshot was "not a checkpoint written by train.py", its folder "holds no checkpoint"."""
    (tmp_path / "post_hoc_ema").mkdir()
    (tmp_path / "post_hoc_ema" / "step=4-0.050.pt").write_bytes(b"snapshot")
    line = run_in_process(export.main, export_args(["--ckpt", str(tmp_path / given)], user), user, capsys)
    assert re.search(r"is a post-hoc EMA snapshot(s folder)?, which holds one profile's averages, not a model — "
                     r"reconstruct a model from the snapshots first \(python -m diffusion.phema", line), line  # fmt: skip
