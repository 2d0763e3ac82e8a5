"""Sample quality of the two CPU recipes, trained from scratch exactly as a user would.

    python benchmarks/quality/quality.py                      # ~30 min on 2 CPU cores: trains digits and toy2d
    python benchmarks/quality/quality.py --only toy2d          # one recipe
    python benchmarks/quality/quality.py --reuse runs          # no training: evaluate <dir>/<recipe>/version_N (newest)
    python benchmarks/quality/quality.py --quick --out /tmp/q  # plumbing check in about a minute (meaningless numbers)
    python benchmarks/quality/quality.py --only digits_conditional  # guidance on conditional digits (quality_conditional.py)

Each recipe is trained by `python train.py [--config configs/toy2d.yaml]` in a subprocess (its wall time is
what a user waits), then its last.ckpt (EMA weights) is sampled with DDPM-1000 and DDIM-50, per-sample seed 0;
the digits also with the few-step samplers DDIM-20, DPM-Solver++(2M)-20 (`dpmpp_2m`) and its SDE variant
(`dpmpp_2m_sde`), each scored by its FD and by that FD's ratio to DDPM-1000's on the same checkpoint.

- digits: Frechet distance in 8x8 pixel space (samples area-averaged back to scikit-learn's 8x8 grid, 0..16)
  against a fixed half of the 1,797 real digits; the floor is the other real half against the same reference.
  Plus a logistic-regression classifier's Inception-Score analogue and mean confidence, real half beside.
- toy2d: sliced Wasserstein distance (200 directions) between 2,000 samples and 2,000 fresh real points in
  data units; the floor is the distance between two fresh real sets.

Writes the table to benchmarks/results/quality.md, the digits grid to docs/digits_grid.png and the toy
scatter to docs/toy2d_scatter.png (everything under --out instead when given, and always with --quick).
"""

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml
from torchvision.utils import make_grid, save_image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

from benchmarks.provenance import provenance
from benchmarks.quality.metrics_lib import (
    REFERENCE_SIZE,
    classifier_scores,
    digits_split,
    frechet_distance,
    sliced_wasserstein,
    to_digit_features,
    train_digit_classifier,
)
from benchmarks.quality.quality_conditional import measure_digits_conditional
from benchmarks.quality.train_run import (
    ROOT,
    TINY_MLP,
    TINY_UNET,
    Recipe,
    earlier_run,
    find_checkpoint,
    fmt_time,
    train,
)
from diffusion.core.sampling import SamplingOptions
from diffusion.data.vectors import VectorDataModule
from diffusion.generation.ranks import generate
from diffusion.generation.render import denormalize, save_scatter, to_uint8_images
from diffusion.training.loading import load_checkpoint

RECIPES = {
    "digits": Recipe("digits", [], TINY_UNET, 15 * 60, REFERENCE_SIZE, few_step=True),
    "toy2d": Recipe("toy2d", ["--config", "configs/toy2d.yaml"], TINY_MLP, 3 * 60, 2000),
}
# (sampler, steps); the first is the reference that the others' FD is compared with.
SAMPLERS = [("ddpm", 1000), ("ddim", 50)]
FEW_STEP = [("ddim", 20), ("dpmpp_2m", 20), ("dpmpp_2m_sde", 20)]
QUICK_SAMPLERS = [("ddpm", 20), ("ddim", 5)]
QUICK_FEW_STEP = [("dpmpp_2m", 5), ("dpmpp_2m_sde", 5)]
FEW_STEP_TARGET = "dpmpp_2m"  # the issue's goal for dpmpp_2m and dpmpp_2m_sde: within 1.2x of DDPM-1000's FD


def recipe_samplers(recipe: Recipe, quick: bool) -> list[tuple[str, int]]:
    base, few = (QUICK_SAMPLERS, QUICK_FEW_STEP) if quick else (SAMPLERS, FEW_STEP)
    return base + few if recipe.few_step else base


@dataclass
class Sampling:
    samplers: list[tuple[str, int]]  # (sampler, steps)
    device: str
    progress: bool


@dataclass
class Result:
    recipe: str
    train_s: float | None  # None when reused
    sample_s: dict[str, float] = field(default_factory=dict)  # wall time of each sampler, by label
    # (sampler, metric, value, real-data value or None)
    rows: list[tuple[str, str, float, float | None]] = field(default_factory=list)


def draw(ckpt: Path, num_samples: int, sampling: Sampling, result: Result):
    """Yield (label, samples in model units, normalization) for each sampler, from the EMA weights."""
    module = load_checkpoint(ckpt, weights="ema", map_location=sampling.device)
    for sampler, steps in sampling.samplers:
        label = f"{sampler}-{steps}"
        start = time.perf_counter()
        samples = generate(
            module,
            num_samples,
            sampler=module.sampler(SamplingOptions(sampler=sampler, steps=steps)),
            batch_size=300,
            seed=0,
            progress=sampling.progress,
        )
        result.sample_s[label] = time.perf_counter() - start
        print(
            f"[{result.recipe}] {label}: {num_samples} samples in {fmt_time(result.sample_s[label])}",
            flush=True,
        )
        yield label, samples, module.normalization


def evaluate_digits(ckpt: Path, num_samples: int, sampling: Sampling, out: Path, result: Result) -> None:
    reference, reference_labels, other, _ = digits_split()
    other = other if num_samples >= REFERENCE_SIZE else other[:num_samples]
    classifier = train_digit_classifier(reference, reference_labels)
    real_score, real_confidence = classifier_scores(classifier, other)
    floor = frechet_distance(other, reference)
    noise = np.random.default_rng(1).uniform(0, 16, (len(other), 64))
    result.rows.append(("uniform noise", "FD 8x8", frechet_distance(noise, reference), floor))
    for label, samples, normalization in draw(ckpt, num_samples, sampling, result):
        features = to_digit_features(to_uint8_images(samples, normalization))
        score, confidence = classifier_scores(classifier, features)
        result.rows += [
            (label, "FD 8x8", frechet_distance(features, reference), floor),
            (label, "class score (IS-like)", score, real_score),
            (label, "mean confidence", confidence, real_confidence),
        ]
        if label.startswith("ddpm"):
            save_digit_grid(samples[:64], normalization, out / "digits_grid.png")
    # Each sampler's FD relative to the first's (DDPM-1000) on the same checkpoint and reference.
    labels = [f"{sampler}-{steps}" for sampler, steps in sampling.samplers]
    fds = {label: value for label, metric, value, _ in result.rows if metric == "FD 8x8" and label in labels}
    for label in labels[1:]:
        result.rows.append((label, f"FD / {labels[0]}'s FD", fds[label] / fds[labels[0]], None))


def save_digit_grid(samples: torch.Tensor, normalization: dict, path: Path) -> None:
    """Samples side by side (1-pixel gaps), then the whole grid upscaled nearest-neighbour (a whole factor)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    images = denormalize(samples.float(), normalization).clamp(0, 1)
    grid = make_grid(images, nrow=8, padding=1)  # (3, H, W)
    scale = max(1, round(400 / grid.shape[-1]))  # about 400 pixels wide, whatever the digits' size
    grid = torch.nn.functional.interpolate(grid[None], scale_factor=scale, mode="nearest")[0]
    save_image(grid, str(path))


def toy_data_options(ckpt: Path) -> dict:
    """The run's data settings (dataset, noise, seed) from the config.yaml LightningCLI saved beside it."""
    config_path = ckpt.parent.parent / "config.yaml"
    options = {"dataset": "swiss_roll", "noise": 0.05, "seed": 0}
    if config_path.is_file():
        data = yaml.safe_load(config_path.read_text()).get("data", {})
        options.update({k: v for k, v in data.get("init_args", {}).items() if k in options})
        if data.get("init_args", {}).get("path"):
            raise SystemExit(f"{ckpt}: trained on a .npy file; this benchmark needs a synthetic toy set")
    else:
        print(f"[toy2d] no {config_path}; assuming the default data {options}", flush=True)
    return options


def real_toy_points(options: dict, num_samples: int, seed: int) -> np.ndarray:
    """Fresh points of the training distribution, in data units, from the data module's own generator."""
    dm = VectorDataModule(options["dataset"], num_samples=num_samples, noise=options["noise"], seed=seed)
    return denormalize(dm.data, dm.normalization).numpy().astype(np.float64)


def evaluate_toy(ckpt: Path, num_samples: int, sampling: Sampling, out: Path, result: Result) -> None:
    options = toy_data_options(ckpt)
    # Seeds other than the training data's, so the reference points are fresh draws.
    real = real_toy_points(options, num_samples, options["seed"] + 1)
    floor = sliced_wasserstein(real_toy_points(options, num_samples, options["seed"] + 2), real)
    for label, samples, normalization in draw(ckpt, num_samples, sampling, result):
        points = denormalize(samples.float(), normalization).numpy().astype(np.float64)
        result.rows.append((label, "sliced W1", sliced_wasserstein(points, real), floor))
        if label.startswith("ddpm"):
            out.mkdir(parents=True, exist_ok=True)
            save_scatter(points, out / "toy2d_scatter.png", reference=real)


def check_targets(
    results: dict[str, Result], samplers: dict[str, list[tuple[str, int]]]
) -> list[tuple[str, bool]]:
    """(description, met) for every target that applies to the recipes measured."""
    labels = {name: [f"{sampler}-{steps}" for sampler, steps in pairs] for name, pairs in samplers.items()}
    value = lambda res, label, metric: next(r for r in res.rows if r[0] == label and r[1] == metric)  # noqa: E731
    targets = []
    if "digits" in results:
        res = results["digits"]
        for label in labels["digits"]:
            _, _, fd, floor = value(res, label, "FD 8x8")
            targets.append((f"digits {label}: FD {fd:.2f} <= 2x floor ({2 * floor:.2f})", fd <= 2 * floor))
        reference, *others = labels["digits"]
        ddpm = value(res, reference, "FD 8x8")[2]
        # DDIM-50 (the previous goal) and DPM-Solver++(2M), ODE and SDE (this one), within 1.2x; DDIM-20 is
        # reported only.
        for label in others:
            if label == others[0] or label.startswith(FEW_STEP_TARGET):
                fd = value(res, label, "FD 8x8")[2]
                targets.append(
                    (f"digits {label} FD within 1.2x of {reference}'s ({1.2 * ddpm:.2f})", fd <= 1.2 * ddpm)
                )
    if "toy2d" in results:
        for label in labels["toy2d"]:
            _, _, sw, floor = value(results["toy2d"], label, "sliced W1")
            targets.append(
                (f"toy2d {label}: SW {sw:.4f} <= 1.5x floor ({1.5 * floor:.4f})", sw <= 1.5 * floor)
            )
    for name, res in results.items():
        limit = RECIPES[name].train_limit_s
        if res.train_s is not None:
            met = res.train_s <= limit
            targets.append((f"{name} training {fmt_time(res.train_s)} <= {limit / 60:.0f} min", met))
    return targets


def markdown(results: dict[str, Result], targets: list[tuple[str, bool]], header: str) -> str:
    lines = [
        header,
        "",
        "| recipe | train wall time | sampler | sampling time | metric | value | real data (floor) | ratio |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for res in results.values():
        for sampler, metric, value, real in res.rows:
            sample_time = fmt_time(res.sample_s[sampler]) if sampler in res.sample_s else "-"
            real_text, ratio = ("-", "-") if not real else (f"{real:.4g}", f"{value / real:.2f}")
            lines.append(
                f"| {res.recipe} | {fmt_time(res.train_s)} | {sampler} | {sample_time} | {metric} | {value:.4g} "
                f"| {real_text} | {ratio} |"
            )
    lines += ["", "| target | result |", "| --- | --- |"]
    lines += [f"| {text} | {'PASS' if met else 'MISS'} |" for text, met in targets]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny networks, 20 steps, 64 samples: plumbing only"
    )
    parser.add_argument("--only", choices=sorted([*RECIPES, "digits_conditional"]), help="measure one recipe")
    parser.add_argument(
        "--reuse", type=Path, help="no training: evaluate a save dir (<dir>/<recipe>/version_N) or a run"
    )
    parser.add_argument(
        "--out", type=Path, help="write table and pictures here (default with --quick: a temp dir)"
    )
    parser.add_argument(
        "--runs", type=Path, help="save dir for training (default benchmarks/runs, or OUT/runs)"
    )
    parser.add_argument(
        "--device", default="cpu", help="device for sampling (training runs as train.py decides)"
    )
    args = parser.parse_args(argv)
    if args.quick and args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="quality_quick_"))
    if args.reuse is not None and not args.reuse.is_dir():
        parser.error(f"--reuse {args.reuse}: no such folder")
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    if args.only == "digits_conditional":  # its own section, not part of the default run
        return measure_digits_conditional(args)
    samplers = {}
    docs_dir = args.out or ROOT / "docs"
    table_path = (args.out or ROOT / "benchmarks" / "results") / "quality.md"
    runs_dir = args.runs or ((args.out / "runs") if args.out else ROOT / "benchmarks" / "runs")
    evaluate = {"digits": evaluate_digits, "toy2d": evaluate_toy}
    results = {}
    for name in [args.only] if args.only else list(RECIPES):
        if args.reuse is not None:
            ckpt, seconds = find_checkpoint(args.reuse, name), None
        else:
            ckpt, seconds = train(RECIPES[name], runs_dir, args.quick, log_dir=runs_dir)
        print(f"[{name}] evaluating {ckpt}", flush=True)
        results[name] = Result(name, seconds)
        num_samples = 64 if args.quick else RECIPES[name].num_samples
        samplers[name] = recipe_samplers(RECIPES[name], args.quick)
        sampling = Sampling(samplers[name], args.device, progress=not args.quick)
        evaluate[name](ckpt, num_samples, sampling, docs_dir, results[name])
    mode = (
        " QUICK MODE (tiny networks, 20 steps): plumbing only, targets not meaningful" if args.quick else ""
    )
    header = (
        f"## Sample quality ({provenance(args.device)}, {torch.get_num_threads()} threads, "
        f"sampling on {args.device}){mode}"
    )
    table = markdown(results, check_targets(results, samplers), header)
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(table + earlier_run(table_path, args.quick))
    print("\n" + table + f"\nwritten to {table_path}")
    return table


if __name__ == "__main__":
    main()
