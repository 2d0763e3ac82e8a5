"""Classifier-free guidance asked of a class-conditional model trained with label_dropout 0, which never learnt the
unconditional prediction guidance takes: refused in one line naming guidance_scale, the model's label_dropout 0 and
the fix, as guidance of an unconditional model is (module.sampler, a module's own sampling, generate with a sampler
built by hand, the grid and quality callbacks of a user's own Trainer, train.py at start)."""

import re

import lightning as L
import pytest
import torch
from helpers import QUICK, TINY_UNET
from helpers.user_errors import CONFIGS, run_in_process
from torch.utils.data import DataLoader, TensorDataset

from diffusion import IndexedDataset
from diffusion.cli.train import main
from diffusion.core.sampling import SAMPLERS, SamplingOptions, final_sample
from diffusion.generation.ranks import generate
from diffusion.models import MLP, UNet
from diffusion.training import callbacks
from diffusion.training.module import DiffusionModule

LINE = (
    "guidance_scale {scale} asks for the unconditional prediction, which this model never learnt (it was trained "
    "with label_dropout 0) — sample with guidance_scale 1 (or unset), or train with label_dropout 0.1-0.2"
)


def conditional(**arguments) -> DiffusionModule:
    network = MLP(in_channels=2, hidden_dim=16, num_blocks=1, time_embed_dim=8, num_classes=3)
    return DiffusionModule(
        network, sample_shape=(2,), num_timesteps=50, class_names=["a", "b", "c"], **arguments
    )


@pytest.mark.parametrize("scale", [3.0, 0.0])
def test_guidance_of_a_model_that_never_dropped_labels_is_refused(scale):
    module = conditional()  # label_dropout 0, the default
    with pytest.raises(ValueError) as caught:
        module.sampler(SamplingOptions(steps=2, guidance_scale=scale))
    assert str(caught.value) == LINE.format(scale=f"{scale:g}")
    # plain conditional sampling needs no unconditional prediction
    sampler = module.sampler(SamplingOptions(steps=2, guidance_scale=1.0))
    assert generate(module, 2, sampler=sampler, labels=[0, 1]).shape == (2, 2)


@pytest.mark.parametrize("scale", [3.0, 0.0])
def test_a_guiding_sampler_built_by_hand_is_refused_by_generate(scale):
    with pytest.raises(ValueError) as caught:
        generate(conditional(), 2, sampler=SAMPLERS["ddim"](steps=2, guidance_scale=scale), labels=[0, 1])
    assert str(caught.value) == LINE.format(scale=f"{scale:g}")
    guided = generate(  # labels: guidance without them is refused (tests/generation/test_guidance_without_labels.py)
        conditional(label_dropout=0.1),
        2,
        sampler=SAMPLERS["ddim"](steps=2, guidance_scale=scale),
        labels=[0, 1],
    )
    assert guided.shape == (2, 2)


def test_a_module_whose_own_sampling_guides_is_refused_when_built():
    with pytest.raises(ValueError, match=r"^sampling.guidance_scale 3 asks for the unconditional prediction, which "
                       r"this model never learnt \(it was trained with label_dropout 0\) — sample with "
                       r"sampling.guidance_scale 1 \(or unset\), or train with label_dropout 0.1-0.2$"):  # fmt: skip
        conditional(sampling=SamplingOptions(guidance_scale=3.0))


@pytest.mark.parametrize("callback", ["SampleGrid", "SampleQualityCallback"])
def test_a_callback_that_guides_is_refused_when_a_users_own_trainer_starts(tmp_path, callback):
    """Found at the callback's setup, before a step trained: the first grid, after the steps to the first validation,
    was where module.sampler refused it."""
    network = UNet(
        in_channels=1, channels=8, channel_mult=(1,), num_res_blocks=1, attention_levels=(), num_classes=3
    )
    module = DiffusionModule(network, sample_shape=(1, 8, 8), num_timesteps=50)  # label_dropout 0
    options = {"features": "pixels"} if callback == "SampleQualityCallback" else {}
    guiding = getattr(callbacks, callback)(
        num_samples=4, sampling=SamplingOptions(steps=2, guidance_scale=3.0), **options
    )
    trainer = L.Trainer(
        max_steps=2, callbacks=[guiding], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path,
    )  # fmt: skip
    data = IndexedDataset(TensorDataset(torch.randn(8, 1, 8, 8), torch.arange(8) % 3), with_labels=True)
    with pytest.raises(
        ValueError, match=r"^sampling.guidance_scale 3 asks for the unconditional prediction, which "
    ):
        trainer.fit(module, DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
    assert trainer.global_step == 0


def test_samples_without_a_label_of_a_model_that_never_dropped_labels_are_refused():
    """Round 19b's Q1: labels -1 (NO_LABEL) ask for the very prediction guidance 0 asks for."""
    with pytest.raises(ValueError) as caught:
        generate(conditional(), 2, sampler=SAMPLERS["ddim"](steps=2), labels=torch.tensor([0, -1]))
    assert str(caught.value) == (
        "labels holds -1 (no label) for 1 of the 2 samples: the unconditional prediction, which this model never "
        "learnt (it was trained with label_dropout 0) — pass a class 0..2 for every sample (class_labels(n, "
        "module.num_classes): each in turn), or train with label_dropout 0.1-0.2"
    )
    assert generate(conditional(label_dropout=0.1), 2, labels=torch.tensor([0, -1])).shape == (2, 2)


@pytest.mark.parametrize("labels", [None, torch.tensor([0, -1])], ids=["unset", "one without a label"])
@pytest.mark.parametrize("call", ["sample", "trajectory"])
def test_module_sampling_without_a_label_of_a_model_that_never_dropped_labels_is_refused(call, labels):
    """Round 20b's S6: module.sample and module.trajectory (and generate without labels) sampled the unconditional
    prediction such a model never learnt; a model trained with label dropout samples unconditionally."""
    options = SamplingOptions(sampler="ddim", steps=2)
    draw = {
        "sample": lambda module: module.sample(2, options=options, labels=labels),
        "trajectory": lambda module: final_sample(
            module.trajectory(torch.randn(2, 2), options=options, labels=labels)
        ),
    }[call]
    with pytest.raises(
        ValueError, match=r"the unconditional prediction, which this model never learnt \(it was "
    ):
        draw(conditional())
    assert draw(conditional(label_dropout=0.1)).shape == (2, 2)
    with pytest.raises(
        ValueError, match=r"^labels is unset: every sample would take the unconditional prediction"
    ):
        generate(conditional(), 2, sampler=SAMPLERS["ddim"](steps=2))


def test_a_model_that_dropped_labels_or_does_not_say_guides():
    assert (
        conditional(label_dropout=0.1).sampler(SamplingOptions(steps=2, guidance_scale=3.0)).guidance_scale
        == 3
    )
    unknown = conditional()
    del unknown.hparams["label_dropout"]  # a model loaded from a diffusers folder or an export may lack it
    assert unknown.sampler(SamplingOptions(steps=2, guidance_scale=3.0)).guidance_scale == 3


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], r"^error: .*digits_conditional.yaml: model.sampling.guidance_scale 1.5 asks for the unconditional "
         r"prediction, which this model never learnt \(it was trained with --model.label_dropout 0\) — sample with "
         r"--model.sampling.guidance_scale 1 \(or unset\), or train with --model.label_dropout 0.1-0.2$"),
        (["--model.sampling.guidance_scale", "1", "--sample_grid.sampling.guidance_scale", "2"],
         r"^error: --sample_grid.sampling.guidance_scale 2 asks for the unconditional prediction, which this model "
         r"never learnt \(it was trained with --model.label_dropout 0\) — sample with "
         r"--sample_grid.sampling.guidance_scale 1 \(or unset\)"),
    ],
    ids=["model_sampling", "sample_grid"],
)  # fmt: skip
def test_train_refuses_guidance_without_label_dropout_at_start(flags, expected, tmp_path, capsys):
    args = ["--config", str(CONFIGS / "digits_conditional.yaml"), *TINY_UNET, *QUICK, "--model.label_dropout", "0",
            "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), *flags]  # fmt: skip
    line = run_in_process(main, args, tmp_path, capsys)  # exit 2, one line, nothing left behind
    assert re.match(expected, line), line


def test_sample_refuses_guidance_of_such_a_checkpoint_naming_its_flag(tmp_path, capsys):
    from diffusion.cli import sample

    main(["--config", str(CONFIGS / "digits_conditional.yaml"), *TINY_UNET, *QUICK, "--model.label_dropout", "0",
          "--model.sampling.guidance_scale", "1", "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")])  # fmt: skip
    checkpoint = next((tmp_path / "runs").rglob("last.ckpt"))
    line = run_in_process(sample.main, ["--ckpt", str(checkpoint), "--num_samples", "2", "--steps", "2",
                                        "--guidance_scale", "3", "--out", str(tmp_path / "s")], tmp_path, capsys)  # fmt: skip
    assert line == (
        "error: --guidance_scale 3 asks for the unconditional prediction, which this model never learnt (it was "
        "trained with --model.label_dropout 0) — sample with --guidance_scale 1 (or unset), or train with "
        "--model.label_dropout 0.1-0.2"
    )
