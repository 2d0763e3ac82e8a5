"""docs/layout.md's "Where do I add" steps for a dataset and a network, followed as the doc writes them, then
trained: a reader who does what it says gets a run, not a traceback.

- a torchvision dataset: one entry in `TORCHVISION` (`data/images.py`; its name in `ImageDatasetName` is for
  the command line, test_image_data holds the two equal);
- any other data: a `SplitDataModule` subclass, named by class path (`--data my_module.Class`);
- a network: a module mapping `model(x_t, t[, labels])` to x_t's shape, taking the settings the data decides
  (`in_channels`, `num_classes`, `out_channels`), named by class path (`--model.network my_module.Class`).
"""

import re
import textwrap
from pathlib import Path

import numpy as np
import torch
from helpers import QUICK
from lightning.pytorch import Trainer
from PIL import Image

from diffusion.cli.train import main as train
from diffusion.data.images import TORCHVISION, ImageDataModule, Torchvision
from diffusion.models import UNet
from diffusion.training.module import DiffusionModule

REPO = Path(__file__).resolve().parents[1]
LAYOUT = (REPO / "docs" / "layout.md").read_text()


def test_the_doc_says_what_these_tests_follow():
    steps = LAYOUT.split("Where do I add", 1)[1].split("\n\n", 1)[0]
    for step in ["one entry in `TORCHVISION`", "`SplitDataModule`", "`--data my_module.MyData`",
                 "`in_channels`, `num_classes` and `out_channels`", "`--model.network my_module.MyNet`"]:  # fmt: skip
        assert step in steps, step


class StripeSet(torch.utils.data.Dataset):
    """A stand-in for a torchvision dataset class (called as torchvision calls MNIST; `data` uint8 (N, H, W) and
    `targets`; items are (PIL image, label)), made on the spot: tests download nothing."""

    def __init__(self, root: str, train: bool = True, download: bool = False, transform=None) -> None:
        rows = torch.arange(12).view(-1, 1, 1) % 3
        self.data = (torch.arange(12).view(1, 12, 1) % 3 == rows).to(torch.uint8).expand(-1, 12, 12) * 255
        self.targets = rows.flatten().tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        image = Image.fromarray(self.data[index].numpy(), mode="L")
        return self.transform(image), self.targets[index]


def test_a_torchvision_dataset_is_one_entry(monkeypatch, tmp_path):
    monkeypatch.setitem(
        TORCHVISION, "stripes", Torchvision(StripeSet, 1, 12, ("", "stripes.bin"), ["one", "two", "three"])
    )
    for on_device in (True, False):  # its arrays held on the device, and its items through a DataLoader
        data = ImageDataModule(
            "stripes", root=str(tmp_path), batch_size=4, conditional=True, on_device=on_device
        )
        assert (data.sample_shape, data.class_names) == ((1, 12, 12), ["one", "two", "three"])  # its own size
        network = UNet(in_channels=1, channels=8, channel_mult=(1, 2), num_res_blocks=1, num_classes=3)
        module = DiffusionModule(network, sample_shape=data.sample_shape, class_names=data.class_names)
        trainer = Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, limit_val_batches=1)  # fmt: skip
        trainer.fit(module, datamodule=data)
        assert trainer.global_step == 2
        assert all(torch.isfinite(p).all() for p in module.network.parameters())


MY_MODULE = '''
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from diffusion.data.split import IndexedDataset, SplitDataModule


    class MyData(SplitDataModule):
        """Two-dimensional points on a circle."""

        def __init__(self, batch_size: int = 16, num_workers: int = 0, val_fraction: float = 0.25, seed: int = 0):
            super().__init__(batch_size, num_workers, val_fraction, seed)

        @property
        def sample_shape(self) -> tuple[int, ...]:
            return (2,)

        @property
        def normalization(self) -> dict[str, list[float]]:
            return {"shift": [0.0, 0.0], "scale": [1.0, 1.0]}

        def setup(self, stage: str | None = None) -> None:
            if self.train_set is None:
                angles = torch.linspace(0, 6.28, 64)
                self._split(IndexedDataset(TensorDataset(torch.stack([angles.cos(), angles.sin()], 1))))


    class MyNet(nn.Module):
        def __init__(self, in_channels: int = 2, num_classes: int | None = None, out_channels: int | None = None,
                     width: int = 32):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(in_channels + 1, width), nn.SiLU(),
                                        nn.Linear(width, out_channels or in_channels))

        def forward(self, x, t, labels=None):
            return self.layers(torch.cat([x, t.float().unsqueeze(1) / 1000], 1))
'''


def test_other_data_and_a_network_are_named_by_class_path(monkeypatch, tmp_path, capsys):
    (tmp_path / "my_module.py").write_text(textwrap.dedent(MY_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    runs = tmp_path / "runs"
    train(["--data", "my_module.MyData", "--model.network", "my_module.MyNet", *QUICK,
           "--trainer.logger.init_args.save_dir", str(runs)])  # fmt: skip
    checkpoint = next(runs.rglob("last.ckpt"))
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    assert saved["global_step"] == 4 and saved["hyper_parameters"]["sample_shape"] == (2,)
    assert saved["hyper_parameters"]["network"]["class_path"] == "my_module.MyNet"
    assert not re.search(r"Traceback", capsys.readouterr().err)
    assert np.isfinite(torch.cat([v.flatten() for v in saved["state_dict"].values()]).numpy()).all()
