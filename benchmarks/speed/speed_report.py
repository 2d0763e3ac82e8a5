"""The markdown table of benchmarks/speed/speed.py: what one run measured, and the targets it is held to."""

import statistics

from benchmarks.provenance import provenance

PROJECT = "project: Lightning Trainer + EMA callback"
PLAIN = "plain loop, same module"
COMPILED = "plain loop, network compiled"
COMPILED_PLAINLY = "plain loop, network compiled plainly"
COMPILED_CHANNELS_LAST = "plain loop, network compiled NHWC"
PEER = "diffusers UNet2DModel, plain loop"
CIFAR_SHAPE = (3, 32, 32)
# train.py against the fastest plain loop of the same network and options, and against diffusers' loop.
WITHIN_PLAIN, TIMES_PEER = 1.05, 3.0
# The GPU runs kernels at least this share of a train.py step; a warm compile (the cache filled) takes at most this.
GPU_BUSY, WARM_COMPILE_SECONDS = 0.9, 30.0
# Issue 25's goals for 50,000 CIFAR-size samples on one H200, in seconds: DDIM-50 and DPM-Solver++(2M) SDE-20.
SAMPLING_GOALS = {("ddim", 50): 100, ("dpmpp_2m_sde", 20): 40}


def fmt_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def paired_ratio(path, reference) -> tuple[float, float, float]:
    """Median, min and max over rounds of path's step time / reference's in the same round."""
    ratios = [a / b for a, b in zip(path.rounds, reference.rounds, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def utilisation(tflops: float, peak: float | None) -> str:
    return f"{tflops / peak:.1%}" if peak else "-"


def measured(run, name: str):
    """The interleaved path of that name, once it has timed steps (None before, or when it is not run)."""
    return next((path for path in run.paths if path.name == name and path.times), None)


def recipe_report(run) -> dict | None:
    """The StepTimer report of train.py as the recipe is (no variant flags)."""
    return next((report for report in run.train_py if report["label"] == "train.py"), None)


def markdown(run) -> str:
    args = run.args
    paths = [path for path in run.paths if path.times]
    plain = measured(run, PLAIN)
    quick = (
        " QUICK MODE (tiny UNet, a few steps): plumbing only, the numbers mean nothing" if args.quick else ""
    )
    peak = args.peak_tflops
    lines = [
        f"## Training and sampling speed ({provenance(run.device)}){quick}",
        "",
        f"`{args.command}`",
        "",
        f"Recipe: `train.py {' '.join(run.cli_args) or '(configs/digits.yaml)'}`"
        f"{' with synthetic images' if args.synthetic else ''}; batch {run.batch}, {run.num_params:,} "
        f"parameters, precision {run.precision}; {len(run.paths)} paths interleaved, {args.rounds} rounds of "
        f"{args.warmup} warm-up + {args.steps} timed steps each. One training step's forward + backward: "
        f"{run.flops / 1e9:.1f} GFLOP ({run.flops / run.batch / 1e9:.2f} GFLOP per image, FlopCounterMode)"
        + (f"; utilisation against {peak:g} TFLOP/s (--peak_tflops)." if peak else "."),
        "",
        "| path | ms / step | training images / s | TFLOP/s | utilisation | vs plain loop (per-round range) "
        "| peak memory | graphs compiled (after warm-up) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for path in paths:
        ratio = "{:.3f}x ({:.3f}-{:.3f})".format(*paired_ratio(path, plain)) if plain else "-"
        tflops = run.flops / path.step_seconds / 1e12
        name = f"{path.name} ({path.note})" if path.note else path.name
        lines.append(
            f"| {name} | {path.step_seconds * 1000:.2f} | {run.batch / path.step_seconds:,.1f} | {tflops:.3g} "
            f"| {utilisation(tflops, peak)} | {ratio} "
            f"| {fmt_bytes(path.peak_bytes)} (+{fmt_bytes(path.peak_above_start)}) | - |"
        )
    for report in run.train_py:
        ratio = f"{report['median_ms'] / 1000 / plain.step_seconds:.3f}x (unpaired)" if plain else "-"
        tflops = report["tflops_per_device"] or 0.0
        lines.append(
            f"| `{report['label']}` as users run it (StepTimer; {report['precision']}, "
            f"global batch {report['global_batch']}) | {report['median_ms']:.2f} | {report['images_per_s']:,.1f} "
            f"| {tflops:.3g} | {utilisation(tflops, peak)} | {ratio} "
            f"| {fmt_bytes(report['peak_memory_bytes'])} | {report['graphs_compiled']} "
            f"({report['graphs_compiled_after_warmup']}) |"
        )
    for problem in [*run.problems, *run.skipped]:
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
    lines += profile_lines(run) + loader_lines(run) + sampling_lines(run) + compile_lines(run)
    lines += target_lines(run)
    return "\n".join(lines) + "\n"


def compile_seconds(report: dict) -> float | None:
    """A train.py run's compiling: its warm-up's seconds less what its warm-up steps take once compiled."""
    if report.get("warmup_seconds") is None:
        return None
    return max(0.0, report["warmup_seconds"] - report["warmup_steps"] * report["median_ms"] / 1000)


def profile_lines(run) -> list[str]:
    """Where the GPU's time goes (--profile_steps): train.py's StepTimer profiles and the interleaved paths'."""
    rows = [(f"`{r['label']}`", r.get("profile")) for r in run.train_py]
    rows += [(path.name, path.profile) for path in run.paths]
    rows = [(name, profile) for name, profile in rows if profile]
    compiles = [(r["label"], compile_seconds(r)) for r in run.train_py if compile_seconds(r) is not None]
    lines = []
    if compiles:
        lines += ["", "Warm-up of each `train.py` run less its steps' own time (compiling, CUDA graph recording, "
                  "cuDNN's first calls): " + "; ".join(f"`{label}` {s:.1f} s" for label, s in compiles) + "."]  # fmt: skip
    if not rows:
        return lines
    lines += [
        "",
        "Where the GPU's time goes (torch.profiler over the profiled steps; busy: kernel time over wall time, the "
        "rest the GPU waited):",
        "",
        "| path | wall ms / step | kernel ms / step | GPU busy | kernels / step | largest kinds (share of kernel time) |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, profile in rows:
        kinds = ", ".join(f"{kind} {share:.1%}" for kind, share, _ in profile["kinds"][:5])
        lines.append(
            f"| {name} | {profile['wall_ms_per_step']:.2f} | {profile['kernel_ms_per_step']:.2f} "
            f"| {profile['busy']:.1%} | {profile['kernels_per_step']:,.0f} | {kinds} |"
        )
    recipe = recipe_report(run)
    if recipe and recipe.get("profile"):
        lines += [
            "",
            f"Top kernels of `{recipe['label']}`:",
            "",
            "| kernel | share of kernel time |",
            "| --- | ---: |",
        ]
        lines += [f"| `{name}` | {share:.1%} |" for name, share in recipe["profile"]["top"]]
    return lines


def loader_lines(run) -> list[str]:
    if run.loader is None:
        return []
    loader = run.loader
    return [
        "",
        f"Data path alone ({loader['dataset']}: {how_batches_are_made(loader)}, batch {loader['batch_size']}, "
        "no model): "
        f"**{loader['images_per_s']:,.0f} images / s** (median of {len(loader['per_pass'])} passes of "
        f"{loader['batches']} batches: {', '.join(f'{r:,.0f}' for r in loader['per_pass'])}).",
    ]


def how_batches_are_made(loader: dict) -> str:
    """The data path a measure took: held on the device (speed_data.on_device_throughput) or the loader's."""
    if "num_workers" not in loader:
        return f"the training data {loader['path']}"
    return f"the recipe's training loader, {loader['num_workers']} workers, pin_memory {loader['pin_memory']}"


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
            f"| {sampling_name(measured)} | {measured['precision']} | {measured['batch']} "
            f"| {seconds:.3f} | **{rate:,.1f}** | {50_000 / rate:,.0f} s |"
        )
    compiled = [measured for measured in run.sampling if measured.get("compile")]
    if compiled:
        firsts = ", ".join(
            f"{sampling_name(m)} {m['precision']} {m['first_seconds']:.1f} s" for m in compiled
        )
        lines += [
            "",
            f"Compiled sampling: each step's evaluation one graph (CUDA graphs on CUDA); the first batch, "
            f"which compiles: {firsts}.",
        ]
    return lines


def sampling_name(measured: dict) -> str:
    """e.g. 'ddim-50', 'heun-18 (35 evaluations)', 'dpmpp_2m_sde-20 compiled'."""
    name = f"{measured['sampler']}-{measured['steps']}"
    if measured.get("evaluations", measured["steps"]) != measured["steps"]:
        name += f" ({measured['evaluations']} evaluations)"
    return name + (" compiled" if measured.get("compile") else "")


def compile_lines(run) -> list[str]:
    compiled, plain = measured(run, COMPILED), measured(run, PLAIN)
    if compiled is None or plain is None or len(compiled.walls) < 2:
        return []
    extra = compiled.walls[0] - statistics.median(compiled.walls[1:])
    saved = plain.step_seconds - compiled.step_seconds
    if extra <= 0:
        first = (
            "the compiled path's first round took no longer than its later ones (its graphs came from Inductor's "
            "cache, or compiling took less than the rounds vary)"
        )
        return [
            "",
            f"Compiling: {first}; a compiled step takes {-saved * 1000:+.1f} ms against the plain loop's.",
        ]
    if saved > 0:
        pays_off = f"saving {saved * 1000:.1f} ms a step, it pays for itself after {extra / saved:,.0f} steps"
    else:
        pays_off = f"costing {-saved * 1000:.1f} ms more a step, it never pays off"
    return [
        "",
        f"Compiling: the compiled path's first round took {extra:.0f} s longer than its later ones (Dynamo "
        f"and Inductor at its first steps); {pays_off} (against the plain loop).",
    ]


def targets(run) -> list[dict]:
    """Each target the run can be held to, as {"target", "value", "pass"}: the table's rows and speed.json's."""
    args, found = run.args, []
    project, plain, peer = measured(run, PROJECT), measured(run, PLAIN), measured(run, PEER)

    def add(target: str, value: str, ok: bool) -> None:
        found.append({"target": target, "value": value, "pass": bool(ok)})

    if project and plain:
        tax = paired_ratio(project, plain)[0]
        add("framework tax: project / plain loop <= 1.03", f"{tax:.3f}", tax <= 1.03)
    if project and peer:
        vs = paired_ratio(project, peer)[0]
        add("project / diffusers <= 0.8", f"{vs:.3f}", vs <= 0.8)
    recipe, goal = recipe_report(run), args.goal_images_per_s
    if recipe is not None:
        rate, step = recipe["images_per_s"], recipe["median_ms"] / 1000
        if goal:
            add(f"`train.py` >= {goal:,.0f} training images / s", f"{rate:,.0f}", rate >= goal)
        if peer:
            times = rate / (run.batch / peer.step_seconds)
            add(
                f"`train.py` >= {TIMES_PEER:g} x diffusers' plain loop (images / s)",
                f"{times:.2f}x",
                times >= TIMES_PEER,
            )
        others = (COMPILED, COMPILED_CHANNELS_LAST, COMPILED_PLAINLY)
        plains = [path for path in (plain, *(measured(run, name) for name in others)) if path]
        if plains:
            best = min(plains, key=lambda path: path.step_seconds)
            ratio = step / best.step_seconds
            add(f"`train.py` step <= {WITHIN_PLAIN:g} x the best plain loop's ({best.name})", f"{ratio:.3f}x",
                ratio <= WITHIN_PLAIN)  # fmt: skip
    if recipe is not None and recipe.get("profile"):
        busy = recipe["profile"]["busy"]
        add(f"GPU busy >= {GPU_BUSY:.0%} of a `train.py` step", f"{busy:.1%}", busy >= GPU_BUSY)
    warm = next(
        (r for r in run.train_py if r["label"] == "train.py" and getattr(args, "cold_compile", False)), None
    )
    if warm is not None and compile_seconds(warm) is not None:
        seconds = compile_seconds(warm)
        add(
            f"warm compile <= {WARM_COMPILE_SECONDS:g} s", f"{seconds:.1f} s", seconds <= WARM_COMPILE_SECONDS
        )
    if run.loader is not None and (goal or recipe):
        # Twice what training takes: the goal's, or what train.py measured if it is faster.
        training = max(goal or 0, recipe["images_per_s"] if recipe else 0)
        rate = run.loader["images_per_s"]
        add(f"data path >= 2 x {training:,.0f} images / s", f"{rate:,.0f}", rate >= 2 * training)
    if tuple(run.sample_shape) == CIFAR_SHAPE:
        for sampled in run.sampling:
            goal = SAMPLING_GOALS.get((sampled["sampler"], sampled["steps"]))
            if goal is None:
                continue
            seconds = 50_000 * statistics.median(sampled["seconds"]) / sampled["batch"]
            add(f"50,000 CIFAR-size samples, {sampling_name(sampled)} {sampled['precision']}, "
                f"<= {goal} s", f"{seconds:,.0f} s", seconds <= goal)  # fmt: skip
    return found


def target_lines(run) -> list[str]:
    args = run.args
    lines = ["", "| target | value | result |", "| --- | ---: | --- |"]
    lines += [f"| {t['target']} | {t['value']} | {'PASS' if t['pass'] else 'MISS'} |" for t in targets(run)]
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
