"""Checkpoint in, samples out: `python -m diffusion.sample --ckpt PATH --num_samples N --out DIR`.

Writes DIR/samples.npz (`arr_0`: uint8 N x H x W x C for images, the format guided-diffusion's and EDM's
evaluators read; float32 N x D in data units for vectors) and DIR/grid.png (a scatter plot for vectors).
Sample i depends only on (--seed, i), so any --batch_size gives the same samples (up to float rounding).

`--devices D` (D > 1) samples on D processes per machine (DDP via Lightning Fabric: gloo on CPU, NCCL on
GPUs): with W processes in all, rank r draws samples r, r + W, r + 2W, ... (--batch_size at a time), and
rank 0 gathers them in index order and writes the files once, so the output equals a one-device run's.
Fabric re-runs this command line in D - 1 more processes, or joins the processes torchrun / srun started
(across machines: --num_nodes M, as for training).
"""

import argparse
from pathlib import Path
from typing import get_args

import torch
from lightning.fabric import Fabric

from diffusion.checkpoints import Weights, load_checkpoint
from diffusion.generation import class_labels, gather_in_order, generate
from diffusion.render import write_samples
from diffusion.sampling import Sampler, SamplingOptions


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", required=True, help="a checkpoint of this project (e.g. .../last.ckpt)")
    parser.add_argument("--num_samples", type=int, default=64)
    parser.add_argument("--out", default="samples", help="output folder")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="with --devices 1"
    )
    parser.add_argument("--devices", type=int, default=1, help="processes to sample on (one per GPU)")
    parser.add_argument("--num_nodes", type=int, default=1, help="machines, when launched by torchrun / srun")
    parser.add_argument(
        "--accelerator", choices=["auto", "cpu", "cuda", "gpu"], default="auto",
        help="cpu or cuda (gpu); default: the type of --device",
    )  # fmt: skip
    parser.add_argument("--weights", choices=get_args(Weights), default="ema", help="EMA weights or raw ones")
    parser.add_argument(
        "--sampler", choices=get_args(Sampler), default=None, help="default: the checkpoint's"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="reverse steps (default: all T for ddpm, 50 ddim)"
    )
    parser.add_argument("--eta", type=float, default=None, help="DDIM noise: 0 deterministic, 1 = DDPM")
    parser.add_argument(
        "--class_label",
        default=None,
        help="class-conditional checkpoints: a class (index or name), or 'all' (default): classes in turn; "
        "samples.npz gets the labels as arr_1",
    )
    parser.add_argument(
        "--guidance_scale",
        type=float,
        default=None,
        help="classifier-free guidance: 0 unconditional, 1 conditional, > 1 guided (default: the checkpoint's)",
    )
    args = parser.parse_args(argv)
    if min(args.num_samples, args.batch_size, args.devices, args.num_nodes) < 1:
        parser.error(
            "--num_samples, --batch_size, --devices and --num_nodes must be >= 1, got "
            f"{args.num_samples}, {args.batch_size}, {args.devices} and {args.num_nodes}"
        )
    if args.accelerator == "auto":
        args.accelerator = "cuda" if args.device.startswith("cuda") else "cpu"
    elif args.accelerator == "cpu" or not args.device.startswith("cuda"):
        # An explicit --accelerator decides where a one-device run goes too.
        args.device = "cpu" if args.accelerator == "cpu" else "cuda"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA GPU is visible here; use --device cpu")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    fabric, rank, world_size, device = None, 0, 1, args.device
    if args.devices > 1 or args.num_nodes > 1:
        fabric = Fabric(
            accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes, strategy="ddp"
        )
        if argv is not None and not fabric.strategy.cluster_environment.creates_processes_externally:
            # Fabric would start the other ranks by re-running sys.argv, which is not `argv` here.
            raise ValueError(
                f"--devices {args.devices} starts processes by re-running the command line: run "
                "`python -m diffusion.sample ...` (or under torchrun / srun) rather than main([...])"
            )
        fabric.launch()
        rank, world_size, device = fabric.global_rank, fabric.world_size, fabric.device
    module = load_checkpoint(args.ckpt, weights=args.weights, map_location=device)
    options = SamplingOptions(
        sampler=args.sampler, steps=args.steps, eta=args.eta, guidance_scale=args.guidance_scale
    )
    if args.guidance_scale is not None and module.num_classes is None:
        raise ValueError(
            "--guidance_scale: this checkpoint is unconditional (trained without --data.conditional)"
        )
    labels = class_labels(
        args.num_samples, module.num_classes, args.class_label, module.hparams.get("class_names")
    )
    samples = generate(
        module, args.num_samples, seed=args.seed, batch_size=args.batch_size, options=options, rank=rank,
        world_size=world_size, progress=rank == 0, labels=labels,
    )  # fmt: skip
    if fabric is not None:
        samples = gather_in_order(samples.to(fabric.device), args.num_samples, fabric.all_gather)
    path = Path(args.out) / "samples.npz"
    if rank == 0:
        write_samples(samples, module.normalization, args.out, labels=labels)
        print(f"wrote {args.num_samples} samples to {path} and {Path(args.out) / 'grid.png'}")
    if fabric is not None:
        fabric.barrier()  # every rank returns only once the files exist
    return path


if __name__ == "__main__":
    main()
