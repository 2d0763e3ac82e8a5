"""The first thing a user runs, timed and scored: `python train.py` (the default recipe, configs/digits.yaml) as
printed in the README, on this machine, then the Fréchet distance of its final checkpoint's samples.

    python benchmarks/quality/first_run.py                       # ~10 min on 2 CPU cores: trains, samples, scores
    python benchmarks/quality/first_run.py --quick --out /tmp/f  # plumbing check in about a minute (numbers meaningless)

Targets (issue 33): on a 2-core CPU without AVX-512 the run takes at most 600 s, and the samples of its
checkpoint (EMA weights, the recipe's own sampler, 898 of them, seed 0) reach an FD in 8x8 pixel space of at most
1.3x the real-data floor (the other real half against the same reference; benchmarks/quality/metrics_lib.py). Each
line says PASS or MISS; a CPU with AVX-512 or more cores is faster, and the table says which CPU it came from.

The results go to benchmarks/results/first_run.md (OUT/first_run.md with --out, and always with --quick): one row
per CPU kind (model, cores, vector extensions), a later run on the same kind replacing its row, the others kept,
each with its date and commit.
"""

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

from benchmarks.provenance import COMMIT_AT_START, cpu_kind, provenance
from benchmarks.quality.metrics_lib import REFERENCE_SIZE, digits_split, frechet_distance, to_digit_features
from benchmarks.quality.train_run import run_training
from diffusion.generation.ranks import generate
from diffusion.generation.render import to_uint8_images
from diffusion.training.loading import load_checkpoint
from diffusion.training.run_folders import latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import TINY_UNET  # noqa: E402 (the tiny network --quick shares with the tests)

TIME_LIMIT_S, FD_LIMIT = 600.0, 1.3
QUICK = [
    *TINY_UNET,
    "--max_steps",
    "6",
    "--trainer.val_check_interval",
    "3",
    "--sample_grid.num_samples",
    "4",
]
HEADER = [
    "| CPU (cores, vector extensions) | date | commit | `python train.py` | FD 8x8 (floor) | FD / floor | "
    "time <= 600 s | FD <= 1.3x floor |",
    "| --- | --- | --- | ---: | ---: | ---: | --- | --- |",
]


def score(checkpoint: Path, num_samples: int) -> tuple[float, float]:
    """(FD of the checkpoint's samples by its own default sampler, the real-data floor), in 8x8 pixel space."""
    reference, _, other, _ = digits_split()
    floor = frechet_distance(other, reference)
    module = load_checkpoint(checkpoint, weights="ema")
    samples = generate(
        module, num_samples, sampler=module.sampler(), batch_size=300, seed=0
    )  # the checkpoint's settings
    return frechet_distance(
        to_digit_features(to_uint8_images(samples, module.normalization)), reference
    ), floor


def row(kind: str, seconds: float, fd: float, floor: float) -> str:
    mark = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    limited = "AVX-512" not in kind and re.search(r", 2 cores,", kind) is not None
    time_result = (
        mark(seconds <= TIME_LIMIT_S)
        if limited
        else f"{mark(seconds <= TIME_LIMIT_S)} (not the target's CPU)"
    )
    return (
        f"| {kind} | {time.strftime('%Y-%m-%d')} | {COMMIT_AT_START} | {seconds:.0f} s | {fd:.2f} ({floor:.2f}) "
        f"| {fd / floor:.3f}x | {time_result} | {mark(fd <= FD_LIMIT * floor)} |"
    )


def write(out: Path, new_row: str, kind: str, quick: bool) -> str:
    """The results file with this CPU kind's row replaced (or added), the other kinds' rows kept."""
    path = out / "first_run.md"
    rows = (
        [line for line in path.read_text().splitlines() if line.startswith("| ")][2:]
        if path.is_file()
        else []
    )
    rows = [line for line in rows if not line.startswith(f"| {kind} |")] + [new_row]
    text = "\n".join([
        "# The first run: `python train.py` (the default recipe) on a CPU"
        + (" QUICK MODE (a tiny UNet, a few steps): plumbing only, the numbers mean nothing" if quick else ""),
        "",
        "`python benchmarks/quality/first_run.py`: the default recipe trained as the README prints it (wall time of the "
        "whole command: start-up, training, validations, sample grids, checkpoints), then 898 samples of its "
        "last.ckpt (EMA weights, its own sampler, seed 0) scored by their Fréchet distance to 898 real digits "
        "in 8x8 pixel space, against the floor of the other 899 real digits. Targets: at most 600 s on a 2-core "
        "CPU without AVX-512, FD at most 1.3x the floor.",
        "",
        *HEADER,
        *rows,
    ])  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return text


# Plain-loop variants of the default recipe's training step (network, batch, layout, threads, precision): what each
# lever buys per step on this CPU; what it costs in quality takes a training run each (the results file's table).
LEVERS = {
    "the recipe (32 channels, 2 res blocks, batch 64)": ({}, {}),
    "channels_last": ({}, {"channels_last": True}),
    "1 thread": ({}, {"threads": 1}),
    "bf16 autocast": ({}, {"bf16": True}),
    "24 channels": ({"channels": 24}, {}),
    "16 channels": ({"channels": 16}, {}),
    "16x16 (the default until 2026-11-27)": ({}, {"size": 16}),
    "1 res block": ({"num_res_blocks": 1}, {}),
    "no attention": ({"attention_levels": []}, {}),
    "batch 32": ({}, {"batch": 32}),
}


def lever_step(network_args: dict, channels_last=False, threads=None, bf16=False, batch=64, size=8):
    """One training step's work of a variant (forward, backward, fused Adam), as a function to time."""
    import torch

    from diffusion.models import UNet

    torch.manual_seed(0)
    network = UNet(in_channels=1, **{"channels": 32, **network_args})
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3, fused=True)
    x, t = torch.randn(batch, 1, size, size), torch.randint(0, 1000, (batch,))
    if channels_last:
        network, x = (
            network.to(memory_format=torch.channels_last),
            x.contiguous(memory_format=torch.channels_last),
        )

    def step() -> None:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads or previous)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = network(x, t).float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.set_num_threads(previous)

    return step


def levers(rounds: int, steps: int) -> list[str]:
    """The LEVERS timed side by side: `rounds` interleaved rounds of `steps` steps each after one warm-up step;
    each variant's median step and its ratio to the recipe's in the same rounds."""
    import statistics

    runs = {name: lever_step(network, **options) for name, (network, options) in LEVERS.items()}
    for step in runs.values():
        step()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs)[r % len(runs) :] + list(runs)[: r % len(runs)]:
            began = time.perf_counter()
            for _ in range(steps):
                runs[name]()
            times[name].append((time.perf_counter() - began) / steps)
    recipe = next(iter(times))
    lines = [
        "",
        f"Levers, per training step (`--levers`: {rounds} interleaved rounds of {steps} steps, median; "
        f"{cpu_kind()}; a quiet machine):",
        "",
        "| variant | s / step | vs the recipe |",
        "| --- | ---: | ---: |",
    ]
    for name, values in times.items():
        ratio = statistics.median(a / b for a, b in zip(values, times[recipe], strict=True))
        lines.append(f"| {name} | {statistics.median(values):.3f} | {ratio:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a tiny UNet and 6 steps: plumbing only")
    parser.add_argument("--out", type=Path, help="write first_run.md here (default: benchmarks/results)")
    parser.add_argument(
        "--levers", action="store_true", help="only time the recipe's step against its variants (no training)"
    )
    args = parser.parse_args(argv)
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="first_run_")) if args.quick else ROOT / "benchmarks" / "results"
    )
    if args.levers:
        timed = levers(rounds=2 if args.quick else 5, steps=1 if args.quick else 5)
        text = "\n".join([f"# What each lever buys the default recipe's step ({provenance()})", *timed])
        out.mkdir(parents=True, exist_ok=True)
        (out / "first_run_levers.md").write_text(text + "\n")
        print(text)
        return text
    runs = Path(tempfile.mkdtemp(prefix="first_run_runs_"))
    command = [sys.executable, "train.py", "--trainer.logger.init_args.save_dir", str(runs)]
    seconds = run_training(command + (QUICK if args.quick else []), runs / "train.log", "first run")
    fd, floor = score(latest_checkpoint(runs, "digits"), 16 if args.quick else REFERENCE_SIZE)
    kind = cpu_kind()
    print(
        f"[first run] {kind}: {seconds:.0f} s, FD {fd:.2f} = {fd / floor:.3f}x the floor {floor:.2f}",
        flush=True,
    )
    text = write(out, row(kind, seconds, fd, floor), kind, args.quick)
    print("\n" + text + f"\nwritten to {out / 'first_run.md'}")
    return text


if __name__ == "__main__":
    main()
