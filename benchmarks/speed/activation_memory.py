"""Activation checkpointing in the UNet (`--model.network.init_args.checkpoint_levels`): the memory a training
step keeps for its backward, its peak and its time against no checkpointing, each configuration in a fresh process.

    python benchmarks/speed/activation_memory.py                  # the CIFAR-10 network at batch 16 on the CPU
    python benchmarks/speed/activation_memory.py --device cuda --batch 128

What the forward keeps for the backward is counted exactly, on any device and under any load: the bytes of the
storages the autograd graph saves (parameters left out). Peak memory: on CUDA `max_memory_allocated`; on the CPU
not reported (the resident peak counts what the allocator keeps). Step times mean something on a quiet machine only.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

NETWORKS = {  # the recipes' networks
    "cifar10": {"in_channels": 3, "channels": 128, "channel_mult": [1, 2, 2, 2], "dropout": 0.1, "size": 32},
    "digits": {"in_channels": 1, "channels": 32, "channel_mult": [1, 2, 2], "size": 16},
}


def measure(network_name: str, levels: list[int], batch: int, steps: int, device: str) -> dict:
    import torch

    from diffusion.models import UNet

    config = dict(NETWORKS[network_name])
    size = config.pop("size")
    torch.manual_seed(0)
    network = UNet(**config, checkpoint_levels=levels).to(device).train()
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-4)
    x = torch.randn(batch, config["in_channels"], size, size, device=device)
    t = torch.randint(0, 1000, (batch,), device=device)

    def step() -> None:
        (network(x, t) - x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the gradients' memory stays: it is not the activations'

    # What the forward keeps for the backward, counted exactly (load does not change it): the storages the
    # autograd graph saves, parameters left out. A checkpointed block saves its inputs only; what it would
    # save is made again inside the backward.
    parameters = {p.untyped_storage().data_ptr() for p in network.parameters()}
    saved: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        loss = (network(x, t) - x).square().mean()
    loss.backward()
    optimizer.zero_grad(set_to_none=False)
    saved_mib = sum(saved.values()) / 2**20

    step()  # Adam's state and the gradients exist from here on
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    # On CUDA the allocator's peak; on the CPU none (the process's resident peak counts what the allocator keeps,
    # not what the step needs): the saved bytes stand for it.
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else float("nan")
    return {"levels": levels, "saved_mib": saved_mib, "peak_mib": peak, "step_s": statistics.median(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--network", choices=sorted(NETWORKS), default="cifar10")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--levels", default="[];[0];[0,1];[0,1,2,3]", help="semicolon-separated lists")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: measure this list of levels
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.network, json.loads(args.one), args.batch, args.steps, args.device)))
        return
    rows = []
    for levels in args.levels.split(";"):
        command = [sys.executable, __file__, "--network", args.network, "--batch", str(args.batch),
                   "--steps", str(args.steps), "--device", args.device, "--one", levels]  # fmt: skip
        rows.append(json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout))
    base = rows[0]
    print(f"\n{args.network} UNet, batch {args.batch}, {args.device}, median of {args.steps} steps")
    print("| checkpoint_levels | saved for the backward | vs off | peak memory | vs off | step | vs off |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")  # fmt: skip
    for row in rows:
        peak = (
            "- | -"
            if row["peak_mib"] != row["peak_mib"]
            # NaN: not measured on the CPU
            else (f"{row['peak_mib']:.0f} MiB | {row['peak_mib'] / base['peak_mib']:.2f}x")
        )
        print(f"| {row['levels']} | {row['saved_mib']:.0f} MiB | {row['saved_mib'] / base['saved_mib']:.2f}x "
              f"| {peak} | {row['step_s']:.2f} s | {row['step_s'] / base['step_s']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
