"""benchmarks/sampler_sweep.py: every registered sampler swept, evaluations counted, the default chosen in 20-35."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import sampler_sweep  # noqa: E402

from diffusion.core.sampling import SAMPLERS  # noqa: E402


def test_the_quick_sweep_covers_every_sampler(tmp_path):
    text = sampler_sweep.main(["--quick", "--out", str(tmp_path)])
    for name in SAMPLERS:
        assert f"| {name} | " in text
    assert (tmp_path / "sampler_sweep.md").read_text() == text
    assert (tmp_path / "sampler_sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_the_default_is_the_best_fd_within_20_to_35_evaluations():
    table = {"a": {10: 5.0, 20: 30.0, 35: 25.0}, "b": {21: 28.0, 50: 1.0}, "c": {100: 0.5}}
    text = sampler_sweep.markdown(table, 16.3, "test")
    assert "Best FD at 20-35 evaluations: a 25.00 (35); b 28.00 (21)." in text  # 10 and 50 lie outside
    assert "should be **a**" in text


def test_evaluations_are_counted_per_step(tmp_path):
    from helpers import tiny_run

    from diffusion.training.loading import load_checkpoint

    tiny_run(tmp_path)
    module = load_checkpoint(tmp_path / "digits" / "version_0" / "checkpoints" / "last.ckpt")
    assert sampler_sweep.evaluations_of(module, "ddim", 7, None) == 7
    assert sampler_sweep.steps_for(module, "ddim", [10, 20], None) == {10: 10, 20: 20}
