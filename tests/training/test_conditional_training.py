"""Class-conditional training: label dropout (rate, per-sample determinism) and the distributed
guarantees with labels: accumulation gives the whole batch's weights, resume is exact. DDP with labels (dropped per
sample) giving the whole batch's weights is test_learned_variance_training.py's DDP run, which trains with labels,
label dropout and learned variances at once: one launch for both."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY_MLP

from diffusion.cli.train import main
from diffusion.core.guidance import NO_LABEL
from diffusion.models import MLP
from diffusion.training.module import DiffusionModule

REPO = Path(__file__).resolve().parents[2]


# ---- training: label dropout -----------------------------------------------------------------------------
def conditional_module(label_dropout: float, noise_seed: int = 0) -> DiffusionModule:
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, num_classes=5)
    return DiffusionModule(network, sample_shape=(2,), label_dropout=label_dropout, noise_seed=noise_seed)


@pytest.mark.parametrize("per_sample", [False, True])
def test_label_dropout_rate(per_sample):
    module = conditional_module(0.1)
    module.on_fit_start()  # the rank's generator (fast mode)
    labels, indices = torch.full((20000,), 4), torch.arange(20000)
    dropped = module.drop_labels(labels, indices, step=3, per_sample=per_sample)
    assert set(dropped.unique().tolist()) == {NO_LABEL, 4}
    assert abs((dropped == NO_LABEL).float().mean().item() - 0.1) < 0.01  # 5 binomial standard deviations
    assert torch.equal(conditional_module(0.0).drop_labels(labels, indices, 3, per_sample), labels)
    with pytest.raises(ValueError, match="needs a class-conditional network"):
        DiffusionModule(MLP(in_channels=2), sample_shape=(2,), label_dropout=0.1)


def test_per_sample_label_dropout_depends_only_on_seed_step_and_index():
    module, labels, indices = conditional_module(0.5), torch.full((64,), 2), torch.arange(100, 164)
    whole = module.drop_labels(labels, indices, step=7, per_sample=True)
    halves = torch.cat([module.drop_labels(labels[:20], indices[:20], 7, True),
                        module.drop_labels(labels[20:], indices[20:], 7, True)])  # fmt: skip
    assert torch.equal(whole, halves)
    assert not torch.equal(whole, module.drop_labels(labels, indices, step=8, per_sample=True))
    assert not torch.equal(whole, conditional_module(0.5, noise_seed=1).drop_labels(labels, indices, 7, True))


def labelled_vectors(folder: Path, permute: bool = False) -> list[str]:
    """Flags for a 48-point labelled vector set (3 classes) written to `folder`."""
    generator = np.random.default_rng(0)
    labels = np.arange(48) % 3
    points = generator.normal(size=(48, 2)) + labels[:, None]
    np.save(folder / "x.npy", points)
    np.save(folder / "y.npy", generator.permutation(labels) if permute else labels)
    return ["--data.init_args.path", str(folder / "x.npy"), "--data.init_args.labels", str(folder / "y.npy")]


def labelled_run(save_dir: Path, *extra: str) -> list[str]:
    """Arguments of a 6-step toy2d run on labelled vectors, per-sample noise and label dropout 0.5."""
    return [
        "--config", str(REPO / "configs" / "toy2d.yaml"), *TINY_MLP, "--model.network.init_args.dropout", "0",
        "--precision", "32", "--seed_everything", "0", "--data.init_args.val_fraction", "0",
        "--max_steps", "6", "--model.warmup_steps", "1", "--model.noise_mode", "per_sample",
        "--model.label_dropout", "0.5", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--trainer.logger.init_args.save_dir", str(save_dir), *extra,
    ]  # fmt: skip


def raw_network_weights(save_dir: Path) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(save_dir / "toy2d" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    state = checkpoint.get("current_model_state", checkpoint["state_dict"])
    return {k: v for k, v in state.items() if k.startswith("network.")}


def assert_same_weights(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys() and "network.class_embed.weight" in a
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0)


@pytest.fixture(scope="module")
def whole_batch_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """One process, the whole global batch of 16 in one step: the reference of the equivalence tests."""
    folder = tmp_path_factory.mktemp("labelled")
    data = labelled_vectors(folder)
    main(labelled_run(folder / "whole", *data, "--devices", "1", "--accelerator", "cpu",
                      "--data.init_args.batch_size", "16"))  # fmt: skip
    return folder, data


def test_accumulation_with_labels_gives_the_weights_of_the_whole_batch(whole_batch_run, tmp_path):
    folder, data = whole_batch_run
    main(labelled_run(tmp_path, *data, "--devices", "1", "--accelerator", "cpu",
                      "--data.init_args.batch_size", "8", "--accumulate_grad_batches", "2"))  # fmt: skip
    assert_same_weights(raw_network_weights(tmp_path), raw_network_weights(folder / "whole"))
    # The labels matter: the same run on shuffled labels ends elsewhere.
    shuffled = labelled_vectors(tmp_path, permute=True)
    main(labelled_run(tmp_path / "shuffled", *shuffled, "--devices", "1", "--accelerator", "cpu",
                      "--data.init_args.batch_size", "16"))  # fmt: skip
    reference, other = raw_network_weights(folder / "whole"), raw_network_weights(tmp_path / "shuffled")
    assert any(not torch.allclose(reference[k], other[k], atol=1e-4) for k in reference)


@pytest.mark.parametrize("noise_mode", ["fast", "per_sample"])
def test_a_resumed_run_with_label_dropout_ends_with_the_weights_of_the_run_left_alone(
    whole_batch_run, tmp_path, noise_mode
):
    """Fast mode draws label dropout from the rank's generator, whose state the checkpoint keeps; per_sample
    from (seed, step, index). Resumed mid-epoch (3 batches an epoch) from the step-4 checkpoint of a 6-step run."""
    folder, data = whole_batch_run
    every_step = ["--checkpoint.every_n_train_steps", "1", "--checkpoint.save_top_k", "-1"]
    run = [*data, "--model.noise_mode", noise_mode, "--data.init_args.batch_size", "16", "--accelerator", "cpu",
           *every_step]  # fmt: skip
    main(labelled_run(tmp_path / "alone", *run))
    shutil.copy(
        tmp_path / "alone" / "toy2d" / "version_0" / "checkpoints" / "step=4.ckpt", tmp_path / "4.ckpt"
    )
    main(labelled_run(tmp_path / "resumed", *run, "--ckpt_path", str(tmp_path / "4.ckpt")))
    resumed, alone = raw_network_weights(tmp_path / "resumed"), raw_network_weights(tmp_path / "alone")
    assert_same_weights(resumed, alone, atol=1e-6)
    # The dropout draws matter: the same run without label dropout ends elsewhere.
    main(labelled_run(tmp_path / "no_dropout", *run, "--model.label_dropout", "0"))
    other = raw_network_weights(tmp_path / "no_dropout")
    assert any(not torch.allclose(alone[k], other[k], atol=1e-4) for k in alone)
