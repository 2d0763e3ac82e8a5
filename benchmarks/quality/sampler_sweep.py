"""Sample quality against cost for every registered sampler: the digits' Fréchet distance in 8x8 pixel space (the
quality benchmark's protocol, benchmarks/quality/metrics_lib.py) against network evaluations, on one checkpoint.

    python benchmarks/quality/sampler_sweep.py --run runs/digits/version_0 --evaluations 10,15,20,25,35,50,100 \
        --reference ddpm:1000                                                       # the README's figure
    python benchmarks/quality/sampler_sweep.py --run runs/digits_conditional/version_0 --evaluations 10,15,20,25,35
                                                        # at the recipe's guidance: ..._digits_conditional.md
    python benchmarks/quality/sampler_sweep.py --quick --out /tmp/sweep            # plumbing, tiny, a minute

Evaluations are counted, not assumed: each sampler runs once on one sample at two step counts while its network
calls are counted, which gives its evaluations per step (Heun's second order takes two but the last), and the step
count for each target in `--evaluations` is then chosen from that. A batched classifier-free-guidance call (the
conditional and unconditional halves in one forward) counts as one evaluation of a doubled batch. Every row uses
the same per-sample seeds (sample i's noise depends on i only), so the samplers differ by their steps alone.

Outputs: `benchmarks/results/sampler_sweep[_<run name>].md` (the table and, per sampler, the best FD at 20-35
evaluations) and `docs/sampler_sweep[_<run name>].png`, or both under `--out`.
"""

import argparse
import re
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
from diffusion.data.labels import class_labels  # noqa: E402
from diffusion.generation.ranks import generate  # noqa: E402
from diffusion.generation.render import to_uint8_images  # noqa: E402
from diffusion.training.loading import load_checkpoint, model_hyperparameters  # noqa: E402
from diffusion.training.run_folders import latest_checkpoint  # noqa: E402

EVALUATIONS = (10, 15, 20, 25, 35, 50, 100, 250, 1000)
DEFAULT_WINDOW = (20, 35)  # the recipe's default sampler: the best FD in this range of evaluations


class CountingNetwork(torch.nn.Module):
    """The network, counting its calls; its class count shown as the network's (the module reads it there)."""

    def __init__(self, network: torch.nn.Module) -> None:
        super().__init__()
        self.network, self.calls = network, 0
        self.num_classes = getattr(network, "num_classes", None)

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.network(*args, **kwargs)


def evaluations_of(module, sampler: str, steps: int, labels) -> int:
    """Network calls of one sample drawn by `sampler` in `steps` steps."""
    counting = CountingNetwork(module.network)
    network, module.network = module.network, counting
    try:
        chosen = module.sampler(SamplingOptions(sampler=sampler, steps=steps))
        generate(module, 1, sampler=chosen, labels=None if labels is None else labels[:1])  # sample 0's label
    finally:
        module.network = network
    return counting.calls


def steps_for(module, sampler: str, targets, labels) -> dict[int, int]:
    """{evaluations: steps} for each target a sampler can reach within the schedule's T steps (its count is
    linear in the steps: measured at 2 and 3)."""
    at_two, at_three = (evaluations_of(module, sampler, steps, labels) for steps in (2, 3))
    per_step, offset = at_three - at_two, at_two - 2 * (at_three - at_two)
    found = {}
    for target in targets:
        steps = max(1, round((target - offset) / per_step))
        if steps <= module.schedule.num_timesteps:
            found[per_step * steps + offset] = steps
    return found


def sweep(args: argparse.Namespace, written=lambda table, floor, what: None) -> tuple[dict, float, str]:
    """The table {sampler: {evaluations: FD}}, the real data's floor and what was sampled; `written` gets them
    after every row (a sweep stopped early keeps what it measured)."""
    ckpt = checkpoint_of(args.run, args.name)
    module = load_checkpoint(ckpt, weights="ema", map_location=args.device)
    reference, _, other, _ = digits_split()
    floor = frechet_distance(other[: args.num_samples], reference)
    labels = class_labels(args.num_samples, module.num_classes) if module.num_classes else None
    guidance = f", guidance {module.sampling.guidance_scale}" if labels is not None else ""
    what = f"{ckpt} (EMA weights), {args.num_samples} samples{guidance}"
    samplers = args.samplers or list(SAMPLERS)
    runs = [(sampler, args.evaluations) for sampler in samplers]
    if args.reference:  # one long run as the others' limit, e.g. ddpm:1000
        name, count = args.reference.split(":")
        runs.append((name, [int(count)]))
    table: dict[str, dict[int, float]] = {}
    for sampler, targets in runs:
        table.setdefault(sampler, {})
        for evaluations, steps in steps_for(module, sampler, targets, labels).items():
            start = time.perf_counter()
            chosen = module.sampler(SamplingOptions(sampler=sampler, steps=steps))
            samples = generate(module, args.num_samples, sampler=chosen, seed=0, batch_size=args.batch_size,
                               labels=labels)  # fmt: skip
            features = to_digit_features(to_uint8_images(samples, module.normalization))
            table[sampler][evaluations] = frechet_distance(features, reference)
            print(f"{sampler} {steps} steps = {evaluations} evaluations: FD {table[sampler][evaluations]:.2f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
            written(table, floor, what)
    return table, floor, what


def checkpoint_of(run: Path, name: str) -> Path:
    """--run's checkpoint: a run folder's last.ckpt, the newest of `name`'s runs under a save dir, or a .ckpt."""
    ckpt = run / "checkpoints" / "last.ckpt" if (run / "checkpoints").is_dir() else Path(run)
    return latest_checkpoint(ckpt, name) if ckpt.is_dir() else ckpt


def markdown(table: dict, floor: float, what: str) -> str:
    columns = sorted({evaluations for row in table.values() for evaluations in row})
    lines = [f"# FD 8x8 of the digits against network evaluations\n\n({provenance()})\n\n{what}; real data's floor: "
             f"{floor:.2f}.\n",
             "| sampler | " + " | ".join(str(c) for c in columns) + " |",
             "| --- |" + " ---: |" * len(columns)]  # fmt: skip
    for sampler, row in table.items():
        lines.append(
            f"| {sampler} | " + " | ".join(f"{row[c]:.2f}" if c in row else "-" for c in columns) + " |"
        )
    low, high = DEFAULT_WINDOW
    best = {s: min((fd, e) for e, fd in row.items() if low <= e <= high) for s, row in table.items()
            if any(low <= e <= high for e in row)}  # fmt: skip
    if best:
        winner = min(best, key=lambda s: best[s][0])
        lines += ["", f"Best FD at {low}-{high} evaluations: " + "; ".join(
            f"{s} {fd:.2f} ({e})" for s, (fd, e) in sorted(best.items(), key=lambda kv: kv[1][0])
        ) + f". The recipe's default sampler should be **{winner}**."]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(table: dict, floor: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    figure = Figure(figsize=(6.4, 4), dpi=100, layout="constrained")
    axes = figure.subplots()
    for sampler, row in table.items():
        evaluations = sorted(row)
        axes.plot(
            evaluations, [row[e] for e in evaluations], "o-", label=sampler, markersize=3, linewidth=1.2
        )
    axes.axhline(floor, color="gray", linestyle="--", linewidth=1, label="real data (floor)")
    axes.set(xscale="log", yscale="log", xlabel="network evaluations", ylabel="FD, 8x8 pixels", title=title)
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 20, not 2x10^1
    # Between the decades only 2s and 5s (20, 50, 200, 500): every minor tick's label would run together.
    sparse = FuncFormatter(lambda value, _: f"{value:g}" if f"{value:g}"[0] in "25" else "")
    axes.xaxis.set_major_formatter(plain)
    axes.xaxis.set_minor_formatter(sparse)
    axes.yaxis.set_major_formatter(plain)
    axes.yaxis.set_minor_formatter(plain)
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8)
    figure.savefig(path)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a run folder, a save dir holding --name's runs, or a .ckpt")
    parser.add_argument("--name", help="the run name under a save dir (digits); names the outputs (default: the "
                        "run folder's name, runs/NAME/version_N)")  # fmt: skip
    parser.add_argument("--samplers", nargs="+", default=[], action=list_of(str, "ddim,dpmpp_2m", SAMPLERS),
                        help="comma-separated; default every registered sampler")  # fmt: skip
    parser.add_argument("--evaluations", nargs="+", default=list(EVALUATIONS), action=list_of(int, "10,20,35"),
                        help="comma-separated network evaluations per sample")  # fmt: skip
    parser.add_argument(
        "--reference",
        default="",
        help="SAMPLER:EVALUATIONS run for one sampler only, e.g. "
        "ddpm:1000 (a long run is the others' limit; at 1,000 evaluations for every sampler the "
        "sweep would take hours on a CPU)",
    )
    parser.add_argument("--num_samples", type=int, default=REFERENCE_SIZE)
    parser.add_argument("--batch_size", type=int, default=300)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, help="write the table and plot here instead of the repository")
    parser.add_argument("--quick", action="store_true", help="a tiny run trained here, few evaluations")
    args = parser.parse_args(argv)
    sampler, _, count = args.reference.partition(":")
    if args.reference and (sampler not in SAMPLERS or not count.isdigit() or int(count) < 1):
        parser.error(
            f"--reference {args.reference}: not SAMPLER:EVALUATIONS — pass e.g. --reference ddpm:1000"
        )
    if args.quick:
        from helpers import tiny_run  # tests/helpers: the tests' tiny UNet

        args.out = args.out or Path("/tmp/sampler_sweep")
        tiny_run(args.out / "runs", "--trainer.enable_progress_bar", "false")
        args.run, args.evaluations, args.num_samples = args.out / "runs" / "digits" / "version_0", [4, 8], 40
    if args.run is None:
        parser.error("--run is required (or --quick)")
    existing(
        parser,
        "--run",
        args.run,
        "a run folder (runs/NAME/version_N), a save dir of --name's runs, or a .ckpt",
    )
    # A run folder names its outputs: the conditional recipe's sweep does not overwrite the default recipe's.
    in_run = (args.run / "checkpoints").is_dir()
    name = args.name or (args.run.resolve().parent.name if in_run else "digits")
    args.name = args.name or "digits"  # the runs looked for under a save dir
    resolved(parser, "--run", args.run, lambda run: model_hyperparameters(checkpoint_of(run, args.name)))
    suffix = "" if name == "digits" else f"_{name}"
    results = args.out or ROOT / "benchmarks" / "results"
    figures = args.out or ROOT / "docs"
    results.mkdir(parents=True, exist_ok=True)

    def write(table: dict, floor: float, what: str) -> str:
        text = markdown(table, floor, what)
        (results / f"sampler_sweep{suffix}.md").write_text(text)
        guidance = re.search(r", (guidance [\d.]+)", what)  # as sweep() says it
        title = f"{name}{f' at {guidance[1]}' if guidance else ''}: FD against cost"
        plot(table, floor, figures / f"sampler_sweep{suffix}.png", title)
        return text

    text = write(*sweep(args, written=write))
    print(text)
    return text


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    main()
