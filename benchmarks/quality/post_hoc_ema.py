"""Post-hoc EMA on the digits: FD against sigma_rel, and the best against the run's own fixed-decay EMA.

    python train.py --ema.post_hoc true          # the digits recipe, with post-hoc EMA snapshots
    python benchmarks/quality/post_hoc_ema.py --run runs/digits/version_N [--seeds 0 1] [--sigma_rels 0.05 0.1]

The quality benchmark's protocol (benchmarks/quality/quality.py): 898 samples (DPM-Solver++(2M) SDE, 20 steps, the
digits' best sampler per cost) area-averaged back to 8x8 and scored by the Fréchet distance against a fixed
half of the 1,797 real digits; the other real half scores the floor. Every row draws the same samples' noise
(per-sample seeds), so rows differ by their weights only; each seed gives a column. Writes the table to
benchmarks/results/post_hoc_ema.md (--out to write elsewhere).
"""

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root

from benchmarks.arguments import existing, list_of, resolved  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from benchmarks.quality.metrics_lib import (  # noqa: E402
    REFERENCE_SIZE,
    digits_split,
    frechet_distance,
    to_digit_features,
)
from diffusion.core.sampling import SAMPLERS, SamplingOptions  # noqa: E402
from diffusion.generation.ranks import generate  # noqa: E402
from diffusion.generation.render import to_uint8_images  # noqa: E402
from diffusion.training.loading import load_checkpoint  # noqa: E402
from diffusion.training.post_hoc_ema import find_snapshots, reconstruct  # noqa: E402
from diffusion.training.run_folders import checkpoints_of_run, post_hoc_ema_folder  # noqa: E402

# Power-function profiles end at sqrt(1/12) = 0.289, a plain mean over the whole run.
SIGMA_RELS = [0.03, 0.05, 0.07, 0.09, 0.11, 0.13, 0.16, 0.2, 0.25, 0.28]


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--run", type=Path, required=True, help="a digits run trained with --ema.post_hoc true"
    )
    parser.add_argument("--sigma_rels", nargs="+", default=SIGMA_RELS, action=list_of(float, "0.05,0.1"))
    parser.add_argument("--seeds", nargs="+", default=[0, 1], action=list_of(int, "0,1"))
    parser.add_argument("--sampler", default="dpmpp_2m_sde", choices=sorted(SAMPLERS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "post_hoc_ema.md")
    args = parser.parse_args(argv)
    existing(
        parser, "--run", args.run, "a run folder (runs/digits/version_N) trained with --ema.post_hoc true"
    )
    step, ckpt = resolved(parser, "--run", args.run, newest_checkpoint_of_run)

    def snapshots_of(run: Path) -> list:
        folder = post_hoc_ema_folder(run)  # a run without one: its own "no post-hoc EMA snapshots" line below
        return find_snapshots(folder) if folder.is_dir() else []

    snapshots = resolved(parser, "--run", args.run, snapshots_of)
    if not snapshots:
        parser.error(f"--run {args.run}: no post-hoc EMA snapshots in it — train it with --ema.post_hoc true")
    module = load_checkpoint(ckpt, weights="ema")
    run_ema = {name: value.clone() for name, value in module.state_dict().items()}
    reference, _, other, _ = digits_split()
    floor = frechet_distance(other, reference)
    options = SamplingOptions(sampler=args.sampler, steps=args.steps)

    def fds(weights: dict[str, torch.Tensor]) -> list[float]:
        module.load_state_dict({**run_ema, **weights})
        scores = []
        for seed in args.seeds:
            samples = generate(
                module, REFERENCE_SIZE, sampler=module.sampler(options), batch_size=300, seed=seed
            )
            features = to_digit_features(to_uint8_images(samples, module.normalization))
            scores.append(frechet_distance(features, reference))
        return scores

    start = time.perf_counter()
    # The raw weights bound what any averaging can change: a run whose raw weights score as its EMA's leaves
    # the EMA length little to improve.
    raw = load_checkpoint(ckpt, weights="raw").state_dict()
    rows = [("the run's raw weights (no EMA)", "-", "-", fds(raw)), ("the run's EMA", "-", "-", fds({}))]
    print(rows, flush=True)
    for sigma_rel in args.sigma_rels:
        reconstruction = reconstruct(snapshots, sigma_rel, step)
        error = f"{100 * reconstruction.solution.relative_error:.2f}%"
        rows.append(("post-hoc EMA", f"{sigma_rel:g}", error, fds(reconstruction.weights)))
        print(rows[-1], flush=True)
    mean = lambda scores: sum(scores) / len(scores)  # noqa: E731
    seeds = " | ".join(f"FD seed {seed}" for seed in args.seeds)
    lines = [
        f"## Post-hoc EMA on the digits ({provenance()})",
        "",
        f"Run {args.run} ({ckpt.name}, step {step}, {len(snapshots)} snapshots); {REFERENCE_SIZE} samples of "
        f"{args.sampler}-{args.steps} per seed against the reference half; real-data floor (the other half): "
        f"{floor:.2f}. Sampled and scored in {(time.perf_counter() - start) / 60:.0f} min.",
        "",
        f"| weights | sigma_rel | profile fit error | {seeds} | mean FD | mean / floor |",
        "| --- | ---: | ---: |" + " ---: |" * len(args.seeds) + " ---: | ---: |",
    ]
    for label, sigma_rel, error, scores in rows:
        shown = " | ".join(f"{fd:.2f}" for fd in scores)
        lines.append(
            f"| {label} | {sigma_rel} | {error} | {shown} | {mean(scores):.2f} | {mean(scores) / floor:.3f} |"
        )
    best = min(rows[2:], key=lambda row: mean(row[3]))
    change = 100 * (mean(best[3]) - mean(rows[1][3])) / mean(rows[1][3])
    lines += [
        "",
        f"Best: sigma_rel {best[1]}, mean FD {mean(best[3]):.2f} ({change:+.1f}% against the run's EMA).",
    ]
    table = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    print(f"\n{table}written to {args.out}")
    return table


def newest_checkpoint_of_run(run: Path) -> tuple[int, Path]:
    """(step, path) of the run folder's newest readable checkpoint."""
    found = checkpoints_of_run(run)
    if not found:
        raise FileNotFoundError(
            f"no readable checkpoint in {run / 'checkpoints'} — pass a run folder train.py wrote"
        )
    return found[-1]


if __name__ == "__main__":
    main()
