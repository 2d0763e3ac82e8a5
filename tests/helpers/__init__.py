"""What tests (and the benchmarks' quick modes) share: tiny models and short runs through the real CLI."""

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset

from diffusion.cli.train import main
from diffusion.core.sampling import SamplingOptions
from diffusion.data import ImageDataModule, IndexedDataset
from diffusion.models import MLP
from diffusion.training.module import DiffusionModule

# A UNet of ~40k parameters and a few steps: seconds on a CPU, but the whole pipeline (config, data,
# Trainer, EMA, checkpointing, sample grid) runs as it does for users.
TINY_UNET = [
    "--model.network.init_args.channels", "8",
    "--model.network.init_args.channel_mult", "[1, 2]",
    "--model.network.init_args.num_res_blocks", "1",
    "--model.network.init_args.attention_levels", "[1]",
]  # fmt: skip
TINY_MLP = ["--model.network.init_args.hidden_dim", "32", "--model.network.init_args.num_blocks", "2"]
# Four steps and one validation, at the last (its checkpoint, grid and loss plot): a validation was 0.4 s of a 1.5-s
# tiny run. A test of what happens between validations adds VALIDATING_EVERY_2 (a later flag wins).
QUICK = [
    "--max_steps", "4",
    "--trainer.val_check_interval", "4",
    "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
    "--sample_grid.num_samples", "4",
    "--sample_grid.sampling.steps", "3",
    "--model.warmup_steps", "1",
]  # fmt: skip
VALIDATING_EVERY_2 = ["--trainer.val_check_interval", "2"]


def two_cpu_ranks_on_vectors(max_steps: int, val_check_interval: int) -> list[str]:
    """train.py's flags for a DDP run of 2 gloo ranks on 60 4-d Gaussian vectors with a tiny MLP: seconds a step
    pair, the whole launcher and process group as users have them."""
    repo = Path(__file__).resolve().parents[2]
    return [
        "--config", str(repo / "configs" / "toy2d.yaml"), *TINY_MLP, "--seed_everything", "0",
        "--data.init_args.dataset", "gaussian", "--data.init_args.dim", "4", "--data.init_args.num_samples", "60",
        "--data.init_args.val_fraction", "0.2", "--data.init_args.batch_size", "8",
        "--max_steps", str(max_steps), "--model.warmup_steps", "1",
        "--trainer.val_check_interval", str(val_check_interval),
        "--sample_grid.num_samples", "4", "--sample_grid.sampling.steps", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--devices", "2", "--strategy", "ddp", "--accelerator", "cpu",
    ]  # fmt: skip


def tiny_run(save_dir: Path, *extra: str):
    """Train a tiny digits model into save_dir/<name>/version_N and return the CLI object."""
    return main([*TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", str(save_dir), *extra])


def counting_backend(graphs: list, options: list | None = None) -> object:
    """A torch.compile backend that records each graph Dynamo hands it in `graphs` (and in `options` the
    Inductor options it was compiled with), then runs it as Dynamo traced it. Its tests count graphs, recompiles
    and what reaches the compile call; AOTAutograd's trace of the training step (what Inductor compiles) is
    test_fast_path's, with aot_eager against the eager step (about 5 s of a tiny UNet's 10-s compile here)."""

    def backend(graph, example_inputs, **kwargs):
        graphs.append(graph)
        if options is not None:
            options.append(kwargs.get("options"))
        return graph.forward

    return backend


def tiny_vector_model(
    num_classes: int | None = None, steps: int = 3, label_dropout: float = 0.0
) -> DiffusionModule:
    """A 2-d vector model of 20 timesteps whose own sampler is DDIM-`steps`: seconds of nothing, for tests of
    what the public functions take (the same weights at each call: seed 0)."""
    torch.manual_seed(0)
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8, num_classes=num_classes)
    return DiffusionModule(
        network, sample_shape=(2,), num_timesteps=20, normalization={"shift": [0.0, 0.0], "scale": [1.0, 1.0]},
        sampling=SamplingOptions(sampler="ddim", steps=steps), label_dropout=label_dropout,
    )  # fmt: skip


def fit_with_own_trainer(max_steps: int, ckpt_path: str | None = None) -> L.Trainer:
    """`tiny_vector_model()` fitted on random vectors by a Trainer of a user's own (no logger, no checkpoint
    callback, no validation): the run of the tests of such a user's checkpoints."""
    trainer = L.Trainer(
        max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0,
    )  # fmt: skip
    data = DataLoader(IndexedDataset(TensorDataset(torch.randn(16, 2))), batch_size=4)
    trainer.fit(tiny_vector_model(), data, ckpt_path=ckpt_path)
    return trainer


def assert_refused_by_name(call, error, argument: str, folder: Path) -> None:
    """`call()` raises `error` whose message names `argument` in what is wrong (not only in the fix), gives a fix
    after its dash, and leaves nothing in `folder` (the working folder the call ran in)."""
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    assert argument in message.split("—")[0], message
    assert "—" in message, f"no fix: {message}"
    assert not list(folder.iterdir()), "refused, yet it wrote something"


class DigitsSayingNothing(LightningDataModule):
    """A user's own data module: the digits, with no sample_shape, normalization or class names to compare."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = ImageDataModule(batch_size=8, on_device=False)

    def setup(self, stage: str) -> None:
        self.inner.setup(stage)

    def train_dataloader(self):
        return self.inner.train_dataloader()
