"""Class-conditional models with classifier-free guidance: labels from the data to the network, label dropout,
the guidance formula in one batched forward. Sampling a conditional checkpoint: tests/cli/test_conditional_sampling.py."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import TINY_UNET
from PIL import Image
from sklearn.datasets import load_digits
from torchvision import datasets

from diffusion.cli.train import DiffusionCLI
from diffusion.core.guidance import NO_LABEL, guided_output
from diffusion.core.sampling import SamplingOptions
from diffusion.core.schedule import NoiseSchedule
from diffusion.data.batch import Batch, check_batch
from diffusion.data.images import ImageDataModule
from diffusion.data.vectors import VectorDataModule
from diffusion.models import MLP, UNet
from diffusion.training.callbacks import SampleQualityCallback
from diffusion.training.module import DiffusionModule

REPO = Path(__file__).resolve().parents[2]
CONDITIONAL = ["--config", str(REPO / "configs" / "digits_conditional.yaml")]


def randomized(network: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """The network with every parameter random: zero-initialised output layers would hide the labels."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return network.eval()


# ---- labels from the data --------------------------------------------------------------------------------
def test_digit_labels_reach_the_network_through_the_cli_data_module():
    cli = DiffusionCLI([*CONDITIONAL, *TINY_UNET, "--trainer.logger", "false"])
    assert cli.datamodule.num_classes == cli.model.network.num_classes == 10
    assert cli.model.hparams.class_names == [str(i) for i in range(10)]
    cli.datamodule.setup("fit")
    batch = next(cli.datamodule.training_batches())
    torch.testing.assert_close(batch.label, torch.from_numpy(load_digits().target)[batch.index])
    seen = []
    cli.model.network.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[2].clone()))
    cli.model.hparams.label_dropout = 0.0  # every label as the data gave it
    cli.model.training_step(batch, 0)
    torch.testing.assert_close(seen[0], batch.label)


def test_labelled_data_trains_unconditionally_unless_asked():
    cli = DiffusionCLI(["--trainer.logger", "false"])  # the default recipe: digits, which has labels
    assert cli.datamodule.num_classes is None and cli.model.network.num_classes is None
    assert not hasattr(cli.model.network, "class_embed")
    cli.datamodule.setup("fit")
    batch = next(cli.datamodule.training_batches())
    assert (batch.label == NO_LABEL).all()
    seen = []
    cli.model.network.register_forward_pre_hook(lambda module, inputs: seen.append(len(inputs)))
    cli.model.training_step(batch, 0)
    assert seen == [2]  # model(x_t, t), as before


def test_torchvision_class_names_are_known_without_download(tmp_path):
    cifar = ImageDataModule("cifar10", root=str(tmp_path / "missing"), conditional=True)
    assert cifar.num_classes == 10 and cifar.class_names[3] == "cat"
    fashion = ImageDataModule("fashion_mnist", root=str(tmp_path / "missing"), conditional=True)
    assert fashion.class_names == list(datasets.FashionMNIST.classes)  # torchvision's, without its download


def test_folder_classes_are_the_subfolders(tmp_path):
    for name, colour in [("dog/a.png", "red"), ("cat/b.png", "blue"), ("cat/deep/c.png", "green")]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (12, 10), colour).save(tmp_path / name)
    dm = ImageDataModule("folder", root=str(tmp_path), image_size=8, conditional=True, val_fraction=0)
    assert dm.class_names == ["cat", "dog"] and dm.num_classes == 2
    dm.setup("fit")
    items = sorted(
        dm.train_set, key=lambda item: item.index
    )  # files in sorted order: cat/b, cat/deep/c, dog/a
    assert [item.label for item in items] == [0, 0, 1]
    assert items[2].x[0].min() == 1 and items[2].x[1:].max() == -1  # dog/a.png is the red one
    Image.new("RGB", (8, 8)).save(tmp_path / "loose.png")
    with pytest.raises(ValueError, match="directly in .*loose.png.*class folder"):
        ImageDataModule("folder", root=str(tmp_path), image_size=8, conditional=True)
    assert ImageDataModule("folder", root=str(tmp_path), image_size=8).num_classes is None


def test_vector_labels_file(tmp_path):
    points, labels = np.random.default_rng(0).normal(size=(10, 2)), np.arange(10) % 3
    np.save(tmp_path / "x.npy", points)
    np.save(tmp_path / "y.npy", labels)
    dm = VectorDataModule(path=str(tmp_path / "x.npy"), labels=str(tmp_path / "y.npy"), val_fraction=0)
    assert dm.num_classes == 3 and dm.class_names == ["0", "1", "2"]
    dm.setup("fit")
    assert all(item.label == labels[item.index] for item in dm.train_set)
    for bad, match in [(labels[:9], "9 labels for 10"), (labels * 0.5, "integers"), (labels - 1, "negative")]:
        np.save(tmp_path / "bad.npy", bad)
        with pytest.raises(ValueError, match=match):
            VectorDataModule(path=str(tmp_path / "x.npy"), labels=str(tmp_path / "bad.npy"))


def test_check_batch_needs_labels_in_range_for_a_conditional_model():
    x, index = torch.zeros(2, 2), torch.tensor([0, 1])
    assert check_batch(Batch(x, index, torch.tensor([5, 6])), None).label is None  # unconditional: ignored
    with pytest.raises(ValueError, match="needs Batch\\(x, index, label\\)"):
        check_batch(Batch(x, index), num_classes=3)
    with pytest.raises(ValueError, match="0..2"):
        check_batch(Batch(x, index, torch.tensor([0, 3])), num_classes=3)
    assert check_batch(Batch(x, index, torch.tensor([NO_LABEL, 2])), num_classes=3).label.tolist() == [-1, 2]


# ---- networks --------------------------------------------------------------------------------------------
DIGITS_UNET = {"channels": 32, "channel_mult": (1, 2, 2), "attention_levels": (1,)}


@pytest.mark.parametrize(
    "make", [lambda **k: UNet(**DIGITS_UNET, **k), lambda **k: MLP(**k)], ids=["unet", "mlp"]
)
def test_without_num_classes_the_network_is_the_unconditional_one(make):
    torch.manual_seed(0)
    plain = make()
    torch.manual_seed(0)
    conditional = make(num_classes=10)
    extra = set(conditional.state_dict()) - set(plain.state_dict())
    assert extra == {"class_embed.weight"} and conditional.class_embed.weight.shape[0] == 11  # + "no label"
    for key, value in plain.state_dict().items():  # same names, shapes and initial values
        torch.testing.assert_close(conditional.state_dict()[key], value, rtol=0, atol=0)
    with pytest.raises(ValueError, match="without num_classes"):
        x = torch.zeros(2, 1, 8, 8) if isinstance(plain, UNet) else torch.zeros(2, 2)
        plain(x, torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long))


def test_the_digits_recipe_network_keeps_its_parameter_count():
    assert sum(p.numel() for p in UNet(**DIGITS_UNET).parameters()) == 1_623_169  # before labels existed


def test_labels_change_the_output_and_none_means_no_label():
    net = randomized(UNet(channels=8, channel_mult=(1, 2), num_res_blocks=1, num_classes=3))
    x, t = torch.randn(2, 1, 8, 8), torch.tensor([10, 500])
    outputs = {y: net(x, t, torch.full((2,), y)) for y in (NO_LABEL, 0, 1, 2)}
    torch.testing.assert_close(net(x, t), outputs[NO_LABEL], rtol=0, atol=0)
    assert all(not torch.allclose(outputs[a], outputs[b]) for a in outputs for b in outputs if a != b)


# ---- classifier-free guidance ----------------------------------------------------------------------------
class CountingStub(torch.nn.Module):
    """Outputs the label (NO_LABEL as -1) everywhere, and records every call's batch size and labels."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, list[int] | None]] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        self.calls.append((len(x), None if y is None else y.tolist()))
        value = torch.full((len(x),), 7.0) if y is None else y.float()
        return x * 0 + value.view(-1, *[1] * (x.ndim - 1))


@pytest.mark.parametrize("scale", [0.0, 1.0, 2.5])
def test_guidance_formula_in_one_batched_forward(scale):
    stub, x, t, labels = (
        CountingStub(),
        torch.zeros(3, 2),
        torch.zeros(3, dtype=torch.long),
        torch.tensor([0, 1, 4]),
    )
    out = guided_output(stub, x, t, labels, scale)
    unconditional, conditional = torch.full((3, 2), -1.0), labels.float()[:, None].expand(3, 2)
    torch.testing.assert_close(out, unconditional + scale * (conditional - unconditional))
    assert len(stub.calls) == 1  # s = 0: the unconditional half only; s = 1: the conditional half only
    expected = {0.0: (3, [-1, -1, -1]), 1.0: (3, [0, 1, 4]), 2.5: (6, [0, 1, 4, -1, -1, -1])}[scale]
    assert stub.calls[0] == expected


def test_guidance_matches_separate_passes_of_a_real_network():
    net = randomized(MLP(in_channels=3, hidden_dim=16, num_blocks=1, num_classes=4))
    x, t, labels = torch.randn(5, 3), torch.tensor([0, 10, 100, 500, 999]), torch.tensor([0, 1, 2, 3, -1])
    conditional, unconditional = net(x, t, labels), net(x, t, torch.full_like(labels, NO_LABEL))
    torch.testing.assert_close(guided_output(net, x, t, labels, 0.0), unconditional)
    torch.testing.assert_close(guided_output(net, x, t, labels, 1.0), conditional)
    torch.testing.assert_close(
        guided_output(net, x, t, labels, 3.0), unconditional + 3 * (conditional - unconditional)
    )


@pytest.mark.parametrize("prediction_type", ["eps", "x0", "v"])
def test_guiding_the_prediction_is_guiding_eps(prediction_type):
    schedule, scale = NoiseSchedule(), 2.0
    generator = torch.Generator().manual_seed(0)
    x_t, conditional, unconditional = (torch.randn(4, 3, generator=generator) for _ in range(3))
    t = torch.tensor([1, 200, 600, 990])
    eps = {name: schedule.split_prediction(prediction_type, x_t, t, out)[1]
           for name, out in [("c", conditional), ("u", unconditional)]}  # fmt: skip
    guided = unconditional + scale * (conditional - unconditional)  # what guided_output does
    eps_guided = schedule.split_prediction(prediction_type, x_t, t, guided)[1]
    torch.testing.assert_close(eps_guided, eps["u"] + scale * (eps["c"] - eps["u"]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("sampler", ["ddpm", "ddim", "dpmpp_2m"])
def test_every_step_is_one_forward_of_the_doubled_batch(sampler):
    network = MLP(in_channels=2, hidden_dim=16, num_blocks=1, num_classes=3)
    module = DiffusionModule(randomized(network), sample_shape=(2,), num_timesteps=50, label_dropout=0.1)
    sizes = []
    network.register_forward_pre_hook(lambda m, inputs: sizes.append((len(inputs[0]), inputs[2].tolist())))
    options = SamplingOptions(sampler=sampler, steps=4, guidance_scale=2.0)
    module.sample(3, seed=0, options=options, labels=torch.tensor([2, 0, 1]))
    assert sizes == [(6, [2, 0, 1, -1, -1, -1])] * 4


@pytest.mark.parametrize(("scale", "batch"), [(1.0, 4), (3.0, 8)])
def test_fid_callback_samples_classes_in_turn_with_its_guidance_scale(scale, batch):
    network = MLP(in_channels=2, hidden_dim=16, num_blocks=1, num_classes=3)
    module = DiffusionModule(randomized(network), sample_shape=(2,), num_timesteps=50, label_dropout=0.1)
    calls = []
    network.register_forward_pre_hook(lambda m, inputs: calls.append((len(inputs[0]), inputs[2].tolist())))
    callback = SampleQualityCallback(num_samples=4, features="pixels", batch_size=4,
                           sampling=SamplingOptions(sampler="ddim", steps=2, guidance_scale=scale))  # fmt: skip
    callback._update = lambda images, pl_module, real: None  # only the sampling is looked at here
    callback._feed_generated(
        SimpleNamespace(world_size=1, is_global_zero=True, progress_bar_callback=None), module
    )
    asked = [0, 1, 2, 0]  # sample i of class i % 3
    assert calls == [(batch, asked + [NO_LABEL] * 4 if scale != 1 else asked)] * 2
