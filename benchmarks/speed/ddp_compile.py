"""A compiled network under DDP on several processes: how each of Dynamo's `optimize_ddp` choices cuts the graph,
what it costs a step, and that every choice takes eager DDP's steps.

    python benchmarks/speed/ddp_compile.py                              # 2 gloo processes on the CPU, aot_eager
    python benchmarks/speed/ddp_compile.py --device cuda --processes 4  # NCCL on 4 GPUs, Inductor

The choices (torch._dynamo.config.optimize_ddp):
- ddp_optimizer (PyTorch's default): the forward graph is split at DDP's gradient buckets, so each bucket's
  all-reduce starts while the backward of the earlier pieces still runs (overlap), at the price of one graph
  per bucket (no fusion across the cuts);
- no_optimization: one graph; DDP's hooks fire only once the whole compiled backward has run, so the
  all-reduces wait for it (no overlap);
- python_reducer: one graph and DDP's reducer in Python, meant for compiled autograd to trace into the
  backward (overlap inside one graph; experimental). Compiled autograd engages only for a backward called
  inside compiled code, and Lightning's loop calls it outside: here the backward then runs eagerly.
The network sits inside a wrapper module that DDP wraps, as Lightning's strategy wraps the LightningModule, and
is compiled in place, as `--model.compile_training` does.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

from diffusion.models import UNet

CHOICES = ("eager", "ddp_optimizer", "no_optimization", "python_reducer")


class LossModule(torch.nn.Module):
    def __init__(self, network: torch.nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return (self.network(x, t) - x).square().mean()


def run_rank(rank: int, args: argparse.Namespace, choice: str, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.processes)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    network = UNet(in_channels=3, channels=args.channels, channel_mult=[1, 2, 2], num_res_blocks=1).to(device)
    forward_graphs = []

    def counting_backend(graph, example_inputs):
        forward_graphs.append(graph)
        return torch._dynamo.backends.registry.lookup_backend(args.backend)(graph, example_inputs)

    if choice != "eager":
        torch._dynamo.config.optimize_ddp = choice
        network.compile(backend=counting_backend)
    model = DistributedDataParallel(LossModule(network), bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    seconds = []
    for _ in range(args.warmup + args.steps):
        x = torch.randn(args.batch, 3, args.size, args.size, generator=generator).to(device)
        t = torch.randint(0, 1000, (args.batch,), generator=generator).to(device)
        start = time.perf_counter()
        model(x, t).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        weights = torch.cat([p.detach().flatten() for p in network.parameters()]).cpu().numpy()
        results.put({
            "choice": choice, "forward_graphs": len(forward_graphs),
            "median_s": statistics.median(seconds[args.warmup:]), "weights": weights,
        })  # fmt: skip
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--choices", default=",".join(CHOICES))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--backend", default=None, help="aot_eager on a CPU, inductor on CUDA by default")
    parser.add_argument("--channels", type=int, default=32, help="the UNet's width (32: 2.2M parameters)")
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8, help="per process")
    parser.add_argument("--bucket_mb", type=float, default=2.0, help="DDP's bucket cap (its default is 25)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    args.backend = args.backend or ("inductor" if args.device == "cuda" else "aot_eager")
    context = mp.get_context("spawn")
    rows, reference = [], None
    for number, choice in enumerate(args.choices.split(",")):
        results = context.Queue()
        ranks = [
            context.Process(target=run_rank, args=(rank, args, choice, 29600 + number, results))
            for rank in range(args.processes)
        ]
        for process in ranks:
            process.start()
        row = results.get(timeout=3600)
        for process in ranks:
            process.join()
        reference = row["weights"] if choice == "eager" else reference
        row["max_diff"] = "-" if reference is None else f"{abs(row['weights'] - reference).max():.1e}"
        rows.append(row)
    print(
        f"\n{args.processes} processes on {args.device}, backend {args.backend}, bucket cap {args.bucket_mb} MB"
    )
    print("| choice | graphs compiled | median s/step | max abs weight diff to eager |")
    print("| --- | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['choice']} | {row['forward_graphs']} | {row['median_s']:.3f} | {row['max_diff']} |")


if __name__ == "__main__":
    main()
