"""Does the vector path learn data with fine structure? Seven distributions, trained as a user would.

    python benchmarks/quality/vectors.py                          # all seven (about 40 min on a quiet 2-core CPU)
    python benchmarks/quality/vectors.py --only thin_rings        # some of them
    python benchmarks/quality/vectors.py --reuse benchmarks/runs  # no training: evaluate <dir>/vectors_<name>/version_N
    python benchmarks/quality/vectors.py --resume                 # train only the sets without a finished run yet
    python benchmarks/quality/vectors.py --quick --out /tmp/v     # plumbing check in about a minute (meaningless numbers)
    python benchmarks/quality/vectors.py -- --model.lr 2e-3       # extra train.py arguments after --

Each distribution (`vector_sets.py`) is drawn (20,000 points, seed 0), saved as a .npy file and trained by
`python train.py --config configs/toy2d.yaml --data.path X.npy` in a subprocess; the EMA weights of its
last.ckpt are sampled with DDPM-1000 (the recipe's default sampler) and DDIM-50, per-sample seed 0.

Scores, all against fresh real data (seeds other than the training data's):
- on-support share: a sample is on the support when its normalized distance to the generating structure (in
  units of the local noise scale, see vector_sets.py) is at most the 99th percentile of that distance over
  100,000 fresh real points; so fresh real data is on the support 99% of the time (the floor).
- modes covered: a mode is covered when it holds at least a quarter as many on-support samples as a fresh
  real set of the same size puts there. Modes: clusters, ring arcs (8 per ring), spiral segments, spokes.
- sliced Wasserstein-1 (200 directions, data units) to a fresh real set; floor: two fresh real sets.
Goal: on-support share >= 0.95x the floor's and every mode covered, for every distribution.
Writes benchmarks/results/vectors.md (under --out instead when given, always with --quick), and a scatter
plot of samples over real data per distribution beside its run.
"""

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

from benchmarks.arguments import list_of
from benchmarks.provenance import provenance
from benchmarks.quality.metrics_lib import sliced_wasserstein
from benchmarks.quality.train_run import run_training
from benchmarks.quality.vector_sets import Distribution, distributions
from diffusion.core.sampling import SamplingOptions
from diffusion.generation.ranks import generate
from diffusion.generation.render import denormalize, save_scatter
from diffusion.training.loading import load_checkpoint
from diffusion.training.run_folders import latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TRAIN_POINTS = 20_000
SUPPORT_QUANTILE = 0.99
THRESHOLD_POINTS = 100_000  # fresh real points that fix each distribution's support threshold
COVERAGE_FRACTION = 0.25
GOAL_RATIO = 0.95
TINY_MLP = ["--model.network.init_args.hidden_dim", "32", "--model.network.init_args.num_blocks", "1"]
QUICK = [
    "--max_steps", "10", "--model.warmup_steps", "1", "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
]  # fmt: skip
QUICK_SETS = ["ring_clusters", "mixture_16d"]


@dataclass
class Score:
    on_support: float  # share of points within the support threshold
    covered: int  # modes covered
    sliced_w1: float


@dataclass
class Result:
    name: str
    dim: int
    num_modes: int
    train_s: float | None
    steps: int | None
    floor: Score
    scores: dict[str, Score] = field(default_factory=dict)  # by sampler label
    sample_s: dict[str, float] = field(default_factory=dict)


def support_threshold(dist: Distribution, num_points: int) -> float:
    distance, _ = dist.locate(dist.sample(num_points, seed=1)[0])
    return float(np.quantile(distance, SUPPORT_QUANTILE))


def score(dist: Distribution, points: np.ndarray, reference: np.ndarray, threshold: float) -> Score:
    """Score (N, D) points against a fresh real reference set of the same size."""
    distance, modes = dist.locate(points)
    ref_distance, ref_modes = dist.locate(reference)
    counts = np.bincount(modes[distance <= threshold], minlength=dist.num_modes)
    ref_counts = np.bincount(ref_modes[ref_distance <= threshold], minlength=dist.num_modes)
    covered = int((counts >= COVERAGE_FRACTION * ref_counts).sum())
    return Score(float((distance <= threshold).mean()), covered, sliced_wasserstein(points, reference))


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "reused"
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def train(name: str, data_path: Path, runs_dir: Path, quick: bool, extra: list[str]) -> tuple[Path, float]:
    """`python train.py --config configs/toy2d.yaml --data.path X.npy ...`; returns (last.ckpt, seconds)."""
    command = [
        sys.executable, "train.py", "--config", "configs/toy2d.yaml", "--data.path", str(data_path),
        "--trainer.logger.init_args.save_dir", str(runs_dir), "--trainer.logger.init_args.name", f"vectors_{name}",
    ]  # fmt: skip
    if quick:
        command += [*TINY_MLP, *QUICK]
    command += extra
    seconds = run_training(command, runs_dir / f"train_{name}.log", name)
    print(f"[{name}] trained in {fmt_time(seconds)}", flush=True)
    ckpt = latest_checkpoint(runs_dir, f"vectors_{name}")
    record = {"seconds": seconds, "checkpoint": str(ckpt), "command": command[1:]}
    (runs_dir / f"train_{name}.json").write_text(json.dumps(record, indent=1))
    return ckpt, seconds


def finished_run(runs_dir: Path, name: str) -> tuple[Path, float | None] | None:
    """(last.ckpt, train seconds) of a run this script finished earlier, if any."""
    record_path = runs_dir / f"train_{name}.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if Path(record["checkpoint"]).is_file():
            return Path(record["checkpoint"]), record["seconds"]
    return None


def evaluate(
    dist: Distribution, ckpt: Path, result: Result, samplers: list[tuple[str, int]], num_samples: int,
    threshold: float, reference: np.ndarray,
) -> None:  # fmt: skip
    module = load_checkpoint(ckpt, weights="ema")
    result.steps = result.steps or int(torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"])
    for sampler, steps in samplers:
        label = f"{sampler}-{steps}"
        start = time.perf_counter()
        options = SamplingOptions(sampler=sampler, steps=steps)
        samples = generate(module, num_samples, sampler=module.sampler(options), batch_size=1000, seed=0)
        result.sample_s[label] = time.perf_counter() - start
        points = denormalize(samples.float(), module.normalization).numpy().astype(np.float64)
        result.scores[label] = score(dist, points, reference, threshold)
        s = result.scores[label]
        print(
            f"[{dist.name}] {label}: on support {s.on_support:.3f} (real {result.floor.on_support:.3f}), "
            f"modes {s.covered}/{dist.num_modes}, SW {s.sliced_w1:.4g} (real {result.floor.sliced_w1:.4g}), "
            f"{fmt_time(result.sample_s[label])}",
            flush=True,
        )
        if label.startswith("ddpm"):
            save_scatter(points, ckpt.parent.parent / f"samples_{label}.png", reference=reference)


def markdown(results: list[Result], header: str) -> str:
    lines = [
        header,
        "",
        "| distribution | D | modes | train steps | train wall | sampler | on support | real | ratio "
        "| modes covered | real | SW1 | real | ratio | goal |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for res in results:
        floor = res.floor
        for label, s in res.scores.items():
            ratio = s.on_support / floor.on_support
            met = ratio >= GOAL_RATIO and s.covered == res.num_modes
            lines.append(
                f"| {res.name} | {res.dim} | {res.num_modes} | {res.steps} | {fmt_time(res.train_s)} | {label} "
                f"| {s.on_support:.3f} | {floor.on_support:.3f} | {ratio:.2f} | {s.covered} | {floor.covered} "
                f"| {s.sliced_w1:.4g} | {floor.sliced_w1:.4g} | {s.sliced_w1 / floor.sliced_w1:.2f} "
                f"| {'PASS' if met else 'MISS'} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 sets, tiny networks, 10 steps: plumbing only")
    parser.add_argument(
        "--only", nargs="+", help="measure these sets",
        action=list_of(str, ",".join(QUICK_SETS), sorted(distributions())),
    )  # fmt: skip
    parser.add_argument("--reuse", type=Path, help="no training: evaluate <dir>/vectors_<name>/version_N")
    parser.add_argument("--resume", action="store_true", help="reuse the runs this script finished before")
    parser.add_argument(
        "--out", type=Path, help="write the table and runs here (default with --quick: a temp dir)"
    )
    parser.add_argument("--num_samples", type=int, default=4000, help="samples per sampler (default 4000)")
    parser.add_argument("train_args", nargs="*", help="extra train.py arguments, after --")
    args = parser.parse_args(argv)
    if args.quick and args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="vectors_quick_"))
    if args.reuse is not None and not args.reuse.is_dir():
        parser.error(f"--reuse {args.reuse}: no such folder")
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    quick = args.quick
    samplers = [("ddpm", 20), ("ddim", 5)] if quick else [("ddpm", 1000), ("ddim", 50)]
    num_samples = 200 if quick else args.num_samples
    runs_dir = args.reuse or ((args.out / "runs") if args.out else ROOT / "benchmarks" / "runs")
    table_path = (args.out or ROOT / "benchmarks" / "results") / "vectors.md"
    (runs_dir / "data").mkdir(parents=True, exist_ok=True)
    names = args.only or (QUICK_SETS if quick else list(distributions()))
    results = []
    for name in names:
        dist = distributions()[name]
        data_path = runs_dir / "data" / f"{name}.npy"
        np.save(data_path, dist.sample(3000 if quick else TRAIN_POINTS, seed=0)[0].astype(np.float32))
        threshold = support_threshold(dist, 20_000 if quick else THRESHOLD_POINTS)
        reference, other = dist.sample(num_samples, seed=2)[0], dist.sample(num_samples, seed=3)[0]
        done = finished_run(runs_dir, name) if args.reuse is not None or args.resume else None
        if done is not None:
            ckpt, seconds = done
        elif args.reuse is not None:
            ckpt, seconds = latest_checkpoint(args.reuse, f"vectors_{name}"), None
        else:
            ckpt, seconds = train(name, data_path, runs_dir, quick, args.train_args)
        result = Result(
            name, dist.dim, dist.num_modes, seconds, None, score(dist, other, reference, threshold)
        )
        evaluate(dist, ckpt, result, samplers, num_samples, threshold, reference)
        results.append(result)
    mode = " QUICK MODE (tiny networks, 10 steps): plumbing only, goals not meaningful" if quick else ""
    extra = f", extra train.py arguments: `{' '.join(args.train_args)}`" if args.train_args else ""
    header = (
        f"## Vector data with fine structure ({provenance()}, "
        f"{torch.get_num_threads()} threads, {num_samples} samples per sampler{extra}){mode}"
    )
    table = markdown(results, header)
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(table)
    print("\n" + table + f"\nwritten to {table_path}")
    return table


if __name__ == "__main__":
    main()
