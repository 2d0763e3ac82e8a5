"""Prepared data sets against the image folder: training images/s of each way a batch reaches training, per loading
process, and `prepare`'s own rate.

    python benchmarks/speed/prepared_data.py                      # 32, 64 and 256 px: about 4 minutes on 2 cores
    python benchmarks/speed/prepared_data.py --sizes 32 --out /tmp/prepared_data.md

Synthetic stand-ins for CelebA: 178x218 RGB (its aligned crops) for sizes up to 178 px, 512x512 above (never
upsampled), each a bicubic upsampling of 1/8-resolution noise plus a little grain (seed 0), so PNG and JPEG files have
realistic sizes; written once as PNG, once as JPEG (quality 90). Each path is epochs of `training_batches("cpu")`, as
the Trainer gets them (flips on, as configs/folder.yaml):

- folder: ImageDataModule(dataset="folder", on_device=False, num_workers=0): decode, resize, crop image by image;
- prepare: the JPEG folder prepared (`diffusion.data.preparing.prepare`, --prepare_workers processes): images over
  its wall time, litdata's start-up included;
- streamed: that set read by litdata (`on_device=False`) in the training process, default encoding (raw up to 64 px,
  png above) and from --all_encodings_from px the others too; at the smallest size also in each of --workers loading
  processes (their total);
- held: the set read whole once and held on the device, here the CPU (`on_device=True`).

Timing: a warm-up epoch, then --passes passes, each of as many epochs as make --min_seconds of timed batches: in each
the clock starts once its first 1 + 2W batches are in (W loading processes: their start-up and prefetch, paid once an
epoch; an epoch here is --images images) and stops at its last. Figures: the median of the passes' images/s.
"""

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository root

from benchmarks.arguments import list_of
from benchmarks.provenance import provenance
from diffusion.data.images import ImageDataModule
from diffusion.data.prepared import RAW_UP_TO
from diffusion.data.preparing import prepare

CELEBA, LARGE = (178, 218), (512, 512)  # width x height of the sources up to 178 px, and above
TOTAL_TARGET = (32, 16_000, 4)  # at 32 px, 16,000 images/s from at most 4 loading processes
RATIO_TARGET = (64, 10.0)  # at 64 px, streamed >= 10x the folder loader per process
KINDS = ("png", "jpeg")  # the folders' files


@dataclass
class Plan:
    """What to measure: the benchmark's flags (`parse_args`), or a test's tiny run."""

    sizes: list[int]
    images: int = 2000  # sources up to 178 px
    large_images: int = 500  # sources above
    batch_size: int = 128
    passes: int = 3
    min_seconds: float = 1.0
    workers: list[int] = field(default_factory=lambda: [2, 4])
    prepare_workers: int = 2
    all_encodings_from: int = 256
    small_source: tuple[int, int] = CELEBA

    def source(self, size: int) -> tuple[tuple[int, int], int]:
        """(width, height) of the source images of `size`, and how many there are."""
        small = size <= min(self.small_source)
        return (self.small_source, self.images) if small else (LARGE, self.large_images)

    def encodings(self, size: int) -> list[str]:
        """The prepared sets streamed at `size`: the default encoding first."""
        default = "raw" if size <= RAW_UP_TO else "png"
        others = [encoding for encoding in ("raw", "png", "jpeg") if encoding != default]
        return [default, *others] if size >= self.all_encodings_from else [default]


def make_sources(folder: Path, shape: tuple[int, int], count: int, seed: int = 0) -> dict[str, float]:
    """`count` smooth random RGB images of `shape` (width, height) as PNG under folder/png and as JPEG under
    folder/jpeg; returns each format's mean file size in kB."""
    from PIL import Image

    width, height = shape
    rng, total = np.random.default_rng(seed), dict.fromkeys(KINDS, 0)
    for kind in total:
        (folder / kind).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        low = rng.integers(0, 256, (max(1, height // 8), max(1, width // 8), 3), dtype=np.uint8)
        smooth = np.asarray(Image.fromarray(low).resize((width, height), Image.BICUBIC), dtype=np.int16)
        image = Image.fromarray((smooth + rng.integers(-3, 4, smooth.shape)).clip(0, 255).astype(np.uint8))
        for kind, suffix in (("png", "png"), ("jpeg", "jpg")):
            path = folder / kind / f"{i:05d}.{suffix}"
            image.save(path, quality=90)  # PNG ignores the quality
            total[kind] += path.stat().st_size
    return {kind: nbytes / count / 1e3 for kind, nbytes in total.items()}


def timed_epoch(datamodule: ImageDataModule, skip: int) -> tuple[int, int, float, tuple[int, ...]]:
    """One epoch of training batches on the CPU: (its images, the images timed, their seconds, a batch's x shape),
    the clock started once `skip` batches are in (fewer where the epoch is short: one batch at least is timed)."""
    stamps, counts, shape = [], [], ()
    for batch in datamodule.training_batches("cpu"):
        counts.append(len(batch.x))
        shape = tuple(batch.x.shape[1:])
        stamps.append(time.perf_counter())
    if len(stamps) < 2:
        raise ValueError(f"an epoch of {len(stamps)} batch(es): pass more images or a smaller batch size")
    skip = max(1, min(skip, len(stamps) - 1))
    return sum(counts), sum(counts[skip:]), stamps[-1] - stamps[skip - 1], shape


def throughput(datamodule: ImageDataModule, workers: int, plan: Plan) -> dict:
    """The median over `plan.passes` of images/s, after a warm-up epoch (the held set read, lazy set-ups)."""
    skip = 1 + 2 * workers
    timed_epoch(datamodule, skip)
    rates, epochs, shape = [], set(), ()
    for _ in range(plan.passes):
        images = seconds = 0.0
        while seconds == 0 or seconds < plan.min_seconds:
            epoch_images, timed, taken, shape = timed_epoch(datamodule, skip)
            epochs.add(epoch_images)
            images, seconds = images + timed, seconds + taken
        rates.append(images / seconds)
    return {"images_per_s": statistics.median(rates), "per_pass": rates, "epoch_images": sorted(epochs),
            "shape": shape, "data_path": datamodule.data_path}  # fmt: skip


def loader(root: Path, plan: Plan, **kwargs) -> ImageDataModule:
    return ImageDataModule(
        root=str(root), batch_size=plan.batch_size, random_flip=True, val_fraction=0, **kwargs
    )


def run(plan: Plan, work: Path, log=print) -> list[dict]:
    """Every path at every size of `plan`, its sources and prepared sets under `work`: a row (dict) each, with what
    was measured: `stored` (how, kB per image), `workers`, `images_per_s`, `per_process`, `epoch_images`."""
    rows, made = [], {}

    def add(size: int, path: str, encoding: str, stored: str, workers: int, measured: dict) -> None:
        rate = measured["images_per_s"]
        rows.append({"size": size, "path": path, "encoding": encoding, "stored": stored, "workers": workers,
                     "per_process": rate / max(1, workers), "per_pass": [rate], **measured})  # fmt: skip
        log(f"{size} px, {path}, {stored}, {workers} processes: {rate:,.0f} images/s")

    for size in plan.sizes:
        (width, height), count = plan.source(size)
        sources = work / f"sources_{width}x{height}"
        if sources not in made:
            log(f"making {count:,} {width}x{height} images, PNG and JPEG, in {sources}")
            made[sources] = make_sources(sources, (width, height), count)
        for kind in KINDS:
            module = loader(sources / kind, plan, dataset="folder", image_size=size, on_device=False)
            stored = f"{kind.upper()} files of {width}x{height} ({made[sources][kind]:.1f})"
            add(size, "folder", kind, stored, 0, throughput(module, 0, plan))
        for encoding in plan.encodings(size):
            out, default = work / f"prepared_{size}_{encoding}", encoding == plan.encodings(size)[0]
            jpegs, start = (
                loader(sources / "jpeg", plan, dataset="folder", image_size=size),
                time.perf_counter(),
            )
            prepared = prepare(jpegs, str(out), encoding, num_workers=plan.prepare_workers, overwrite=True)
            images = prepared.counts["train"]
            measured = {"images_per_s": images / (time.perf_counter() - start), "epoch_images": [images]}
            kb = sum(p.stat().st_size for p in (out / "train").glob("*.bin")) / images / 1e3
            stored = f"{encoding} ({kb:.1f})"
            add(size, "prepare", encoding, f"JPEG files to {stored}", plan.prepare_workers, measured)
            for workers in [0, *plan.workers] if default and size == min(plan.sizes) else [0]:
                module = loader(out, plan, dataset="streaming", on_device=False, num_workers=workers)
                add(size, "streamed", encoding, stored, workers, throughput(module, workers, plan))
            if default:
                module = loader(out, plan, dataset="streaming", on_device=True)
                add(size, "held", encoding, "uint8 tensor", 0, throughput(module, 0, plan))
    return rows


def folder_rate(rows: list[dict], size: int, kind: str) -> float | None:
    found = [r for r in rows if (r["size"], r["path"], r["encoding"]) == (size, "folder", kind)]
    return found[0]["images_per_s"] if found else None


def table(rows: list[dict]) -> list[str]:
    lines = ["| size | path | stored as (kB per image) | processes | images/s | spread of passes | per process | "
             "vs folder PNG | vs folder JPEG |", "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for row in rows:
        bases = [folder_rate(rows, row["size"], kind) if row["path"] != "prepare" else None for kind in KINDS]
        ratios = [f"{row['per_process'] / base:.2f}x" if base else "-" for base in bases]
        passes = row["per_pass"]
        spread = f"{(max(passes) - min(passes)) / statistics.median(passes):.0%}" if len(passes) > 1 else "-"
        lines.append(f"| {row['size']} | {row['path']} | {row['stored']} | {row['workers']} | "
                     f"{row['images_per_s']:,.0f} | {spread} | {row['per_process']:,.0f} | {' | '.join(ratios)} |")  # fmt: skip
    return lines


def targets(rows: list[dict]) -> list[str]:
    """The two targets, met or by how far, where their sizes were measured."""
    lines = []
    size, goal, most = TOTAL_TARGET
    streamed = [r for r in rows if (r["size"], r["path"]) == (size, "streamed") and r["workers"] <= most]
    ways = {"in the training process": [r for r in streamed if r["workers"] == 0],
            "in loading processes": [r for r in streamed if r["workers"]]}  # fmt: skip
    said = []
    for way, chosen in ways.items():
        if chosen:
            best = max(chosen, key=lambda r: r["images_per_s"])
            rate, workers = best["images_per_s"], f", {best['workers']} processes" * (best["workers"] > 0)
            said.append(
                f"{way} {'MET' if rate >= goal else 'MISSED'} ({rate:,.0f}: {rate / goal:.2f}x{workers})"
            )
    if said:
        cores = f"{os.cpu_count()} cores here"
        lines.append(
            f"- {size} px, >= {goal:,} images/s from at most {most} loading processes ({cores}): {'; '.join(said)}"
        )
    size, factor = RATIO_TARGET
    streamed = [r for r in rows if (r["size"], r["path"], r["workers"]) == (size, "streamed", 0)]
    if streamed:
        ratios = [(kind, streamed[0]["images_per_s"] / folder_rate(rows, size, kind)) for kind in KINDS]
        said = [
            f"{'MET' if r >= factor else 'MISSED'} against {k.upper()} files ({r:.1f}x)" for k, r in ratios
        ]
        lines.append(f"- {size} px, streamed >= {factor:g}x the folder loader per process: {', '.join(said)}")
    return lines


def report(rows: list[dict], plan: Plan, command: str, load: tuple[float, float]) -> str:
    small = "x".join(map(str, plan.small_source))
    return "\n".join([
        "# Prepared data sets against the image folder: training images/s per loading process", "",
        f"`{command}`", "", f"{provenance()}; load average {load[0]:.2f} at the start, {load[1]:.2f} at the end.", "",
        f"Batch {plan.batch_size}, flips on; {plan.images:,} sources of {small} up to {min(plan.small_source)} px, "
        f"{plan.large_images:,} of 512x512 above; median of {plan.passes} passes of at least {plan.min_seconds:g} s; "
        "ratios: per process, against the folder loader's at the same size.", "",
        *table(rows), "", "Targets:", "", *targets(rows), "",
    ])  # fmt: skip


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Plan]:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ints, add = {"nargs": "+", "action": list_of(int, "32,64,256")}, parser.add_argument
    add("--sizes", default=[32, 64, 256], help="image sizes (px)", **ints)
    add("--images", type=int, default=2000, help="source images of 178x218 (for sizes up to 178)")
    add("--large_images", type=int, default=500, help="source images of 512x512 (for sizes above)")
    add("--batch_size", type=int, default=128)
    add("--passes", type=int, default=3, help="timed passes of each path (their median)")
    add("--min_seconds", type=float, default=1.0, help="the least a pass times (in whole epochs)")
    add("--workers", default=[2, 4], help="loading processes streaming at the smallest size", **ints)
    add("--prepare_workers", type=int, default=2, help="prepare's processes")
    add("--all_encodings_from", type=int, default=256, help="from this size, stream every encoding")
    add("--work", type=Path, help="where the images and sets go (default: a temporary folder)")
    add("--out", type=Path, help="also write the results (markdown) to this file")
    args = parser.parse_args(argv)
    for flag in ("images", "large_images", "batch_size", "passes", "prepare_workers"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} {getattr(args, flag)}: must be 1 or more")
    if min(args.images, args.large_images) < 2 * args.batch_size:
        parser.error(f"--images and --large_images must be at least twice --batch_size {args.batch_size}")
    args.command = shlex.join(["python", "benchmarks/speed/prepared_data.py", *argv])
    return args, Plan(
        **{item.name: getattr(args, item.name) for item in fields(Plan) if hasattr(args, item.name)}
    )


def main(argv: list[str] | None = None) -> None:
    args, plan = parse_args(argv)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores: asked
    load, log = os.getloadavg()[0], lambda line: print(line, file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="prepared_data_") as temporary:
        rows = run(plan, args.work or Path(temporary), log)
    text = report(rows, plan, args.command, (load, os.getloadavg()[0]))
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
