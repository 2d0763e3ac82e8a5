"""The quality benchmark's class-conditional section: `python benchmarks/quality/quality.py --only digits_conditional`.

Trains configs/digits_conditional.yaml as a user would (or, with --reuse, takes its newest run) and sweeps the
classifier-free guidance scale. For every scale: 90 samples of each class from the checkpoint's default sampler
(per-sample seed 0, classes in turn), the share of each class's samples that an RBF SVC trained on the real
reference half of scikit-learn's digits assigns to the asked class, and the FD 8x8 of all 900 samples against
that reference (the floor: the other real half). Goals at the recipe's default scale: every class >= 95%, FD
<= 2x the floor. Writes benchmarks/results/quality_conditional.md and docs/digits_conditional_grid.png (ten
samples per class, one row per class), or both under --out.
"""

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.svm import SVC
from torchvision.utils import make_grid, save_image

from benchmarks.provenance import provenance
from benchmarks.quality.metrics_lib import digits_split, frechet_distance, single_threaded, to_digit_features
from benchmarks.quality.train_run import (
    ROOT,
    TINY_UNET,
    Recipe,
    earlier_run,
    find_checkpoint,
    fmt_time,
    train,
)
from diffusion.core.sampling import SamplingOptions
from diffusion.data.labels import class_labels
from diffusion.generation.ranks import generate
from diffusion.generation.render import denormalize, rows_by_class, to_uint8_images
from diffusion.training.loading import load_checkpoint

CONDITIONAL = Recipe(
    "digits_conditional", ["--config", "configs/digits_conditional.yaml"], TINY_UNET, 15 * 60, 90
)
GUIDANCE_SCALES = [0.0, 1.0, 1.5, 2.0, 3.0, 4.0]  # 0: unconditional, 1: conditional, > 1: guided
ACCURACY_GOAL = 0.95  # share of samples the SVC assigns to the asked class, for every class


@single_threaded
def train_digit_svc(images: np.ndarray, labels: np.ndarray) -> SVC:
    """An RBF SVC (scikit-learn's defaults) on (N, 64) digits in 0..16; ~99% accurate on the other half."""
    return SVC().fit(images / 16, labels)


@single_threaded
def svc_predict(classifier: SVC, images: np.ndarray) -> np.ndarray:
    return classifier.predict(np.asarray(images, dtype=np.float64) / 16)


def per_class_accuracy(predicted: np.ndarray, asked: np.ndarray, num_classes: int = 10) -> np.ndarray:
    """Share of the samples of each asked class that the classifier assigns to it, (num_classes,)."""
    return np.array([(predicted[asked == k] == k).mean() for k in range(num_classes)])


def save_class_grid(samples: torch.Tensor, labels: torch.Tensor, normalization: dict, path: Path) -> None:
    """Ten samples of each class, one row per class, upscaled x3 nearest-neighbour like docs/digits_grid.png."""
    path.parent.mkdir(parents=True, exist_ok=True)
    images, per_row = rows_by_class(denormalize(samples.float(), normalization).clamp(0, 1), labels, 10)
    grid = make_grid(images, nrow=per_row, padding=1)  # (3, H, W)
    save_image(torch.nn.functional.interpolate(grid[None], scale_factor=3, mode="nearest")[0], str(path))


def sweep(
    ckpt: Path, per_class: int, scales: list[float], steps: int | None, device: str, out: Path, progress: bool
) -> tuple[list[dict], dict]:
    """One row per guidance scale (accuracy per class, FD, sampling time) and the real-data references."""
    reference, reference_labels, other, other_labels = digits_split()
    svc = train_digit_svc(reference, reference_labels)
    module = load_checkpoint(ckpt, weights="ema", map_location=device)
    sampling = SamplingOptions(steps=steps).over(module.sampling)
    default_scale = 1.0 if sampling.guidance_scale is None else sampling.guidance_scale
    real = {
        "accuracy": per_class_accuracy(svc_predict(svc, other), other_labels),
        "fd_floor": frechet_distance(other, reference),
        "default_scale": default_scale,
        "sampling": sampling,
        "per_class": per_class,
    }
    labels = class_labels(10 * per_class, module.num_classes)  # sample i asks for class i % 10
    rows = []
    for scale in sorted({*scales, default_scale}):
        start = time.perf_counter()
        chosen = module.sampler(SamplingOptions(steps=steps, guidance_scale=scale))
        samples = generate(module, len(labels), sampler=chosen, seed=0, batch_size=300, labels=labels,
                           progress=progress)  # fmt: skip
        seconds = time.perf_counter() - start
        features = to_digit_features(to_uint8_images(samples, module.normalization))
        accuracy = per_class_accuracy(svc_predict(svc, features), labels.numpy())
        rows.append(
            {
                "scale": scale,
                "accuracy": accuracy,
                "fd": frechet_distance(features, reference),
                "seconds": seconds,
            }
        )
        print(f"[digits_conditional] s={scale:g}: min class accuracy {accuracy.min():.3f}, "
              f"FD {rows[-1]['fd']:.2f} ({fmt_time(seconds)})", flush=True)  # fmt: skip
        if scale == default_scale:
            save_class_grid(samples, labels, module.normalization, out / "digits_conditional_grid.png")
    return rows, real


def markdown(rows: list[dict], real: dict, train_s: float | None, header: str) -> str:
    floor, default, sampling = real["fd_floor"], real["default_scale"], real["sampling"]
    sampler = f"{sampling.sampler or 'ddpm'}-{sampling.steps or 'T'}" + (
        f" (eta {sampling.eta:g})" if sampling.sampler == "ddim" and sampling.eta else ""
    )
    lines = [
        header, "",
        f"configs/digits_conditional.yaml, training {fmt_time(train_s)}; sampler {sampler} (the checkpoint's "
        f"default), {real['per_class']} samples per class, per-sample seed 0; the recipe's default guidance "
        f"scale is {default:g}. Accuracy: the share of each asked class's samples that an RBF SVC trained on "
        "the real reference half assigns to that class. FD 8x8 of all samples against the reference half.", "",
        "| guidance scale | min class accuracy | mean accuracy | worst class | FD 8x8 | FD / floor "
        "| sampling time |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]  # fmt: skip
    for row in rows:
        accuracy, mark = row["accuracy"], " (default)" if row["scale"] == default else ""
        lines.append(
            f"| {row['scale']:g}{mark} | {accuracy.min():.3f} | {accuracy.mean():.3f} | {int(accuracy.argmin())} "
            f"| {row['fd']:.2f} | {row['fd'] / floor:.2f} | {fmt_time(row['seconds'])} |"
        )
    accuracy = real["accuracy"]
    lines.append(
        f"| real digits (other half) | {accuracy.min():.3f} | {accuracy.mean():.3f} | {int(accuracy.argmin())} "
        f"| {floor:.2f} (floor) | 1.00 | - |"
    )
    lines += ["", "Accuracy per class (0..9):", ""]
    lines += [f"- s = {row['scale']:g}: " + " ".join(f"{a:.2f}" for a in row["accuracy"]) for row in rows]
    at_default = next(row for row in rows if row["scale"] == default)
    worst = at_default["accuracy"].min()
    targets = [
        (f"every class >= {ACCURACY_GOAL:.0%} at the default scale {default:g} (min {worst:.3f})",
         worst >= ACCURACY_GOAL),
        (f"FD {at_default['fd']:.2f} <= 2x floor ({2 * floor:.2f}) at the default scale",
         at_default["fd"] <= 2 * floor),
    ]  # fmt: skip
    if train_s is not None:
        targets.append((f"training {fmt_time(train_s)} <= 15 min", train_s <= CONDITIONAL.train_limit_s))
    lines += ["", "| target | result |", "| --- | --- |"]
    lines += [f"| {text} | {'PASS' if met else 'MISS'} |" for text, met in targets]
    return "\n".join(lines) + "\n"


def measure_digits_conditional(args: argparse.Namespace) -> str:
    """Train (or reuse) the conditional digits recipe and sweep the guidance scale; returns the markdown."""
    runs_dir = args.runs or ((args.out / "runs") if args.out else ROOT / "benchmarks" / "runs")
    if args.reuse is not None:
        ckpt, seconds = find_checkpoint(args.reuse, CONDITIONAL.name), None
    else:
        ckpt, seconds = train(CONDITIONAL, runs_dir, args.quick, log_dir=runs_dir)
    print(f"[digits_conditional] evaluating {ckpt}", flush=True)
    quick = args.quick
    per_class, scales, steps = (
        (4, [0.0, 1.0, 2.0], 5) if quick else (CONDITIONAL.num_samples, GUIDANCE_SCALES, None)
    )
    docs = args.out or ROOT / "docs"
    rows, real = sweep(ckpt, per_class, scales, steps, args.device, docs, progress=not quick)
    mode = " QUICK MODE (tiny network, 20 steps): plumbing only, targets not meaningful" if quick else ""
    header = (
        f"## Class-conditional digits: guidance scale ({provenance(args.device)}, {torch.get_num_threads()} "
        f"threads, sampling on {args.device}){mode}"
    )
    table = markdown(rows, real, seconds, header)
    path = (args.out or ROOT / "benchmarks" / "results") / "quality_conditional.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table + earlier_run(path, quick))
    print("\n" + table + f"\nwritten to {path}")
    return table
