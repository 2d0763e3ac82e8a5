"""benchmarks/quality/sampler_sweep.py: every registered sampler swept, evaluations counted, the default chosen in 20-35."""

import pytest

from benchmarks.quality import sampler_sweep
from diffusion.core.sampling import SAMPLERS


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


def test_evaluations_are_counted_per_step(digits_checkpoint):
    from diffusion.training.loading import load_checkpoint

    module = load_checkpoint(digits_checkpoint)
    assert sampler_sweep.evaluations_of(module, "ddim", 7, None) == 7
    assert sampler_sweep.steps_for(module, "ddim", [10, 20], None) == {10: 10, 20: 20}


def test_a_sweep_stopped_early_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    measured = []
    real_distance = sampler_sweep.frechet_distance

    def stopping_after_one_row(*args):  # of the quick sweep's two (4 and 8 evaluations)
        if len(measured) == 2:  # the real data's floor, then a row
            raise KeyboardInterrupt
        measured.append(real_distance(*args))
        return measured[-1]

    monkeypatch.setattr(sampler_sweep, "frechet_distance", stopping_after_one_row)
    with pytest.raises(KeyboardInterrupt):
        sampler_sweep.main(["--quick", "--out", str(tmp_path), "--samplers", "ddim"])
    table = (tmp_path / "sampler_sweep.md").read_text()
    assert f"| ddim | {measured[1]:.2f} |" in table
    assert (tmp_path / "sampler_sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_a_conditional_model_is_counted_at_its_guidance():
    """The counting wrapper stands where the network was: the module still sees a conditional network (it
    refused the labels when the wrapper hid num_classes), and a guided step is one evaluation of a doubled batch."""
    import torch

    from diffusion.core.sampling import SamplingOptions
    from diffusion.models import MLP
    from diffusion.training.module import DiffusionModule

    network = MLP(in_channels=2, hidden_dim=16, num_blocks=1, num_classes=3)
    module = DiffusionModule(
        network, sample_shape=(2,), sampling=SamplingOptions(guidance_scale=1.5), label_dropout=0.1
    )
    labels = torch.tensor([0, 1, 2, 0])
    assert sampler_sweep.evaluations_of(module, "ddim", 7, labels) == 7
    assert module.network is network


def test_a_run_folder_names_the_outputs(tmp_path, monkeypatch):
    """The conditional recipe's sweep writes ..._digits_conditional.md beside the default recipe's, not over it."""
    run = tmp_path / "runs" / "digits_conditional" / "version_0"
    (run / "checkpoints").mkdir(parents=True)

    def measured(args, written):
        table = {"ddim": {10: 30.0, 20: 25.0}}
        written(table, 16.4, "test, 898 samples, guidance 1.5")
        return table, 16.4, "test, 898 samples, guidance 1.5"

    monkeypatch.setattr(sampler_sweep, "sweep", measured)
    # No checkpoint to check before the sweep either.
    monkeypatch.setattr(sampler_sweep, "model_hyperparameters", lambda ckpt: {})
    sampler_sweep.main(["--run", str(run), "--out", str(tmp_path / "out")])
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [
        "sampler_sweep_digits_conditional.md",
        "sampler_sweep_digits_conditional.png",
    ]
