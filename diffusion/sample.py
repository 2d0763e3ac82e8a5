"""Checkpoint in, samples out: `python -m diffusion.sample --ckpt PATH --num_samples N --out DIR`.

Writes DIR/samples.npz (`arr_0`: uint8 N x H x W x C for images, the format guided-diffusion's and EDM's
evaluators read; float32 N x D in data units for vectors) and DIR/grid.png (a scatter plot for vectors).
Sample i depends only on (--seed, i), so any --batch_size gives the same samples (up to float rounding).
"""

import argparse
from pathlib import Path
from typing import get_args

import numpy as np
import torch
from tqdm import tqdm

from diffusion.data import denormalize, to_uint8_images
from diffusion.module import DiffusionModule, Weights, load_checkpoint
from diffusion.plotting import save_image_grid, save_scatter
from diffusion.sampling import Sampler


def generate(
    module: DiffusionModule,
    num_samples: int,
    batch_size: int = 256,
    seed: int = 0,
    progress: bool = True,
    **overrides,
) -> torch.Tensor:
    """`num_samples` samples in model units, drawn `batch_size` at a time with per-sample seeds."""
    batches = []
    starts = range(0, num_samples, batch_size)
    for start in tqdm(starts, desc="batches", disable=not progress or len(starts) == 1):
        indices = torch.arange(start, min(start + batch_size, num_samples))
        batches.append(
            module.sample(len(indices), seed=seed, indices=indices, progress=progress, **overrides).cpu()
        )
    return torch.cat(batches)


def save_samples(
    samples: torch.Tensor, normalization: dict, out_dir: str | Path, grid_size: int = 64
) -> Path:
    """Write samples.npz and grid.png (first `grid_size` samples) into out_dir; return the npz path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = denormalize(samples.float(), normalization)
    if samples.ndim == 4:
        array = to_uint8_images(samples.float(), normalization)  # (N, H, W, C) uint8
        save_image_grid(data[:grid_size].clamp(0, 1), out_dir / "grid.png")
    else:
        array = data.numpy().astype(np.float32)  # (N, D)
        save_scatter(array, out_dir / "grid.png")
    path = out_dir / "samples.npz"
    np.savez(path, array)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", required=True, help="a checkpoint of this project (e.g. .../last.ckpt)")
    parser.add_argument("--num_samples", type=int, default=64)
    parser.add_argument("--out", default="samples", help="output folder")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--weights", choices=get_args(Weights), default="ema", help="EMA weights or raw ones")
    parser.add_argument(
        "--sampler", choices=get_args(Sampler), default=None, help="default: the checkpoint's"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="reverse steps (default: all T for ddpm, 50 ddim)"
    )
    parser.add_argument("--eta", type=float, default=None, help="DDIM noise: 0 deterministic, 1 = DDPM")
    args = parser.parse_args(argv)
    if args.num_samples < 1 or args.batch_size < 1:
        parser.error(
            f"--num_samples and --batch_size must be >= 1, got {args.num_samples} and {args.batch_size}"
        )
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA GPU is visible here; use --device cpu")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    module = load_checkpoint(args.ckpt, weights=args.weights, map_location=args.device)
    overrides = {"sampler": args.sampler, "steps": args.steps, "eta": args.eta}
    samples = generate(module, args.num_samples, args.batch_size, args.seed, **overrides)
    path = save_samples(samples, module.normalization, args.out)
    print(f"wrote {args.num_samples} samples to {path} and {Path(args.out) / 'grid.png'}")
    return path


if __name__ == "__main__":
    main()
