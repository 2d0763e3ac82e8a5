"""The markdown table of benchmarks/speed.py: what one run measured, and the targets it is held to."""

import statistics
import time

import torch

from diffusion.training.callbacks.step_timer import device_name

PEER = "diffusers UNet2DModel, plain loop"
COMPILED = "plain loop, network compiled"
CIFAR_SHAPE = (3, 32, 32)


def fmt_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def paired_ratio(path, reference) -> tuple[float, float, float]:
    """Median, min and max over rounds of path's step time / reference's in the same round."""
    ratios = [a / b for a, b in zip(path.rounds, reference.rounds, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def utilisation(tflops: float, peak: float | None) -> str:
    return f"{tflops / peak:.1%}" if peak else "-"


def markdown(run) -> str:
    args, paths = run.args, run.paths
    plain = paths[1]
    quick = (
        " QUICK MODE (tiny UNet, a few steps): plumbing only, the numbers mean nothing" if args.quick else ""
    )
    peak = args.peak_tflops
    lines = [
        f"## Training and sampling speed ({time.strftime('%Y-%m-%d')}, {device_name(run.device)}, "
        f"torch {torch.__version__}){quick}",
        "",
        f"`{args.command}`",
        "",
        f"Recipe: `train.py {' '.join(run.cli_args) or '(configs/digits.yaml)'}`"
        f"{' with synthetic images' if args.synthetic else ''}; batch {run.batch}, {run.num_params:,} "
        f"parameters, precision {run.precision}; {len(paths)} paths interleaved, {args.rounds} rounds of "
        f"{args.warmup} warm-up + {args.steps} timed steps each. One training step's forward + backward: "
        f"{run.flops / 1e9:.1f} GFLOP ({run.flops / run.batch / 1e9:.2f} GFLOP per image, FlopCounterMode)"
        + (f"; utilisation against {peak:g} TFLOP/s (--peak_tflops)." if peak else "."),
        "",
        "| path | ms / step | training images / s | TFLOP/s | utilisation | vs plain loop (per-round range) "
        "| peak memory | graphs compiled (after warm-up) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for path in paths:
        ratio, low, high = paired_ratio(path, plain)
        tflops = run.flops / path.step_seconds / 1e12
        name = f"{path.name} ({path.note})" if path.note else path.name
        lines.append(
            f"| {name} | {path.step_seconds * 1000:.2f} | {run.batch / path.step_seconds:,.1f} | {tflops:.3g} "
            f"| {utilisation(tflops, peak)} | {ratio:.3f}x ({low:.3f}-{high:.3f}) "
            f"| {fmt_bytes(path.peak_bytes)} (+{fmt_bytes(path.peak_above_start)}) | - |"
        )
    for report in run.train_py:
        ratio = report["median_ms"] / 1000 / plain.step_seconds
        tflops = report["tflops_per_device"] or 0.0
        lines.append(
            f"| `{report['label']}` as users run it (StepTimer; {report['precision']}, "
            f"global batch {report['global_batch']}) | {report['median_ms']:.2f} | {report['images_per_s']:,.1f} "
            f"| {tflops:.3g} | {utilisation(tflops, peak)} | {ratio:.3f}x (unpaired) "
            f"| {fmt_bytes(report['peak_memory_bytes'])} | {report['graphs_compiled']} "
            f"({report['graphs_compiled_after_warmup']}) |"
        )
    for problem in run.problems:
        lines.append(f"| {problem} | | | | | | | |")
    memory = "CUDA max_memory_allocated" if run.device.type == "cuda" else "the process's peak RSS (VmHWM)"
    lines += [
        "",
        f"Interleaved paths: peak memory is {memory} while the path ran (+ above what was in use when it "
        "started: its steps' own memory; the models and data of all paths share the process). `train.py` rows: "
        f"a process of their own, median of {args.train_py_steps} optimizer steps after {args.train_py_warmup} "
        "warm-up ones by the StepTimer callback (progress bar, logger, checkpoints, the recipe's strategy and "
        "data loader included), its peak memory since the fit started. TFLOP/s: the counted FLOPs over the "
        "step time (the diffusers UNet has the same layers).",
    ]
    lines += loader_lines(run) + sampling_lines(run) + compile_lines(run) + target_lines(run)
    return "\n".join(lines) + "\n"


def loader_lines(run) -> list[str]:
    if run.loader is None:
        return []
    loader = run.loader
    return [
        "",
        f"Data loader alone ({loader['dataset']}: the recipe's training loader, {loader['num_workers']} workers, "
        f"batch {loader['batch_size']}, pin_memory {loader['pin_memory']}, no model): "
        f"**{loader['images_per_s']:,.0f} images / s** (median of {len(loader['per_pass'])} passes of "
        f"{loader['batches']} batches: {', '.join(f'{r:,.0f}' for r in loader['per_pass'])}).",
    ]


def sampling_lines(run) -> list[str]:
    if not run.sampling:
        return []
    lines = [
        "",
        "| sampling (per-sample seeds) | precision | batch | s / batch | images / s | 50,000 samples |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for measured in run.sampling:
        seconds = statistics.median(measured["seconds"])
        rate = measured["batch"] / seconds
        lines.append(
            f"| {measured['sampler']}-{measured['steps']} | {measured['precision']} | {measured['batch']} "
            f"| {seconds:.3f} | **{rate:,.1f}** | {50_000 / rate:,.0f} s |"
        )
    return lines


def compile_lines(run) -> list[str]:
    compiled = next((path for path in run.paths if path.name == COMPILED), None)
    plain = run.paths[1]
    if compiled is None or len(compiled.walls) < 2:
        return []
    extra = compiled.walls[0] - statistics.median(compiled.walls[1:])
    saved = plain.step_seconds - compiled.step_seconds
    if saved > 0:
        pays_off = f"saving {saved * 1000:.1f} ms a step, it pays for itself after {extra / saved:,.0f} steps"
    else:
        pays_off = f"costing {-saved * 1000:.1f} ms more a step, it never pays off"
    return [
        "",
        f"Compiling: the compiled path's first round took {extra:.0f} s longer than its later ones (Dynamo "
        f"and Inductor at its first steps); {pays_off} (against the plain loop).",
    ]


def target_lines(run) -> list[str]:
    args, project, plain = run.args, run.paths[0], run.paths[1]
    peer = next((path for path in run.paths if path.name == PEER), None)
    lines = ["", "| target | value | result |", "| --- | ---: | --- |"]

    def row(name: str, value: str, ok: bool) -> None:
        lines.append(f"| {name} | {value} | {'PASS' if ok else 'MISS'} |")

    tax = paired_ratio(project, plain)[0]
    row("framework tax: project / plain loop <= 1.03", f"{tax:.3f}", tax <= 1.03)
    if peer is not None:
        vs = paired_ratio(project, peer)[0]
        row("project / diffusers <= 0.8", f"{vs:.3f}", vs <= 0.8)
    goal = args.goal_images_per_s
    if goal:
        for report in run.train_py:
            rate = report["images_per_s"]
            row(f"`{report['label']}` >= {goal:,.0f} training images / s", f"{rate:,.0f}", rate >= goal)
        if run.loader is not None:
            rate = run.loader["images_per_s"]
            row(f"data loader >= 2 x {goal:,.0f} images / s", f"{rate:,.0f}", rate >= 2 * goal)
    if tuple(run.sample_shape) == CIFAR_SHAPE:
        for measured in run.sampling:
            seconds = 50_000 * statistics.median(measured["seconds"]) / measured["batch"]
            row(f"50,000 CIFAR-size samples, {measured['sampler']}-{measured['steps']} {measured['precision']}, "
                "<= 120 s", f"{seconds:,.0f} s", seconds <= 120)  # fmt: skip
    if run.job:
        base, here = (statistics.median(v) for v in run.job["seconds"].values())
        name = next(iter(run.job["seconds"]))
        whole = "" if args.job_steps else " to the end of each tree's own recipe"
        lines += [
            "",
            f"Default job, `train.py {' '.join(run.job['args'])}`{whole} (each a fresh process, alternating trees): "
            f"{name}: {base:.1f} s, this tree: {here:.1f} s, **{base / here:.2f}x faster** "
            f"(target 1.5x; each run: "
            + "; ".join(
                f"{tree} {', '.join(f'{x:.1f}' for x in xs)} s" for tree, xs in run.job["seconds"].items()
            )
            + ").",
        ]
    return lines
