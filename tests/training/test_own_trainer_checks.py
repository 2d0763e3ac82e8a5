"""What a user's own `Trainer` is held to as train.py is (tester round 17b): a network whose output channels do not
fit the samples and the variance is refused when the DiffusionModule is built (J3: it trained on a loss broadcast
against the samples, and only sampling failed, naming `output`); `trainer.fit(module, ..., ckpt_path=...)` refuses a
checkpoint of other training settings or of weights that do not fit, in one line naming the checkpoint (J8: another
prediction_type trained on without a word, another network ended in torch's size-mismatch report); and a validation
on data holding NaN or infinity is refused as data (J11: `[{'val/loss': nan}]` without a word)."""

import re

import lightning as L
import pytest
import torch
from helpers import tiny_vector_model
from torch.utils.data import DataLoader, TensorDataset

from diffusion import DiffusionModule, IndexedDataset
from diffusion.errors import WeightsDoNotFit
from diffusion.models import MLP, UNet

TINY = {"channels": 8, "channel_mult": (1,), "num_res_blocks": 1, "attention_levels": ()}


# ---- J3: the network's output channels against the samples' and the variance ----------------------------------
OUTPUTS = {
    "fixed, 2 for 1": (
        UNet(in_channels=1, out_channels=2, **TINY), (1, 8, 8), "fixed",
        r"^UNet outputs 2 channels \(out_channels=2\), and with variance 'fixed' it must output 1, the channels of "
        r"sample_shape=\(1, 8, 8\) — build the UNet with out_channels=1 \(or leave it out\), or pass variance "
        r"'learned_range' \(it learns the variance in the second half\)$",
    ),
    "fixed, 3 for 1": (
        UNet(in_channels=1, out_channels=3, **TINY), (1, 8, 8), "fixed",
        r"^UNet outputs 3 channels \(out_channels=3\), and with variance 'fixed' it must output 1, the channels of "
        r"sample_shape=\(1, 8, 8\) — build the UNet with out_channels=1 \(or leave it out\)$",
    ),
    "learned_range, 1 for 1": (
        UNet(in_channels=1, **TINY), (1, 8, 8), "learned_range",
        r"^UNet outputs 1 channel \(out_channels=1\), and with variance 'learned_range' it must output 2 x 1 = 2 "
        r"\(the prediction, then the variance's v\) — build the UNet with out_channels=2, or pass variance 'fixed'$",
    ),
    "mlp, 3 for 2": (
        MLP(in_channels=2, out_channels=3, hidden_dim=8, num_blocks=1, time_embed_dim=8), (2,), "fixed",
        r"^MLP outputs 3 features \(out_channels=3\), and with variance 'fixed' it must output 2, the features of "
        r"sample_shape=\(2,\) — build the MLP with out_channels=2 \(or leave it out\)$",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", OUTPUTS)
def test_a_network_of_other_output_channels_is_refused_when_built(case):
    network, shape, variance, line = OUTPUTS[case]
    with pytest.raises(ValueError, match=line):
        DiffusionModule(network, sample_shape=shape, variance=variance)


def test_networks_whose_outputs_fit_and_networks_that_do_not_say_are_taken():
    DiffusionModule(UNet(in_channels=1, **TINY), sample_shape=(1, 8, 8))
    DiffusionModule(
        UNet(in_channels=1, out_channels=2, **TINY), sample_shape=(1, 8, 8), variance="learned_range"
    )

    class Own(torch.nn.Module):  # a user's own network says nothing of its outputs: left alone
        def forward(self, x, t):
            return x

    DiffusionModule(Own(), sample_shape=(1, 8, 8))


# ---- J8: resuming through trainer.fit(..., ckpt_path=...) ---------------------------------------------------------
def _loader() -> DataLoader:
    return DataLoader(IndexedDataset(TensorDataset(torch.randn(16, 2))), batch_size=4)


def _fit(module: DiffusionModule, max_steps: int, ckpt_path=None) -> L.Trainer:
    trainer = L.Trainer(
        max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(module, _loader(), ckpt_path=ckpt_path)
    return trainer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    trainer = _fit(tiny_vector_model(), max_steps=2)
    path = str(tmp_path_factory.mktemp("own") / "step2.ckpt")
    trainer.save_checkpoint(path)
    return path


def vector_model(hidden_dim: int = 8, **options) -> DiffusionModule:
    network = MLP(in_channels=2, hidden_dim=hidden_dim, num_blocks=1, time_embed_dim=8)
    settings = {"num_timesteps": 20, "normalization": {"shift": [0.0, 0.0], "scale": [1.0, 1.0]}, **options}
    return DiffusionModule(network, sample_shape=(2,), **settings)


def test_a_resume_of_another_prediction_type_is_refused_naming_the_checkpoint_and_both(checkpoint):
    path = re.escape(checkpoint)
    expected = (
        rf"^ckpt_path {path} belongs to a run trained with other settings: prediction_type 'eps' there, 'v' here — "
        rf"resume it with a DiffusionModule of its own settings \(DiffusionModule.load_from_checkpoint\('{path}'\) "
        rf"builds one; .*\), or start a new run from its weights: DiffusionModule\(\.\.\., init_from='{path}'\), "
        r"fitted without ckpt_path$"
    )
    module = vector_model(prediction_type="v")
    with pytest.raises(ValueError, match=expected):
        _fit(module, max_steps=4, ckpt_path=checkpoint)


def test_a_resume_of_another_schedule_names_it_before_its_buffers(checkpoint):
    with pytest.raises(
        ValueError, match=r"other settings: num_timesteps 20 there, 30 here; and its weights do not fit"
    ):
        _fit(vector_model(num_timesteps=30), max_steps=4, ckpt_path=checkpoint)


def test_a_resume_of_another_network_is_refused_in_one_line_not_torchs_report(checkpoint):
    expected = (
        rf"^ckpt_path {re.escape(checkpoint)}: these weights do not fit DiffusionModule \(\d+ of another shape "
        r"\(e\.g\. network\..*\)\) — resume it with a DiffusionModule of the network it was trained with .*, or "
        "train this network as a new run, without ckpt_path"
    )
    with pytest.raises(WeightsDoNotFit, match=expected):
        _fit(vector_model(hidden_dim=16), max_steps=4, ckpt_path=checkpoint)


@pytest.mark.parametrize("stage", ["validate"])  # the stages DiffusionModule has a step of
def test_a_checkpoint_of_another_network_validated_is_one_line(checkpoint, stage):
    """Round 20b's S1: trainer.validate / test(..., ckpt_path=) gave torch's size-mismatch report; other training
    settings are no matter there (nothing is trained), the weights alone are checked."""
    trainer = L.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu"
    )
    run = getattr(trainer, stage)
    with pytest.raises(WeightsDoNotFit) as refused:
        run(vector_model(hidden_dim=16), _loader(), ckpt_path=checkpoint)
    assert re.match(
        rf"^ckpt_path {re.escape(checkpoint)}: these weights do not fit DiffusionModule \(\d+ of another shape .*\)\) — "
        rf"{stage} it with a DiffusionModule of the network it was trained with "
        rf"\(DiffusionModule.load_from_checkpoint\('{re.escape(checkpoint)}'\) builds it\), without ckpt_path$",
        str(refused.value),
    ), str(refused.value)
    assert run(
        vector_model(prediction_type="v"), _loader(), ckpt_path=checkpoint
    )  # settings of sampling: its own


def test_a_resume_with_the_same_settings_goes_on_and_sampling_may_change(checkpoint):
    trainer = _fit(vector_model(sampling={"sampler": "ddpm"}), max_steps=4, ckpt_path=checkpoint)
    assert trainer.global_step == 4


# ---- J11: validation's data ----------------------------------------------------------------------------------------
def test_a_resume_at_another_sample_size_is_refused_though_a_unets_weights_fit(tmp_path):
    """A UNet's weights fit samples of any size: a checkpoint of 8x8 samples went on at 16x16 without a word."""

    def fit(size: int, ckpt_path=None) -> L.Trainer:
        module = DiffusionModule(UNet(in_channels=1, **TINY), sample_shape=(1, size, size), num_timesteps=20)
        trainer = L.Trainer(
            max_steps=2 if ckpt_path is None else 4, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0,
        )  # fmt: skip
        data = DataLoader(IndexedDataset(TensorDataset(torch.randn(8, 1, size, size))), batch_size=4)
        trainer.fit(module, data, ckpt_path=ckpt_path)
        return trainer

    path = str(tmp_path / "small.ckpt")
    fit(8).save_checkpoint(path)
    with pytest.raises(
        ValueError, match=r"other settings: sample_shape \[1, 8, 8\] there, \[1, 16, 16\] here —"
    ):
        fit(16, ckpt_path=path)
    assert fit(8, ckpt_path=path).global_step == 4  # the same size goes on


def _validate(module: DiffusionModule, dataset) -> list:
    trainer = L.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu"
    )
    return trainer.validate(module, DataLoader(dataset, batch_size=4))


def test_a_validation_on_data_holding_nan_is_refused_as_data():
    x = torch.randn(16, 2)
    x[5, 0], x[9, 1] = float("nan"), float("inf")
    expected = (
        r"^the validation data holds NaN or infinity: 2 of the 16 samples validated are not finite \(first at "
        r"dataset position 5\), and the validation loss is NaN — clean the data: drop or repair those samples"
    )
    with pytest.raises(ValueError, match=expected):
        _validate(tiny_vector_model(), IndexedDataset(TensorDataset(x)))
    assert (
        _validate(tiny_vector_model(), IndexedDataset(TensorDataset(x.nan_to_num(0.0, 0.0))))[0]["val/loss"]
        >= 0
    )


def test_a_conditional_model_validated_on_unlabelled_data_is_refused_unless_it_learnt_without_labels():
    unlabelled = IndexedDataset(TensorDataset(torch.randn(16, 2)))
    expected = (
        r"^every label of the validation data is NO_LABEL \(-1\), and this model is class-conditional "
        r"\(num_classes=3\) and never learnt an unconditional prediction \(label_dropout 0\)"
    )
    with pytest.raises(ValueError, match=expected):
        _validate(tiny_vector_model(num_classes=3), unlabelled)
    dropped = tiny_vector_model(num_classes=3)
    dropped.hparams["label_dropout"] = 0.1  # it learnt the unconditional model too: its loss there is one
    assert _validate(dropped, unlabelled)
    labelled = IndexedDataset(TensorDataset(torch.randn(16, 2), torch.randint(0, 3, (16,))), with_labels=True)
    assert _validate(tiny_vector_model(num_classes=3), labelled)
