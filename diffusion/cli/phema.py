"""Post-hoc EMA (Karras et al. 2024, EDM2): the EMA of any length after training, from the snapshots a run
trained with `--ema.post_hoc true` wrote into RUN/post_hoc_ema/.

    python -m diffusion.phema --run runs/digits/version_0 --sigma_rel 0.08 --out phema.ckpt
    python -m diffusion.phema --run runs/digits/version_0 --sweep "[0.02, 0.05, 0.08, 0.12, 0.2]"

--sigma_rel S writes OUT: the run's checkpoint of the reconstruction's step (--step, by default the newest
step with snapshots; --ckpt names another) with the reconstructed weights as its EMA weights ("state_dict")
and the raw ones ("current_model_state") as trained, so `python -m diffusion.sample --ckpt OUT` and
`load_checkpoint(OUT)` take it as any checkpoint. sigma_rel is the EMA's length relative to the training time
(the standard deviation of its averaging profile over the steps, divided by the step count): 0.05 puts 90% of
its weight on the last 12% of the steps, 0.10 on the last 25%.

--sweep [S1, S2, ...] samples the run's own EMA and each sigma_rel with the same seeds (--num_samples,
--sampler, --steps: by default the checkpoint's sampler) and scores them by FID with --features (default:
pixels, the offline 8x8 pixel-space FD of the digits) against --reference (a dataset or an .npz, as in
`python -m diffusion.evaluate`), printing a table; with --out it also writes the best one's checkpoint.

Nothing is overwritten without --overwrite. One phema at a time writes OUT: a second is refused at once, naming
the first (its lock `.OUT.lock` beside OUT, `phema_lock`). A user error ends in one line on stderr and exit status
2; --debug (or DIFFUSION_DEBUG=1) shows its traceback.
"""

import sys
import warnings
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import fields
from pathlib import Path

import numpy as np
import yaml
from jsonargparse import ArgumentParser, Namespace
from jsonargparse.typing import NonNegativeInt, PositiveInt

from diffusion.cli.command_line import Written
from diffusion.cli.evaluate_quality import image_counts, too_few_for_a_covariance
from diffusion.cli.flags import (
    add_flags,
    add_sampling_arguments,
    check_local_output,
    check_paths_given,
    command_parser,
    given_checkpoint,
    ranges_said_as_flags,
    requested_labels,
    resolve_device,
)
from diffusion.cli.parse_errors import parsed_command_line
from diffusion.cli.phema_inputs import check_one_mode, check_out, no_snapshots
from diffusion.cli.reporting import reporting_user_errors
from diffusion.cli.sample import chosen_sampler
from diffusion.core.sampling import SamplingOptions
from diffusion.data.file_in_folder import check_local_file
from diffusion.data.folder_lock import writing_alone
from diffusion.errors import COMMAND, UserError
from diffusion.generation.ranks import generate
from diffusion.metrics.features import Features, feature_size
from diffusion.metrics.image_sets import load_reference
from diffusion.metrics.sample_quality import SampleQuality, feed_images
from diffusion.training.atomic_writes import save_atomically
from diffusion.training.checkpoint_files import read_checkpoint
from diffusion.training.ema_profiles import check_sigma_rel
from diffusion.training.loading import load_checkpoint
from diffusion.training.post_hoc_ema import (
    POOR_FIT,
    PoorFit,
    Reconstruction,
    Snapshot,
    check_step,
    find_snapshots,
    reconstruct,
)
from diffusion.training.run_folders import checkpoints_of_run, post_hoc_ema_folder

MIN_SAMPLES = 2  # an FD's covariance of the samples needs two
# The options of a --sweep's sampling and scoring: --sigma_rel, which writes a checkpoint, uses none of them.
SWEEP_ONLY = (
    "num_samples", "batch_size", "seed", "features", "reference", "data_root", "device",
    *(option.name for option in fields(SamplingOptions)),
)  # fmt: skip


def build_parser() -> ArgumentParser:
    parser = command_parser("python -m diffusion.phema", __doc__)
    parser.add_argument("--run", type=str, required=True, help="a run folder: runs/<name>/version_N")
    parser.add_argument("--sigma_rel", type=float | None, default=None, help="the EMA length to reconstruct")
    parser.add_argument(
        "--sweep", type=list[float] | None, default=None, help='score several, e.g. "[0.02, 0.05, 0.1, 0.2]"'
    )
    parser.add_argument("--out", type=str | None, default=None, help="the checkpoint to write (.ckpt)")
    add_flags(parser, "overwrite", overwrite={"help": "replace OUT"})
    parser.add_argument(
        "--step", type=PositiveInt | None, default=None, help="default: the newest snapshots'"
    )
    add_flags(
        parser, "ckpt",
        ckpt={"type": str | None, "required": False, "default": None,
              "help": "the checkpoint to start from (default: the run's at --step)"},
    )  # fmt: skip
    sweep = parser.add_argument_group("--sweep: sampling and scoring")
    sweep.add_argument("--num_samples", type=PositiveInt, default=1000)
    add_flags(
        sweep,
        "batch_size",
        "seed",
        seed={"type": NonNegativeInt, "help": "the same samples' noise for every row"},
    )
    sweep.add_argument("--features", type=Features, default="pixels", help="pixels (offline) or inception")
    sweep.add_argument("--reference", type=str, default="digits", help="a dataset or an .npz of real images")
    sweep.add_argument(
        "--data_root", type=str, default="data", help="download folder of torchvision datasets"
    )
    add_flags(sweep, "device")
    add_sampling_arguments(parser)
    return parser


def phema_lock(out: str) -> Path:
    """Where a phema writing the checkpoint `out` holds its lock (`writing_alone`): `.OUT.lock` beside it, removed
    on the way out: two at once into one --out both said they wrote it, and it held one of them."""
    path = Path(out).absolute()
    return path.parent / f".{path.name}.lock"


def check_not_there(out: str, overwrite: bool) -> None:
    """Checked with --out held (`phema_lock`): another phema may have written it since the command began."""
    if Path(out).exists() and not overwrite:
        raise UserError(f"--out {out} exists", "pass --overwrite to replace it, or another --out")


def base_checkpoint(run: Path, step: int, ckpt: str | None) -> Path:
    """--ckpt, or the run's checkpoint of `step` (a last.ckpt before a step=N.ckpt), or its newest."""
    if ckpt is not None:
        path = Path(given_checkpoint(ckpt))
        theirs = read_checkpoint(path, "--ckpt").get("global_step")
        if theirs is not None and theirs != step:  # the output would mix two steps (or two runs) unsaid
            raise UserError(
                f"--ckpt {ckpt} is of step {theirs}, and the EMA is reconstructed at step {step} from --run {run}",
                f"pass a checkpoint of step {step} of this run, or leave --ckpt out: the run's own of that step",
            )
        if run.resolve() not in path.resolve().parents:
            print(
                f"note: --ckpt {ckpt} is not in --run {run}: its raw weights, optimizer state and settings go "
                "into --out with the EMA of --run's snapshots",
                file=sys.stderr,
            )
        return path
    found = checkpoints_of_run(run)
    if not found:
        raise UserError(
            f"--run {run} holds no readable checkpoint in checkpoints/",
            "pass the checkpoint to start from: --ckpt",
        )
    at_step = [path for found_step, path in found if found_step == step]
    if at_step:
        return at_step[-1]
    newest_step, newest = found[-1]
    print(
        f"note: no checkpoint of step {step} in {run / 'checkpoints'}; the raw weights and settings come from "
        f"{newest.name} (step {newest_step})",
        file=sys.stderr,
    )
    return newest


def with_weights(checkpoint: dict, reconstruction: Reconstruction, path: Path) -> dict:
    """The checkpoint with the reconstructed parameters as its EMA weights, and what they are."""
    state = checkpoint["state_dict"]
    for name, value in reconstruction.weights.items():
        if name not in state or state[name].shape != value.shape:
            raise UserError(
                f"the snapshots do not fit the network of {path} (at {name})",
                "pass the run's own checkpoint (--ckpt) or the run the snapshots belong to (--run)",
            )
    return {
        **checkpoint,
        "state_dict": {**state, **reconstruction.weights},
        "post_hoc_ema": {
            "sigma_rel": reconstruction.sigma_rel,
            "step": reconstruction.step,
            "snapshots": len(reconstruction.snapshots),
            "relative_error": reconstruction.solution.relative_error,
        },
    }


def reconstructed(snapshots: list[Snapshot], sigma_rel: float, step: int) -> Reconstruction:
    """`reconstruct`, its PoorFit warning left to this command's own line (once, of the checkpoint written; a
    --sweep's table shows every row's fit error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PoorFit)
        return reconstruct(snapshots, sigma_rel, step)


def run_ema_label(run: Path) -> str:
    """ "the run's EMA (decay D)" with the decay its config.yaml records."""
    config = run / "config.yaml"
    decay = (
        (yaml.safe_load(config.read_text()) or {}).get("ema", {}).get("decay") if config.is_file() else None
    )
    return f"the run's EMA (decay {decay:g})" if isinstance(decay, float) else "the run's EMA"


def sweep(
    args: Namespace, run: Path, base: Path, snapshots: list[Snapshot], step: int, written: Sequence[Written]
) -> Reconstruction | None:
    """Score the run's EMA and every --sweep sigma_rel; print the table; return the best reconstruction."""
    hparams = read_checkpoint(base, "--ckpt").get("hyper_parameters", {})
    if len(hparams.get("sample_shape", ())) != 3:
        raise UserError(
            f"--sweep scores images, and {base} samples vectors", "use --sigma_rel and score them yourself"
        )
    with ranges_said_as_flags():
        options = SamplingOptions.taken_from(args)
    labels = requested_labels(hparams, args.num_samples, None, options.guidance_scale is not None)
    device, _ = resolve_device(args.device, "auto")
    module = load_checkpoint(base, weights="ema", map_location=device)
    channels, size = hparams["sample_shape"][0], hparams["sample_shape"][-1]
    reference = load_reference(args.reference, size, channels, args.data_root, None, args.seed)
    statistics = None if isinstance(reference, np.ndarray) else reference  # an .npz of FID statistics
    quality = SampleQuality(args.features, ["fid"], channels=channels, reference=statistics).to(device)
    quality_size = feature_size(args.features, channels)
    if statistics is None:
        feed_images(quality, reference, True, args.batch_size, device, "features of the reference")  # type: ignore[arg-type]
    run_ema = {name: value.clone() for name, value in module.state_dict().items()}
    sampler, note = chosen_sampler(module, options, written)
    if note:
        print(f"note: {note}", file=sys.stderr)

    def score(weights: dict) -> float:
        module.load_state_dict({**run_ema, **weights})
        samples = generate(
            module, args.num_samples, sampler=sampler, seed=args.seed, batch_size=args.batch_size,
            uint8_images=True, labels=labels,
        )  # fmt: skip
        quality.reset()  # the generated side only: the reference's features are kept
        images = samples.permute(0, 2, 3, 1).numpy()  # (N, H, W, C), the samples-file layout
        feed_images(quality, images, False, args.batch_size, device, "features of the samples")
        return quality.compute(args.seed)["fid"]

    rows = [(run_ema_label(run), "-", "-", score({}))]
    print(f"{rows[0][0]}: FD {rows[0][3]:.3f}", flush=True)
    best: tuple[float, Reconstruction] | None = None
    for sigma_rel in args.sweep:
        reconstruction = reconstructed(snapshots, sigma_rel, step)
        fd = score(reconstruction.weights)
        error = f"{100 * reconstruction.solution.relative_error:.2f}%"
        rows.append(("post-hoc EMA", f"{sigma_rel:g}", error, fd))
        print(f"sigma_rel {sigma_rel:g}: FD {fd:.3f} (profile fit error {error})", flush=True)
        if best is None or fd < best[0]:
            best = (fd, reconstruction)
    metric = "FD (8x8 pixels)" if args.features == "pixels" else "FID (Inception)"
    print(
        f"\n{args.num_samples} samples of step {step} ({sampler.name}, "
        f"{sampler.steps_for(module.schedule.num_timesteps)} "
        f"steps, seed {args.seed}) against {args.reference}:\n"
    )
    print(f"| weights | sigma_rel | profile fit error | {metric} |\n| --- | ---: | ---: | ---: |")
    for label, sigma_rel, error, fd in rows:
        print(f"| {label} | {sigma_rel} | {error} | {fd:.3f} |")
    # 4 samples of 64-d pixel features named a "best" from noise without a word (evaluate notes it)
    for note in too_few_for_a_covariance(image_counts(args.num_samples, reference), quality_size):
        print(note.replace("this distance is", "these distances are"), file=sys.stderr)
    if best is not None:
        print(
            f"\nbest: sigma_rel {best[1].sigma_rel:g}, {metric} {best[0]:.3f} ({against_the_runs_ema(best[0], rows[0][3])})"
        )
    return None if best is None else best[1]


def against_the_runs_ema(distance: float, runs_ema: float) -> str:
    """The best sweep's distance beside the run's EMA's: a change under 0.05% keeps its first digit (a worse FD
    was said as "+0.0%"), and one that is no better says so."""
    change = 100 * (distance - runs_ema) / runs_ema
    said = f"{change:+.1f}%" if abs(change) >= 0.05 or change == 0 else f"{change:+.1g}%"
    return f"{said} against the run's EMA" + ("" if change < 0 else ": no sigma_rel of the sweep beats it")


def note_unused_by_sigma_rel(written: Sequence[Written], out: str) -> None:
    """A note of the sampling and --sweep flags given to --sigma_rel, which writes a checkpoint and samples nothing:
    OUT keeps the run's own sampler, whatever --sampler said."""
    unused = {item.key: item for item in written if item.key in SWEEP_ONLY and item.values != (None,)}
    if unused:
        shown = ", ".join(item.shown() for item in unused.values())
        print(
            f"note: {shown} {'is' if len(unused) == 1 else 'are'} not used: "
            "--sigma_rel writes a checkpoint with the run's own sampling settings, "
            "and these options sample and score a --sweep "
            f"(to sample it with them: python -m diffusion.sample --ckpt {out} ...)",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> Path | None:
    """`python -m diffusion.phema [flags]`: write OUT (and return its path), or print a --sweep's table."""
    with reporting_user_errors(argv), ExitStack() as held:
        command_line = parsed_command_line(build_parser(), argv)
        args = command_line.config
        check_paths_given(args, "run", "out", "ckpt", "reference", "data_root")
        check_local_output(args.out, "--out", "phema")  # before `~` is expanded, which reads s3:// as s3:/
        check_local_file(args.run, "--run", "a run folder")
        check_one_mode(args.sigma_rel, args.sweep)
        if args.sigma_rel is not None and args.out is None:
            raise UserError("--sigma_rel needs --out", "pass the checkpoint to write: --out phema.ckpt")
        if args.sweep is not None and not args.sweep:
            raise UserError("--sweep [] is empty", 'pass the sigma_rel values to score, e.g. "[0.05, 0.1]"')
        if args.sweep is not None and len(set(args.sweep)) != len(args.sweep):  # each would be scored again
            raise UserError(f"--sweep {args.sweep} repeats a value", 'pass distinct ones, e.g. "[0.05, 0.1]"')
        if args.sweep is not None and args.num_samples < MIN_SAMPLES:  # found only once every row was sampled
            raise UserError(
                f"--num_samples {args.num_samples}: a --sweep scores each row by its FD, which needs at least "
                f"{MIN_SAMPLES} samples",
                f"pass --num_samples {MIN_SAMPLES} or more (a few hundred, for scores that tell the rows apart)",
            )
        for sigma_rel in [args.sigma_rel] if args.sweep is None else args.sweep:
            check_sigma_rel(sigma_rel, "--sigma_rel" if args.sweep is None else "--sweep: sigma_rel")
        with ranges_said_as_flags():  # checked before --print_config (a --sweep samples with them)
            SamplingOptions.taken_from(args)
        args.out = (
            None if args.out is None else str(Path(args.out).expanduser())
        )  # `out: ~/x`, as sample reads it
        check_out(args.out)
        if args.out is not None:
            # Held from here, before the run is read: a second phema into --out is refused at once, in one line
            # ("--out FILE is being written by another phema (pid N ...)"), with rc 2
            held.enter_context(writing_alone(args.out, "phema", phema_lock(args.out)))
            check_not_there(args.out, args.overwrite)
        run = Path(args.run).expanduser()
        if not run.is_dir():
            raise UserError(f"--run {run} is not a folder", "pass a run folder, e.g. runs/digits/version_0")
        folder = post_hoc_ema_folder(run)  # none in a run trained without post-hoc EMA
        snapshots = find_snapshots(folder) if folder.is_dir() else []
        if not snapshots:
            raise no_snapshots(run, folder)
        step = check_step(snapshots, args.step, COMMAND)
        base = base_checkpoint(run, step, args.ckpt)
        command_line.print_config_if_asked()  # once the checks have passed: what would run
        if args.sweep is not None:
            chosen = sweep(args, run, base, snapshots, step, command_line.written)
        else:
            note_unused_by_sigma_rel(command_line.written, args.out)
            chosen = reconstructed(snapshots, args.sigma_rel, step)
        if args.out is None or chosen is None:
            return None
        if chosen.solution.relative_error > POOR_FIT:
            print(
                f"warning: the snapshots fit the profile of sigma_rel {chosen.sigma_rel:g} poorly (L2 error "
                f"{100 * chosen.solution.relative_error:.0f}%): it lies outside the tracked ones, or there are few "
                "snapshots; the weights are an approximation of that EMA",
                file=sys.stderr,
            )
        save_atomically(
            with_weights(read_checkpoint(base, "--ckpt"), chosen, base),
            args.out,
            "free space there, or pass another --out",
        )
        print(
            f"wrote {args.out}: the EMA of sigma_rel {chosen.sigma_rel:g} at step {chosen.step}, from "
            f"{len(chosen.snapshots)} snapshots (profile fit error {100 * chosen.solution.relative_error:.2f}%) "
            f"on {base.name}"
        )
        return Path(args.out)


if __name__ == "__main__":
    main()
