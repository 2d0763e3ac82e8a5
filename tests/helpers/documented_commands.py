"""What tests/test_documented_commands.py needs besides the commands: the users' own files the commands read (an
(N, D) array and its labels, folders of images, a diffusers pipeline folder), made small and offline; and the worker
that runs the multi-device commands on the ranks of one torchrun job:

    torchrun --nproc_per_node 2 -m helpers.documented_commands JOB.json

runs, on every rank, each command of JOB.json in turn (its own working folder, its own port: each opens and
closes its process group, as separate launches would) and writes what became of each into JOB.rank<R>.json.
"""

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np
import torch
from PIL import Image

NUM_VECTORS = 512  # the rows of the (N, D) arrays and of their labels
VECTOR_CLASSES = 3


def vectors(path: Path) -> None:
    """An (N, 2) float32 array: a noisy ring, the kind of data `--data.path` is for."""
    rng = np.random.default_rng(0)
    angle = rng.uniform(0, 2 * np.pi, NUM_VECTORS)
    ring = np.stack([np.cos(angle), np.sin(angle)], axis=1) + 0.02 * rng.standard_normal((NUM_VECTORS, 2))
    np.save(path, ring.astype(np.float32))


def vector_labels(path: Path) -> None:
    """N integer labels in 0..VECTOR_CLASSES - 1, one per row of `vectors`."""
    np.save(path, np.random.default_rng(1).integers(0, VECTOR_CLASSES, NUM_VECTORS))


def image_folder(path: Path, classes: tuple[str, ...] = (), per_class: int = 8) -> None:
    """RGB pngs of assorted sizes (the data module resizes and crops them); with `classes`, one subfolder each."""
    rng = np.random.default_rng(2)
    for folder in [path / name for name in classes] or [path]:
        folder.mkdir(parents=True)
        for i in range(per_class):
            size = (int(rng.integers(24, 48)), int(rng.integers(24, 48)))
            Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def class_folders(path: Path) -> None:
    image_folder(path, classes=("cat", "dog"))


def diffusers_pipeline(path: Path) -> None:
    """A diffusers DDPMPipeline folder (save_pretrained) laid out as google/ddpm-cifar10-32 (Ho et al.'s UNet,
    attention at the second level, 32x32 RGB), at small widths with random weights: nothing is downloaded."""
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=32, in_channels=3, out_channels=3, block_out_channels=(32, 64), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=None, norm_eps=1e-6, flip_sin_to_cos=False, freq_shift=1, downsample_padding=0,
    )  # fmt: skip
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=1000)).save_pretrained(path)


# ---- the ranks' side of the multi-device commands ----------------------------------------------------------
def run_one(command: dict) -> dict:
    """Run one command of the job on this rank, in its folder, with its port and environment; restore both."""
    from diffusion.cli.sample import main as sample
    from diffusion.cli.train import main as train

    mains = {"train.py": train, "diffusion.sample": sample}
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    # TORCHELASTIC_USE_AGENT_STORE off: each command's rank 0 serves its own store on its own port; the agent's
    # store would hand the next command the last one's rendezvous keys.
    own = {name: value.format(**os.environ) for name, value in command.get("env", {}).items()}  # "{RANK}"
    os.environ.update(MASTER_PORT=str(command["port"]), TORCHELASTIC_USE_AGENT_STORE="False", **own)
    os.chdir(command["folder"])
    print(f"==== {command['text']}", flush=True)
    try:
        mains[command["program"]](command["argv"])
        return {"text": command["text"], "code": 0}
    except SystemExit as exit_info:
        return {"text": command["text"], "code": exit_info.code or 0}
    except BaseException:
        return {"text": command["text"], "code": None, "error": traceback.format_exc()}
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def main(job: str) -> None:
    commands = json.loads(Path(job).read_text())
    results = []
    for command in commands:
        results.append(run_one(command))
        sys.stdout.flush()
        sys.stderr.flush()
    Path(f"{job}.rank{os.environ['RANK']}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
