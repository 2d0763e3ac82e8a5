"""Class-conditional models with classifier-free guidance: labels from the data to the network, label dropout,
the guidance formula in one batched forward, per-class samples and files, and unconditional models unchanged."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest
import torch
from helpers import QUICK, TINY_UNET
from nbclient import NotebookClient
from PIL import Image
from sklearn.datasets import load_digits
from test_errors import error_line
from torchvision import datasets

from diffusion.batch import check_batch
from diffusion.callbacks import FIDCallback
from diffusion.checkpoints import load_checkpoint
from diffusion.cli import DiffusionCLI, main
from diffusion.data import Batch, ImageDataModule
from diffusion.generation import generate
from diffusion.labels import class_labels
from diffusion.models import MLP, NO_LABEL, UNet
from diffusion.module import DiffusionModule
from diffusion.render import rows_by_class
from diffusion.sample import main as sample_main
from diffusion.sampling import SamplingOptions, guided_output
from diffusion.schedule import NoiseSchedule
from diffusion.vectors import VectorDataModule

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
CONDITIONAL = ["--config", str(REPO / "configs" / "digits_conditional.yaml")]
SAMPLE = ["--num_samples", "4", "--batch_size", "4", "--seed", "7", "--sampler", "ddim", "--steps", "3",
          "--device", "cpu"]  # fmt: skip


@pytest.fixture(scope="module")
def conditional_checkpoint(tmp_path_factory) -> Path:
    """last.ckpt of a tiny run of configs/digits_conditional.yaml (its grid: 4 samples, classes 0..3)."""
    save_dir = tmp_path_factory.mktemp("runs")
    main([*CONDITIONAL, *TINY_UNET, *QUICK, "--trainer.logger.init_args.save_dir", str(save_dir)])
    return save_dir / "digits_conditional" / "version_0" / "checkpoints" / "last.ckpt"


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
    batch = next(iter(cli.datamodule.train_dataloader()))
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
    batch = next(iter(cli.datamodule.train_dataloader()))
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
    module = DiffusionModule(randomized(network), sample_shape=(2,), num_timesteps=50)
    sizes = []
    network.register_forward_pre_hook(lambda m, inputs: sizes.append((len(inputs[0]), inputs[2].tolist())))
    options = SamplingOptions(sampler=sampler, steps=4, guidance_scale=2.0)
    module.sample(3, seed=0, options=options, labels=torch.tensor([2, 0, 1]))
    assert sizes == [(6, [2, 0, 1, -1, -1, -1])] * 4


@pytest.mark.parametrize(("scale", "batch"), [(1.0, 4), (3.0, 8)])
def test_fid_callback_samples_classes_in_turn_with_its_guidance_scale(scale, batch):
    network = MLP(in_channels=2, hidden_dim=16, num_blocks=1, num_classes=3)
    module = DiffusionModule(randomized(network), sample_shape=(2,), num_timesteps=50)
    calls = []
    network.register_forward_pre_hook(lambda m, inputs: calls.append((len(inputs[0]), inputs[2].tolist())))
    callback = FIDCallback(num_samples=4, features="pixels", batch_size=4,
                           sampling=SamplingOptions(sampler="ddim", steps=2, guidance_scale=scale))  # fmt: skip
    callback._update = lambda images, pl_module, real: None  # only the sampling is looked at here
    callback._feed_generated(SimpleNamespace(world_size=1), module)
    asked = [0, 1, 2, 0]  # sample i of class i % 3
    assert calls == [(batch, asked + [NO_LABEL] * 4 if scale != 1 else asked)] * 2


# ---- sampling: labels, files, grids ----------------------------------------------------------------------
def test_class_labels_are_a_function_of_the_sample_index():
    assert class_labels(12, 10).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert class_labels(12, 10, "all").tolist() == class_labels(12, 10).tolist()
    assert class_labels(3, 10, "7").tolist() == [7, 7, 7] and class_labels(2, 3, 1).tolist() == [1, 1]
    assert class_labels(2, 3, "dog", ["cat", "dog", "emu"]).tolist() == [1, 1]
    assert class_labels(5, None) is None
    for bad in ("10", "-1", "cow"):
        with pytest.raises(ValueError, match="not a class of this model"):
            class_labels(2, 10, bad)
    with pytest.raises(ValueError, match="unconditional"):
        class_labels(2, None, 3)


def test_rows_by_class_puts_each_class_on_its_own_row():
    images = torch.arange(5.0).view(5, 1, 1, 1) + 1
    arranged, per_row = rows_by_class(images, torch.tensor([1, 0, 1, 2, 1]))
    assert per_row == 3
    assert arranged.flatten().tolist() == [2, 0, 0, 1, 3, 5, 4, 0, 0]  # rows 0, 1, 2; blanks are 0


def test_sample_cli_writes_one_class_and_its_labels(conditional_checkpoint, tmp_path):
    path = sample_main(["--ckpt", str(conditional_checkpoint), "--out", str(tmp_path / "three"), *SAMPLE,
                        "--class_label", "3", "--guidance_scale", "2"])  # fmt: skip
    files = np.load(path)
    assert files["arr_0"].shape == (4, 16, 16, 1) and files["arr_0"].dtype == np.uint8
    assert files["arr_1"].tolist() == [3, 3, 3, 3] and files["arr_1"].dtype == np.int64
    # Sample i depends on (seed, i, its label): sample 3 of a run over all classes is sample 3 of this one.
    every = sample_main(["--ckpt", str(conditional_checkpoint), "--out", str(tmp_path / "all"),
                         *SAMPLE, "--num_samples", "12", "--class_label", "all",
                         "--guidance_scale", "2"])  # fmt: skip
    every = np.load(every)
    assert every["arr_1"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert np.abs(every["arr_0"][3].astype(int) - files["arr_0"][3].astype(int)).max() <= 1
    with Image.open(tmp_path / "all" / "grid.png") as grid:  # one row per class: 10 rows of 17 px + 1
        assert grid.height == 10 * 17 + 1


@pytest.mark.multiprocess
def test_two_processes_write_the_labels_and_samples_of_one(conditional_checkpoint, tmp_path):
    # 5 samples over 2 ranks in batches of 2: rank 1 draws samples 1, 3 and a padding sample 5, dropped.
    flags = ["--ckpt", str(conditional_checkpoint), *SAMPLE, "--num_samples", "5", "--batch_size", "2",
             "--guidance_scale", "2"]  # fmt: skip
    one = np.load(sample_main([*flags, "--out", str(tmp_path / "one")]))
    command = [sys.executable, "-m", "diffusion.sample", *[f for f in flags if f not in ("--device", "cpu")],
               "--devices", "2", "--accelerator", "cpu", "--out", str(tmp_path / "two")]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    two = np.load(tmp_path / "two" / "samples.npz")
    assert two["arr_1"].tolist() == one["arr_1"].tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(two["arr_0"], one["arr_0"])


def test_guidance_scale_changes_conditional_samples(conditional_checkpoint, tmp_path):
    runs = [np.load(sample_main(["--ckpt", str(conditional_checkpoint), "--out", str(tmp_path / str(scale)),
                                 *SAMPLE, "--class_label", "1", "--guidance_scale", str(scale)]))["arr_0"]
            for scale in (0.0, 1.0, 4.0)]  # fmt: skip
    assert not np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[1], runs[2])


def test_unconditional_checkpoints_write_no_arr_1(digits_checkpoint, tmp_path):
    # (Asking one for a class or for guidance is a user error: tests/test_errors.py SAMPLE_CASES.)
    path = sample_main(["--ckpt", str(digits_checkpoint), "--out", str(tmp_path), *SAMPLE])
    assert np.load(path).files == ["arr_0"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--class_label", "10"],
            r"class_label='10' is not a class of this model — use 0..9, 'all' or a name in",
        ),
        (["--class_label", "cow"], r"class_label='cow' is not a class of this model"),
        (["--guidance_scale", "-0.5"], r"--guidance_scale -0.5 is out of range — pass a value >= 0"),
    ],
    ids=["class_10", "unknown_name", "negative_guidance"],
)
def test_bad_class_or_guidance_is_one_line_before_sampling(
    conditional_checkpoint, tmp_path, capsys, flags, expected
):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        sample_main(["--ckpt", str(conditional_checkpoint), "--out", str(out), *SAMPLE, *flags])
    assert exit_info.value.code == 2
    assert re.search(expected, error_line(capsys.readouterr().err))
    assert not out.exists()  # stopped before anything was sampled or written


def test_a_checkpoint_alone_samples_a_named_class(conditional_checkpoint, tmp_path):
    alone = tmp_path / "alone.ckpt"  # no config.yaml or hparams.yaml beside it
    shutil.copy(conditional_checkpoint, alone)
    module = load_checkpoint(alone)
    assert module.num_classes == 10 and module.hparams.class_names[3] == "3"
    assert module.sampling.guidance_scale == 1.5  # the recipe's default, kept in the checkpoint
    labels = class_labels(4, module.num_classes, "3", module.hparams.class_names)
    samples = generate(module, 4, seed=0, options=SamplingOptions(steps=3), labels=labels)
    assert samples.shape == (4, 1, 16, 16) and torch.isfinite(samples).all()
    with pytest.raises(ValueError, match="0..9"):
        module.sample(2, seed=0, labels=torch.tensor([3, 10]))


def test_training_grid_has_one_row_per_class(conditional_checkpoint):
    grid = conditional_checkpoint.parents[1] / "samples" / "latest.png"
    with Image.open(grid) as image:  # QUICK draws 4 samples: classes 0..3, one each
        assert (image.width, image.height) == (1 * 17 + 1, 4 * 17 + 1)


# ---- unconditional models unchanged ----------------------------------------------------------------------
def test_unconditional_samples_ignore_guidance_and_old_checkpoints_load(digits_checkpoint, tmp_path):
    module = load_checkpoint(digits_checkpoint)
    reference = module.sample(3, seed=0, options=SamplingOptions(sampler="ddim", steps=3))
    guided = module.sample(3, seed=0, options=SamplingOptions(sampler="ddim", steps=3, guidance_scale=3.0))
    torch.testing.assert_close(guided, reference, rtol=0, atol=0)
    # A checkpoint written before labels existed has none of the new hyperparameters.
    checkpoint = torch.load(digits_checkpoint, weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    for key in ("label_dropout", "class_names"):
        del hparams[key]
    del hparams["network"]["init_args"]["num_classes"], hparams["sampling"]["guidance_scale"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    old = load_checkpoint(tmp_path / "old.ckpt")
    assert old.num_classes is None
    old_samples = old.sample(3, seed=0, options=SamplingOptions(sampler="ddim", steps=3))
    torch.testing.assert_close(old_samples, reference, rtol=0, atol=0)


# ---- the benchmark ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_guidance_benchmark_runs_on_its_own_and_reuses_a_finished_run(tmp_path):
    quality = [sys.executable, "benchmarks/quality.py", "--quick", "--only", "digits_conditional"]
    trained = subprocess.run([*quality, "--out", str(tmp_path / "trained")], cwd=REPO, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    table = (tmp_path / "trained" / "quality_conditional.md").read_text()
    assert (
        "| 1.5 (default) |" in table and "| real digits (other half) |" in table and "every class >=" in table
    )
    assert "| digits |" not in table  # the unconditional recipes are not part of this section
    assert (tmp_path / "trained" / "digits_conditional_grid.png").stat().st_size > 0
    runs = tmp_path / "trained" / "runs"
    reused = subprocess.run([*quality, "--reuse", str(runs), "--out", str(tmp_path / "reused")], cwd=REPO,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert reused.returncode == 0, reused.stdout[-3000:] + reused.stderr[-3000:]
    assert "training reused" in (tmp_path / "reused" / "quality_conditional.md").read_text()
    assert "training:" not in reused.stdout  # nothing trained


# ---- the notebook ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_notebook_shows_a_grid_per_class_and_the_guidance_scale(conditional_checkpoint, monkeypatch):
    monkeypatch.setenv("CKPT", str(conditional_checkpoint))
    monkeypatch.setenv("NUM_SAMPLES", "4")
    monkeypatch.setenv("STEPS", "3")
    notebook = nbformat.read(REPO / "notebooks" / "sample_from_checkpoint.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    text = "".join(output.get("text", "") for output in outputs)
    assert len(images) >= 4, "expected samples, trajectory, per-class grid and guidance-scale figures"
    assert "class-conditional: 10 classes" in text
