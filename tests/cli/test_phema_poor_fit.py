"""A poor fit is said once by `python -m diffusion.phema`: its own `warning:` line of the checkpoint it writes, not
`reconstruct`'s PoorFit warning (the Python caller's) a second time, in Python's words (tester 12b's X11)."""

import warnings

from helpers import tiny_run

from diffusion.cli import phema
from diffusion.training.post_hoc_ema import PoorFit


def test_a_poor_fit_is_warned_once_in_the_commands_words(tmp_path, capsys):
    tiny_run(tmp_path / "runs", "--ema.post_hoc", "true", "--ema.snapshot_every", "2")
    run = tmp_path / "runs" / "digits" / "version_0"
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        phema.main(
            ["--run", str(run), "--sigma_rel", "0.25", "--step", "2", "--out", str(tmp_path / "p.ckpt")]
        )
    assert not [warning for warning in caught if issubclass(warning.category, PoorFit)]
    lines = [line for line in capsys.readouterr().err.splitlines() if "poorly" in line]
    assert lines == [
        "warning: the snapshots fit the profile of sigma_rel 0.25 poorly (L2 error 104%): it lies outside the "
        "tracked ones, or there are few snapshots; the weights are an approximation of that EMA"
    ]
