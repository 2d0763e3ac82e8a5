"""DDIM-50's digits FD against its eta, on the checkpoint benchmarks/quality/quality.py trained.

`python benchmarks/quality/ddim_eta.py [--ckpt PATH] [--etas 0 0.3 0.5]` prints a markdown table (and writes it to
benchmarks/results/ddim_eta.md): same 898 samples, seed, features and reference half as quality.py.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root

from benchmarks.arguments import existing, list_of, resolved  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from benchmarks.quality.metrics_lib import digits_split, frechet_distance, to_digit_features  # noqa: E402
from diffusion.core.sampling import SamplingOptions  # noqa: E402
from diffusion.generation.ranks import generate  # noqa: E402
from diffusion.generation.render import to_uint8_images  # noqa: E402
from diffusion.training.loading import load_checkpoint, model_hyperparameters  # noqa: E402
from diffusion.training.run_folders import latest_checkpoint  # noqa: E402


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ckpt", type=Path, default=None, help="default: benchmarks/runs/digits newest last.ckpt"
    )
    parser.add_argument("--etas", nargs="+", default=[0.0, 0.3, 0.5], action=list_of(float, "0,0.3,0.5"))
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--num_samples", type=int, default=898)
    args = parser.parse_args(argv)
    existing(parser, "--ckpt", args.ckpt, "a .ckpt train.py wrote")
    ckpt = resolved(parser, "--ckpt", args.ckpt or ROOT / "benchmarks" / "runs", find_checkpoint)
    module = load_checkpoint(ckpt, weights="ema")
    reference = digits_split()[0]
    lines = [
        f"## DDIM-{args.steps} on digits against eta ({provenance()})",
        "",
        f"`{ckpt}` (EMA weights), {args.num_samples} samples (per-sample seed 0) against the reference half.",
        "",
        "| eta | FD 8x8 | time |",
        "| ---: | ---: | ---: |",
    ]
    for eta in args.etas:
        start = time.perf_counter()
        options = SamplingOptions(sampler="ddim", steps=args.steps, eta=eta)
        samples = generate(module, args.num_samples, sampler=module.sampler(options), batch_size=300, seed=0)
        fd = frechet_distance(to_digit_features(to_uint8_images(samples, module.normalization)), reference)
        lines.append(f"| {eta:g} | {fd:.2f} | {time.perf_counter() - start:.0f} s |")
        print(lines[-1], flush=True)
    table = "\n".join(lines) + "\n"
    out = ROOT / "benchmarks" / "results" / "ddim_eta.md"
    out.write_text(table)
    print(f"\n{table}written to {out}")
    return table


def find_checkpoint(path: Path) -> Path:
    """--ckpt (checked: readable, written by train.py), or the newest digits run's under benchmarks/runs."""
    ckpt = path if path.is_file() else latest_checkpoint(path, "digits")
    model_hyperparameters(ckpt)
    return ckpt


if __name__ == "__main__":
    main()
