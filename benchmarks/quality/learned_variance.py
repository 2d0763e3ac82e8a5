"""Learned variances against fixed ones on the digits recipe (Nichol & Dhariwal 2021's claim: a model that learns
its variance keeps its sample quality with few DDPM steps, and has a lower NLL).

    python benchmarks/quality/learned_variance.py               # train both digits runs, then measure (hours on 2 cores)
    python benchmarks/quality/learned_variance.py --fixed runs/digits/version_0 --learned runs/digits_learned/version_0
    python benchmarks/quality/learned_variance.py --quick --out /tmp/lv  # plumbing check in minutes; numbers are meaningless

Two runs of the digits recipe (`python train.py`), identical but for `--model.variance learned_range` in the
second. Each checkpoint's EMA weights are sampled with DDPM over 25, 50, 100 and 1000 respaced steps (per-sample
seed 0; the fixed model with its default sigma^2 = beta_t, and with beta~_t at the short runs; the learned model
with its own variance), and each sample set's FD 8x8 (benchmarks/quality/metrics_lib.py, as quality.py: 898 samples
against a fixed half of the real digits) is reported, with its ratio to the same model's DDPM-1000 FD. Then both
models' bits/dim on the 90 held-out digits (`python -m diffusion.evaluate --nll`'s computation, T = 1000 steps).

Every measurement is cached in OUT/learned_variance_cache.json as it finishes, so a run stopped half-way goes on
where it stopped (delete the file to measure again). Writes the table to benchmarks/results/learned_variance.md
(OUT/learned_variance.md with --out).
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

from benchmarks.arguments import existing, resolved
from benchmarks.provenance import provenance
from benchmarks.quality.metrics_lib import REFERENCE_SIZE, digits_split, frechet_distance, to_digit_features
from benchmarks.quality.train_run import run_training
from diffusion.cli.evaluate_nll import reverse_process_of, run_images
from diffusion.core.sampling import SamplingOptions
from diffusion.generation.ranks import generate
from diffusion.generation.render import to_uint8_images
from diffusion.metrics.bits_per_dim import BitsPerDim, image_bounds, quantize_to_8_bits
from diffusion.training.loading import load_checkpoint, model_hyperparameters
from diffusion.training.run_folders import latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import TINY_UNET  # noqa: E402 (the tiny network --quick shares with the tests)

QUICK = ["--max_steps", "20", "--model.warmup_steps", "1", "--trainer.enable_progress_bar", "false"]
MODELS = {"fixed": [], "learned": ["--model.variance", "learned_range"]}
STEPS = [25, 50, 100, 1000]
QUICK_STEPS = [5, 10, 20]
SHORT_RUNS_WITH_FIXEDSMALL = 100  # the fixed model is also sampled with beta~ up to this many steps
GOAL_STEPS, GOAL_RATIO = (
    50,
    1.3,
)  # the learned model's FD at 50 respaced steps within 1.3x of its DDPM-1000 FD


def checkpoint_of(path: Path, name: str) -> Path:
    """A .ckpt, a run folder (…/version_N) or a save dir holding <name>/version_N (the newest)."""
    if path.is_file():
        return path
    direct = path / "checkpoints" / "last.ckpt"
    return direct if direct.is_file() else latest_checkpoint(path, name)


def train(model: str, runs: Path, quick: bool) -> Path:
    name = f"digits_{model}"
    command = [sys.executable, "train.py", *MODELS[model], "--trainer.logger.init_args.save_dir", str(runs),
               "--trainer.logger.init_args.name", name, *(TINY_UNET + QUICK if quick else [])]  # fmt: skip
    seconds = run_training(command, runs / f"train_{name}.log", name)
    print(f"[{name}] trained in {seconds / 60:.1f} min", flush=True)
    return latest_checkpoint(runs, name)


class Cache:
    """Measurements by key in a JSON file, written after each one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.values = json.loads(path.read_text()) if path.is_file() else {}

    def get(self, key: str, measure, *args) -> dict:
        """The cached value of `key`, else `measure(*args)` (a dict), timed, cached and returned."""
        if key not in self.values:
            start = time.perf_counter()
            self.values[key] = {**measure(*args), "seconds": time.perf_counter() - start}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.values, indent=1))
        print(f"{key}: {self.values[key]}", flush=True)
        return self.values[key]


def fd_of(ckpt: Path, steps: int, variance: str | None, num_samples: int, device: str) -> dict:
    module = load_checkpoint(ckpt, map_location=device)
    reference = digits_split()[0]
    options = SamplingOptions(sampler="ddpm", steps=steps, variance=variance)
    samples = generate(
        module, num_samples, sampler=module.sampler(options), seed=0, batch_size=300, progress=True
    )
    features = to_digit_features(to_uint8_images(samples, module.normalization))
    return {"fd": frechet_distance(features, reference)}


def bpd_of(ckpt: Path, num_images: int | None, device: str) -> dict:
    module = load_checkpoint(ckpt, map_location=device)
    images, _, _ = run_images(str(ckpt), "val")
    images = quantize_to_8_bits(images[:num_images])
    process = reverse_process_of(module)  # as `python -m diffusion.evaluate --nll` by default
    bounds = image_bounds(module.network, module.schedule, process, images, batch_size=128, progress=True)
    return BitsPerDim.of(bounds).__dict__


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fixed", type=Path, help="the fixed-variance digits run (no training)")
    parser.add_argument("--learned", type=Path, help="the learned-variance digits run (no training)")
    parser.add_argument(
        "--quick", action="store_true", help="tiny networks, 20 steps, 64 samples: plumbing only"
    )
    parser.add_argument(
        "--out", type=Path, help="table, cache and runs here (default with --quick: a temp dir)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--num_samples", type=int, default=REFERENCE_SIZE, help="samples per row (FD rises as they fall)"
    )
    args = parser.parse_args(argv)
    for model in MODELS:  # the given runs' checkpoints, before any time is spent
        flag, given = f"--{model}", getattr(args, model)
        if given is not None:
            existing(parser, flag, given, "a digits run folder (runs/NAME/version_N), a save dir or a .ckpt")
            name = f"digits_{model}"
            resolved(
                parser, flag, given, lambda path, name=name: model_hyperparameters(checkpoint_of(path, name))
            )
    if args.quick and args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="learned_variance_"))
    out = args.out or ROOT / "benchmarks" / "results"
    runs = (args.out or ROOT / "benchmarks") / "runs"
    cache = Cache((args.out or runs) / "learned_variance_cache.json")
    num_samples, steps = (64, QUICK_STEPS) if args.quick else (args.num_samples, STEPS)
    given = {"fixed": args.fixed, "learned": args.learned}
    checkpoints = {
        model: checkpoint_of(given[model], f"digits_{model}")
        if given[model]
        else train(model, runs, args.quick)
        for model in MODELS
    }
    rows = []  # (model, sampler variance, steps, FD, seconds)
    for model, ckpt in checkpoints.items():
        variances = ["learned_range"] if model == "learned" else ["fixedlarge", "fixedsmall"]
        for variance in variances:
            for n in steps:
                if variance == "fixedsmall" and n > SHORT_RUNS_WITH_FIXEDSMALL:
                    continue
                value = cache.get(
                    f"{model}/{variance}/{n}", fd_of, ckpt, n, variance, num_samples, args.device
                )
                rows.append((model, variance, n, value["fd"], value["seconds"]))
    bpd = {
        model: cache.get(f"{model}/bpd", bpd_of, ckpt, 8 if args.quick else None, args.device)
        for model, ckpt in checkpoints.items()
    }
    text = markdown(rows, bpd, checkpoints, steps, args.quick, num_samples, args.device)
    out.mkdir(parents=True, exist_ok=True)
    (out / "learned_variance.md").write_text(text)
    print(text)
    return text


def markdown(
    rows: list, bpd: dict, checkpoints: dict, steps: list[int], quick: bool, num_samples: int, device: str
) -> str:
    full = {(model, variance): fd for model, variance, n, fd, _ in rows if n == steps[-1]}
    lines = [
        f"## Learned variances on the digits ({provenance(device)}{', --quick: meaningless numbers' if quick else ''})",
        "",
        "Checkpoints: " + ", ".join(f"{model} `{ckpt}`" for model, ckpt in checkpoints.items()) + ".",
        f"{num_samples} samples per row (per-sample seed 0) against {REFERENCE_SIZE} real digits, FD in 8x8 pixels.",
        "",
        f"| model | DDPM sigma^2 | steps | FD 8x8 | FD / same sigma^2's FD at {steps[-1]} | sampling time |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for model, variance, n, fd, seconds in rows:
        base = full.get((model, variance))
        ratio = f"{fd / base:.2f}" if base else "-"
        lines.append(f"| {model} | {variance} | {n} | {fd:.2f} | {ratio} | {seconds / 60:.1f} min |")
    lines += ["", "| model | bits/dim (held-out digits) | prior L_T | decoder L_0 | KL terms | images |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for model, value in bpd.items():
        lines.append(
            f"| {model} | {value['bits_per_dim']:.4f} ± {value['standard_error']:.4f} | {value['prior']:.2g} | "
            f"{value['decoder']:.4f} | {value['kl']:.4f} | {value['num_images']} |"
        )
    goal_steps = GOAL_STEPS if GOAL_STEPS in steps else steps[1]
    learned = {n: fd for model, _, n, fd, _ in rows if model == "learned"}
    fd_goal = learned[goal_steps] <= GOAL_RATIO * learned[steps[-1]]
    nll_goal = bpd["learned"]["bits_per_dim"] < bpd["fixed"]["bits_per_dim"]
    lines += [
        "", "| goal | result |", "| --- | --- |",
        f"| learned: FD at {goal_steps} steps ({learned[goal_steps]:.2f}) within {GOAL_RATIO}x of its FD at "
        f"{steps[-1]} ({learned[steps[-1]]:.2f}) | {'PASS' if fd_goal else 'MISS'} |",
        f"| learned bits/dim ({bpd['learned']['bits_per_dim']:.4f}) below fixed ({bpd['fixed']['bits_per_dim']:.4f})"
        f" | {'PASS' if nll_goal else 'MISS'} |",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
