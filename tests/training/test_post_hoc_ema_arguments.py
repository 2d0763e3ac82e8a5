"""The post-hoc EMA functions a Python caller uses (`find_snapshots`, `reconstruct`) check their arguments at entry:
a path that is not there or is a file is refused (a mistyped folder is no run without snapshots), a wrong kind of
argument is a WrongType naming it, a step without snapshots or an empty list an InvalidValue (a ValueError), and
the lines name the arguments, not the command's flags (`tests/cli/test_phema.py` keeps the command's lines)."""

import warnings

import numpy as np
import pytest
import torch

from diffusion.errors import InvalidValue, MissingFile, WrongType
from diffusion.training.ema_profiles import gamma_of
from diffusion.training.post_hoc_ema import (
    POOR_FIT,
    PoorFit,
    find_snapshots,
    reconstruct,
    snapshot_contents,
    snapshot_name,
)


@pytest.fixture
def folder(tmp_path):
    """A post-hoc EMA folder with snapshots of sigma_rel 0.05 and 0.1 at steps 2 and 4."""
    folder = tmp_path / "run" / "post_hoc_ema"
    folder.mkdir(parents=True)
    for step in (2, 4):
        for sigma_rel in (0.05, 0.1):
            weights = {"w": torch.full((2,), float(step))}
            contents = snapshot_contents(step, sigma_rel, gamma_of(sigma_rel), weights)
            torch.save(contents, folder / snapshot_name(step, sigma_rel))
    return folder


def test_a_missing_folder_or_a_file_is_refused_and_an_empty_one_gives_none(tmp_path):
    with pytest.raises(
        MissingFile, match=r"^folder='\S*nope' does not exist — pass a run's post-hoc EMA folder"
    ):
        find_snapshots(tmp_path / "nope")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(InvalidValue, match=r"^folder='\S*a_file' is a file, not a folder of post-hoc EMA"):
        find_snapshots(tmp_path / "a_file")
    with pytest.raises(WrongType, match=r"^folder=None is a NoneType, not a path — "):
        find_snapshots(None)
    (tmp_path / "empty").mkdir()
    assert find_snapshots(tmp_path / "empty") == []


def test_a_run_folder_is_refused_naming_its_post_hoc_ema_folder(folder):
    with pytest.raises(
        InvalidValue, match=r"is a run folder, not its post-hoc EMA folder — pass \S*post_hoc_ema$"
    ):
        find_snapshots(folder.parent)


def test_an_empty_list_says_the_folder_holds_none_without_blaming_the_training():
    with pytest.raises(InvalidValue) as raised:
        reconstruct([], 0.1)
    assert str(raised.value).startswith(
        "snapshots=[]: no post-hoc EMA snapshots to reconstruct from (the folder "
    )
    assert "--" not in str(raised.value)  # no flag said to a Python caller (`--ema.post_hoc`)


@pytest.mark.parametrize(
    ("sigma_rel", "error", "message"),
    [
        ("0.1", WrongType, r"^sigma_rel='0.1' is a str, not a number — "),
        (True, WrongType, r"^sigma_rel=True is a bool, not a number — "),
        (None, WrongType, r"^sigma_rel=None is a NoneType, not a number — "),
        (-0.1, InvalidValue, r"^sigma_rel=-0.1 is out of range — pass a value in \(0, 0.2887\]"),
        (float("nan"), InvalidValue, r"^sigma_rel=nan is out of range — "),
    ],
)
def test_a_bad_sigma_rel_is_refused_by_its_name(folder, sigma_rel, error, message):
    with pytest.raises(error, match=message):
        reconstruct(find_snapshots(folder), sigma_rel)


@pytest.mark.parametrize(
    ("snapshots", "message"),
    [
        (["x.pt"], r"^snapshots\[0\]='x.pt' is a str, not a Snapshot — pass the list find_snapshots"),
        ("run/post_hoc_ema", r"^snapshots='run/post_hoc_ema' is a str, not a list of Snapshot — "),
    ],
)
def test_snapshots_of_the_wrong_kind_are_refused_by_their_name(snapshots, message):
    with pytest.raises(WrongType, match=message):
        reconstruct(snapshots, 0.1)


@pytest.mark.parametrize(
    ("step", "error", "message"),
    [
        (3, InvalidValue, r"^step 3: no snapshot was written at that step — pick a step with snapshots \(the "
         r"last ones: 2, 4\), or leave step out for the newest$"),
        (2.5, ValueError, r"^step=2.5 must be a whole number >= 1 — "),  # not rounded to 2
        ("4", WrongType, r"^step='4' is a str, not a whole number >= 1 — "),
        (True, WrongType, r"^step=True is a bool, not a whole number >= 1 — "),
        (0, ValueError, r"^step=0 must be a whole number >= 1 — "),
    ],
)  # fmt: skip
def test_a_bad_step_is_refused_by_its_name(folder, step, error, message):
    with pytest.raises(error, match=message):
        reconstruct(find_snapshots(folder), 0.1, step=step)


def test_good_arguments_of_other_numeric_types_are_taken(folder):
    snapshots = find_snapshots(folder)
    by_numpy = reconstruct(tuple(snapshots), np.float64(0.07), step=np.int64(2))
    plain = reconstruct(snapshots, 0.07, step=2)
    assert by_numpy.step == 2 and type(by_numpy.step) is int
    torch.testing.assert_close(by_numpy.weights["w"], plain.weights["w"])
    torch.testing.assert_close(plain.weights["w"], torch.full((2,), 2.0))  # one step: its snapshots' weights


def test_a_poor_fit_is_warned_of_with_its_error_and_the_fix(folder):
    # Tester 12b's X11: one snapshot of sigma_rel 0.05 returned as sigma_rel 0.2 (184% error) without a word, where
    # the phema command warns.
    snapshots = find_snapshots(folder)
    with pytest.warns(PoorFit) as caught:
        poor = reconstruct(snapshots[:1], 0.2)
    assert poor.solution.relative_error > POOR_FIT and len(caught) == 1
    assert str(caught[0].message) == (
        "the snapshots fit the profile of sigma_rel 0.2 poorly (relative L2 error 184%, from 1 snapshot of sigma_rel "
        "0.05 up to step 2): the weights only approximate that EMA — pass more snapshots (all that "
        "find_snapshots(<run>/post_hoc_ema) returns), or a sigma_rel nearer the tracked ones"
    )
    assert caught[0].filename == __file__  # said at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoorFit)
        good = reconstruct(snapshots, 0.07)  # 4.8%: no warning
    assert good.solution.relative_error < POOR_FIT


def test_a_truncated_snapshot_is_said_once(folder):
    # Round 13's Z1: its refusal (an OSError too) was caught and said again inside its own words: path and fix twice
    damaged = folder / snapshot_name(2, 0.1)
    damaged.write_bytes(damaged.read_bytes()[:1000])
    with pytest.raises(OSError) as raised:
        reconstruct(find_snapshots(folder), 0.08)
    assert str(raised.value) == (
        f"post-hoc EMA snapshot {damaged} is truncated or not a PyTorch file — delete that file (the other "
        "snapshots still reconstruct), or restore it from a backup"
    )
