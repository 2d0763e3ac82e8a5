"""Every `python train.py ...` and `python -m diffusion.<command> ...` line the README and the guides print (the
```bash blocks of tests/test_docs.py's DOCUMENTS, torchrun's lines included) runs as printed, exits with status 0
and writes what it should (the checks of what it wrote: tests/helpers/documented_checks.py).

COMMANDS holds one entry per printed command, matched by its text. The printed words run first, followed only by
flags that make the run small (fewer steps and samples, a tiny network: SHORT), in a working folder of its own that
stands for the project's folder (configs/ is there) and holds the files the command reads: written by the documented
command that makes them (the README's `python train.py` is the runs/digits/version_0/checkpoints/last.ckpt that
the sample, evaluate and export lines read) or, for a user's own files (points.npy, my_images/, a diffusers
folder), by a maker in tests/helpers/documented_commands.py. A placeholder (CKPT) is replaced by the file it
stands for. A command that cannot run here as printed (CIFAR-10 and Inception's weights are downloads; GPUs;
several machines) runs its closest honest stand-in, and its entry's `why` says what stands in for what; each
test prints how its command ran. A printed command without an entry fails
`test_every_printed_command_has_an_entry`, which says how to add one.

Each command runs once a session (`Runs`, tests/helpers/documented_runs.py), in this process where it can (its
`main(argv)`). The multi-device ones run beside each other in processes of their own, forked warm (helpers/warm.py; the launchers'
cold starts are tests/cli/test_launchers.py's): `python train.py --devices 2 --strategy ddp --accelerator cpu` as
printed (Lightning's launcher starts its second rank), and all the others in turn on the two ranks of one
`torchrun --nproc_per_node 2` job, since a launch costs more than the runs it starts.
"""

import pytest
from helpers import QUICK, TINY_MLP, TINY_UNET, VALIDATING_EVERY_2
from helpers import documented_commands as made
from helpers.documented_checks import (
    a_checkpoint_under,
    bits_per_dim,
    cifar10_pixels,
    csv_log,
    every,
    exported,
    fid_monitored,
    phema_checkpoint,
    post_hoc_snapshots,
    prepared_set,
    printed_config,
    resumed,
    samples,
    scores,
    statistics_file,
    step_report,
    streamed_from,
    sweep_table,
    the_jobs_run,
    trained,
    two_ranks,
    wandb_offline_run,
    wandb_run_ends,
)
from helpers.documented_runs import Command, Output, Runs, command
from test_docs import REPO, python_command_lines

from diffusion.cli import evaluate, export, phema, prepare, sample, train

MAINS = {
    "train.py": train.main,
    "diffusion.sample": sample.main,
    "diffusion.evaluate": evaluate.main,
    "diffusion.export": export.main,
    "diffusion.phema": phema.main,
    "diffusion.prepare": prepare.main,
}
PRINTED = {text: argv for _, text, argv in python_command_lines()}  # the text as printed -> its argv

# Shorter and smaller, never different: two optimizer steps with a validation at the second (its checkpoint and
# grid), a tiny network, grids of 4 samples in 3 steps (later flags win).
QUICK_2 = [*QUICK, "--max_steps", "2", *VALIDATING_EVERY_2]
SHORT = [*TINY_UNET, *QUICK_2]
SHORT_MLP = [*TINY_MLP, *QUICK_2]
# The README's run also has T = 20 timesteps: `evaluate --nll` scores its checkpoint with the whole bound, one
# network evaluation per timestep (1,000 took 20 s).
DIGITS_RUN = [*SHORT, "--model.num_timesteps", "20"]
# 8 images a class: 4 a batch, read in this process (the recipe's 4 loader workers take longer to start than the
# run takes).
FOLDER_HERE = ["--data.init_args.batch_size", "4", "--data.init_args.num_workers", "0"]
# CIFAR-10 is a download: the recipe's own ImageDataModule over random pixels (benchmarks/speed/speed_data.py, by
# its package path: the session has the repository root on sys.path, pyproject's pythonpath), 2,000 images (the
# recipe validates on 1,000 of them), 4 a batch, 2 of the 250 validation batches, read in this process; its 16-mixed is
# for CUDA (the recipe: on a CPU use --precision 32).
CIFAR10_HERE = [
    "--data.class_path", "benchmarks.speed.speed_data.SyntheticCIFAR10", "--data.init_args.num_images", "2000",
    "--data.init_args.batch_size", "4",
    "--precision", "32", "--data.init_args.num_workers", "0", "--trainer.limit_val_batches", "2",
]  # fmt: skip
# The prepared CIFAR-10: the stand-in's 2,000 images (1,000 of them validate, as the recipe's val_from_train), and
# training from it as CIFAR10_HERE trains.
CIFAR10_PREPARED_HERE = [*CIFAR10_HERE[:4], "--num_workers", "1"]
STREAMED_HERE = [*CIFAR10_HERE[4:]]
CIFAR10_WHY = (
    "CIFAR-10 is a download: the recipe's ImageDataModule over random pixels (SyntheticCIFAR10), in 32-bit"
)
CIFAR10_REFERENCE_WHY = (
    "CIFAR-10 is a download: `cifar10` reads the recipe's ImageDataModule over random pixels"
)
# Random Inception weights would run offline (--inception_weights), but each 2048-d FID's matrix square root takes
# ~15 s of CPU; tests/metrics/ run that path.
INCEPTION_WHY = "InceptionV3's weights are a download: --features pixels, the offline features"
TWO_RANKS_WHY = (
    "2 CPU ranks (gloo), started by the torchrun job of the multi-device commands (Lightning's own launcher runs "
    "`python train.py --devices 2 --strategy ddp --accelerator cpu`)"
)


# ---- the entries ----------------------------------------------------------------------------------------------
TRAIN = "python train.py"
TRAIN_POST_HOC = "python train.py --ema.post_hoc true"
TRAIN_CONDITIONAL = "python train.py --config configs/digits_conditional.yaml"
SAMPLE = "python -m diffusion.sample --ckpt runs/digits/version_0/checkpoints/last.ckpt --num_samples 64 --out samples/"
SAMPLE_PIPELINE = "python -m diffusion.sample --ckpt ddpm-cifar10-32/ --num_samples 64 --out samples/"
SAVE_STATS = (
    "python -m diffusion.evaluate --reference cifar10 --data_root data --save_stats cifar10_train.npz"
)
PHEMA = "python -m diffusion.phema --run runs/digits/version_0 --sigma_rel 0.15 --out phema.ckpt"
LAST = "runs/digits/version_0/checkpoints/last.ckpt"
PREPARE_FOLDER = "python -m diffusion.prepare --config configs/folder.yaml --data.root my_images/ --data.image_size 32 --out prepared/"
PREPARE_CIFAR10 = "python -m diffusion.prepare --config configs/cifar10.yaml --out prepared_cifar10/"
CONDITIONAL_LAST = "runs/digits_conditional/version_0/checkpoints/last.ckpt"
DIGITS_RUN_FOLDER = {"runs/digits/version_0": Output(TRAIN)}  # evaluate --nll reads the run's config.yaml too
POST_HOC_RUN_FOLDER = {"runs/digits/version_0": Output(TRAIN_POST_HOC)}
PIPELINE = {"ddpm-cifar10-32": made.diffusers_pipeline}
PIPELINE_WHY = "google/ddpm-cifar10-32 is a download: a DDPMPipeline folder of its layout at small widths, random weights"
CIFAR10_SAMPLES = {"samples/samples.npz": Output(SAMPLE_PIPELINE)}
SAMPLES_2_STEPS = ["--num_samples", "4", "--steps", "2"]
TWO_CPU_RANKS = ["--devices", "2", "--accelerator", "cpu"]
# What `torchrun --nnodes 2 --nproc_per_node 1` gives its workers, over the job's `--nproc_per_node 2`.
TWO_NODES = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "{RANK}"}

# fmt: off
COMMANDS: dict[str, Command] = {
    # ---- README.md (the lines docs/data.md, docs/post_hoc_ema.md, docs/scaling.md, benchmarks/ repeat too) ----
    TRAIN: command(trained("digits"), *DIGITS_RUN),
    "python train.py --config configs/cifar10.yaml --devices 4 --strategy ddp": command(
        every(trained("cifar10", trainer_devices=2, trainer_strategy="ddp"), two_ranks),
        *SHORT, *CIFAR10_HERE, *TWO_CPU_RANKS, launch="ranks", why=f"4 GPUs: {TWO_RANKS_WHY}; {CIFAR10_WHY}",
    ),
    "python train.py --config configs/toy2d.yaml --data.path points.npy": command(
        trained("toy2d", sample_shape=(2,)), *SHORT_MLP, inputs={"points.npy": made.vectors},
    ),
    "python train.py --config configs/folder.yaml --data.root my_images/ --data.image_size 32": command(
        trained("folder", sample_shape=(3, 32, 32)), *SHORT, *FOLDER_HERE, inputs={"my_images": made.image_folder},
    ),
    PREPARE_FOLDER: command(
        prepared_set("prepared", (3, 32, 32), labelled=False), "--num_workers", "1",
        inputs={"my_images": made.image_folder},
    ),
    "python train.py --config configs/folder.yaml --data.dataset streaming --data.root prepared/": command(
        every(trained("folder", sample_shape=(3, 32, 32)), streamed_from("prepared/")), *SHORT,
        *FOLDER_HERE, inputs={"prepared": Output(PREPARE_FOLDER)},
    ),
    "python train.py --ckpt_path last": command(
        resumed, *DIGITS_RUN, "--max_steps", "4", inputs={"runs/digits": Output(TRAIN)},
    ),
    "python train.py --print_config": command(printed_config),
    SAMPLE: command(samples(4, (8, 8, 1)), *SAMPLES_2_STEPS, inputs={LAST: Output(TRAIN)}),
    "python -m diffusion.evaluate --samples samples/samples.npz --reference digits --features pixels": command(
        scores("fid", "kid_mean"), inputs={"samples/samples.npz": Output(SAMPLE)},
    ),
    "python -m diffusion.evaluate --nll --ckpt runs/digits/version_0/checkpoints/last.ckpt": command(
        bits_per_dim, "--num_images", "2", inputs=DIGITS_RUN_FOLDER,
    ),
    "python -m diffusion.export --ckpt runs/digits/version_0/checkpoints/last.ckpt --format diffusers "
    "--out digits_pipeline/": command(exported("digits_pipeline", "diffusers"), inputs=DIGITS_RUN_FOLDER),
    TRAIN_POST_HOC: command(every(trained("digits"), post_hoc_snapshots), *SHORT, "--ema.snapshot_every", "1"),
    'python -m diffusion.phema --run runs/digits/version_0 --sweep "[0.05, 0.1, 0.2]" --out phema.ckpt': command(
        sweep_table(0.05, 0.1, 0.2, out=True), "--num_samples", "8", "--steps", "2", inputs=POST_HOC_RUN_FOLDER,
    ),
    # ---- docs/conditional.md ----
    TRAIN_CONDITIONAL: command(trained("digits_conditional", network_num_classes=10), *SHORT),
    "python -m diffusion.sample --ckpt runs/digits_conditional/version_0/checkpoints/last.ckpt --class_label 3 "
    "--guidance_scale 2": command(
        samples(4, (8, 8, 1), labels=[3] * 4), *SAMPLES_2_STEPS,
        inputs={CONDITIONAL_LAST: Output(TRAIN_CONDITIONAL)},
    ),
    "python -m diffusion.sample --ckpt CKPT --class_label all --num_samples 100": command(
        samples(10, (8, 8, 1), labels=list(range(10))), "--num_samples", "10", "--steps", "2",
        inputs={CONDITIONAL_LAST: Output(TRAIN_CONDITIONAL)}, placeholders={"CKPT": CONDITIONAL_LAST},
    ),
    "python train.py --config configs/folder.yaml --data.root pets/ --data.image_size 32 --data.conditional true":
    command(
        trained("folder", class_names=["cat", "dog"], network_num_classes=2), *SHORT, *FOLDER_HERE,
        inputs={"pets": made.class_folders},
    ),
    "python train.py --config configs/toy2d.yaml --data.path x.npy --data.labels y.npy --model.label_dropout 0.1":
    command(
        trained("toy2d", network_num_classes=made.VECTOR_CLASSES), *SHORT_MLP,
        inputs={"x.npy": made.vectors, "y.npy": made.vector_labels},
    ),
    "python train.py --config configs/cifar10_conditional.yaml --devices 4 --data.init_args.batch_size 32": command(
        every(trained("cifar10_conditional", network_num_classes=10, trainer_devices=2), two_ranks),
        *SHORT, *CIFAR10_HERE, *TWO_CPU_RANKS, launch="ranks", why=f"4 GPUs: {TWO_RANKS_WHY}; {CIFAR10_WHY}",
    ),
    # ---- docs/evaluation.md (its samples: docs/export.md's, of a CIFAR-10-sized pipeline) ----
    "python -m diffusion.evaluate --samples samples/samples.npz --reference cifar10 --data_root data": command(
        scores("fid", "kid_mean"), "--num_reference", "10", "--features", "pixels", inputs=CIFAR10_SAMPLES,
        context=cifar10_pixels, why=f"{CIFAR10_REFERENCE_WHY}; {INCEPTION_WHY}",
    ),
    SAVE_STATS: command(
        statistics_file, "--num_reference", "10", "--features", "pixels", context=cifar10_pixels,
        why=f"{CIFAR10_REFERENCE_WHY}; {INCEPTION_WHY}",
    ),
    "python -m diffusion.evaluate --samples samples/samples.npz --reference cifar10_train.npz": command(
        scores("fid"), "--features", "pixels", inputs={**CIFAR10_SAMPLES, "cifar10_train.npz": Output(SAVE_STATS)},
        why=INCEPTION_WHY,
    ),
    "python train.py --config configs/cifar10.yaml --trainer.callbacks+=diffusion.training.callbacks."
    "SampleQualityCallback --trainer.callbacks.init_args.num_samples 10000 --trainer.callbacks.init_args."
    "reference_stats cifar10_train.npz --checkpoint.monitor val/fid --checkpoint.mode min": command(
        every(trained("cifar10"), fid_monitored), *SHORT, *CIFAR10_HERE,
        "--trainer.callbacks.init_args.num_samples", "2", "--trainer.callbacks.init_args.sampling.steps", "2",
        "--trainer.callbacks.init_args.features", "pixels", inputs={"cifar10_train.npz": Output(SAVE_STATS)},
        why=f"{CIFAR10_WHY}; {INCEPTION_WHY}",
    ),
    # ---- docs/export.md ----
    "python -m diffusion.export --ckpt runs/digits/version_0/checkpoints/last.ckpt --format safetensors "
    "--out export/": command(exported("export", "safetensors"), inputs=DIGITS_RUN_FOLDER),
    "python -m diffusion.export --ckpt runs/digits/version_0/checkpoints/last.ckpt --format diffusers "
    "--out digits-ddpm/": command(exported("digits-ddpm", "diffusers"), inputs=DIGITS_RUN_FOLDER),
    SAMPLE_PIPELINE: command(samples(4, (32, 32, 3)), *SAMPLES_2_STEPS, inputs=PIPELINE, why=PIPELINE_WHY),
    "python train.py --config configs/cifar10.yaml --model.init_from ddpm-cifar10-32/": command(
        trained("cifar10", network_channels=32), *QUICK_2, *CIFAR10_HERE, inputs=PIPELINE,
        why=f"{CIFAR10_WHY}; {PIPELINE_WHY} (its network is the run's: no tiny network appended)",
    ),
    # ---- docs/gpu.md ----
    "python train.py --config configs/cifar10.yaml --max_steps 200 --trainer.callbacks+=diffusion.training."
    "callbacks.StepTimer --trainer.callbacks.peak_tflops 790 --trainer.callbacks.path runs/speed.jsonl": command(
        every(trained("cifar10"), step_report), *SHORT, *CIFAR10_HERE,
        "--trainer.callbacks.warmup_steps", "0", "--trainer.callbacks.steps", "1",
        why=f"a GPU's: on the CPU, timing 1 step after none of warm-up; {CIFAR10_WHY}",
    ),
    # ---- docs/post_hoc_ema.md ----
    PHEMA: command(phema_checkpoint(0.15), inputs=POST_HOC_RUN_FOLDER),
    "python -m diffusion.sample --ckpt phema.ckpt --num_samples 64 --out samples/": command(
        samples(4, (8, 8, 1)), *SAMPLES_2_STEPS, inputs={"phema.ckpt": Output(PHEMA)},
    ),
    'python -m diffusion.phema --run runs/digits/version_0 --sweep "[0.03, 0.05, 0.07, 0.1, 0.13, 0.16, 0.2, '
    '0.25]"': command(
        sweep_table(0.03, 0.05, 0.07, 0.1, 0.13, 0.16, 0.2, 0.25), "--num_samples", "8", "--steps", "2",
        inputs=POST_HOC_RUN_FOLDER,
    ),
    # ---- docs/scaling.md ----
    "torchrun --nproc_per_node 4 train.py --config configs/cifar10.yaml --devices 4 --strategy ddp": command(
        every(trained("cifar10", trainer_devices=2), two_ranks), *SHORT, *CIFAR10_HERE, *TWO_CPU_RANKS,
        launch="ranks", why=f"4 GPUs: {TWO_RANKS_WHY}; {CIFAR10_WHY}",
    ),
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nproc_per_node 4 --max-restarts 3 train.py --config "
    "configs/cifar10.yaml --devices 4 --strategy ddp --ckpt_path auto": command(
        every(trained("cifar10", version="torchrun-*", trainer_devices=2), the_jobs_run("cifar10", "torchrun-*"),
              two_ranks),
        *SHORT, *CIFAR10_HERE, *TWO_CPU_RANKS, launch="ranks",
        why=f"4 GPUs: {TWO_RANKS_WHY}, whose run id names the run; {CIFAR10_WHY}. Its first start: the restarts "
        "are tests/cli/test_restarts.py's (torchrun --max-restarts 1, a rank killed, the same command resumed)",
    ),
    "srun python train.py --config configs/cifar10.yaml --num_nodes 2 --devices 4 --strategy ddp --ckpt_path auto":
    command(
        every(trained("cifar10", version="slurm-4242", trainer_num_nodes=2, trainer_devices=1),
              the_jobs_run("cifar10", "slurm-4242"), two_ranks),
        *SHORT, *CIFAR10_HERE, "--devices", "1", "--accelerator", "cpu", launch="ranks",
        env={**TWO_NODES, "SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "none"},
        why="SLURM's two machines of 4 GPUs (there is no SLURM here): one job of two 1-device nodes, the torchrun "
        "job's 2 CPU ranks in the environment `torchrun --nnodes 2 --nproc_per_node 1` gives its workers, with the "
        "job id srun's tasks see (SLURM_JOB_ID=4242) and no torchrun run id (`none`, torchrun's default where it "
        f"names none); {CIFAR10_WHY}",
    ),
    PREPARE_CIFAR10: command(
        prepared_set("prepared_cifar10", (3, 32, 32), labelled=True), *CIFAR10_PREPARED_HERE, why=CIFAR10_WHY,
    ),
    "python train.py --config configs/cifar10.yaml --devices 4 --strategy ddp --data.dataset streaming --data.root "
    "prepared_cifar10/": command(
        every(trained("cifar10", trainer_devices=2), streamed_from("prepared_cifar10/"), two_ranks),
        *SHORT, *STREAMED_HERE, *TWO_CPU_RANKS, launch="ranks", inputs={"prepared_cifar10": Output(PREPARE_CIFAR10)},
        why=f"4 GPUs: {TWO_RANKS_WHY}; the set prepared from random pixels (above), in 32-bit",
    ),
    "python train.py --devices 2 --strategy ddp --accelerator cpu": command(
        every(trained("digits", trainer_devices=2), two_ranks), *SHORT, launch="lightning",
    ),
    **{
        f"torchrun --nnodes 2 --node_rank {node} --master_addr 10.0.0.1 --master_port 29500 --nproc_per_node 4 "
        "train.py --config configs/cifar10.yaml --num_nodes 2 --devices 4 --strategy ddp": command(
            every(trained("cifar10", trainer_num_nodes=2, trainer_devices=1), two_ranks),
            *SHORT, *CIFAR10_HERE, "--devices", "1", "--accelerator", "cpu", launch="ranks", env=TWO_NODES,
            why="two machines of 4 GPUs: the two lines are one job of two 1-device nodes, the torchrun job's 2 CPU "
            "ranks in the environment `torchrun --nnodes 2 --nproc_per_node 1` gives its workers (node rank = "
            f"rank; tests/cli/test_launchers.py starts two torchruns); {CIFAR10_WHY}",
        )
        for node in (0, 1)
    },
    **{
        f"{launcher} -m diffusion.sample --ckpt last.ckpt --num_samples 50000 --devices 8 --out samples/": command(
            every(samples(8, (8, 8, 1)), two_ranks), "--num_samples", "8", "--steps", "2", *TWO_CPU_RANKS,
            inputs={"last.ckpt": Output(TRAIN, LAST)}, launch="ranks", why=f"8 GPUs: {TWO_RANKS_WHY}",
        )
        for launcher in ("python", "torchrun --nproc_per_node 8")
    },
    # ---- docs/training.md ----
    "python train.py --trainer.logger lightning.pytorch.loggers.CSVLogger --trainer.logger.init_args.save_dir runs "
    "--trainer.logger.init_args.name digits": command(every(trained("digits"), csv_log), *SHORT),
    "python train.py --trainer.logger lightning.pytorch.loggers.WandbLogger --trainer.logger.init_args.project "
    "digits --trainer.logger.init_args.offline true": command(
        every(a_checkpoint_under("runs/digits"), wandb_offline_run), *SHORT, context=wandb_run_ends,
    ),
    "python train.py --trainer.logger lightning.pytorch.loggers.MLFlowLogger --trainer.logger.init_args.save_dir "
    "mlruns --trainer.logger.init_args.experiment_name digits": command(a_checkpoint_under("mlruns"), *SHORT),
}
# fmt: on


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory, COMMANDS, PRINTED, MAINS)


# ---- the tests -------------------------------------------------------------------------------------------------
def test_every_printed_command_has_an_entry():
    """A command a document prints and COMMANDS lacks fails here, and so does an entry no document prints."""
    printed = {text: document for document, text, _ in python_command_lines()}
    missing = [f"{printed[text].relative_to(REPO)}: {text}" for text in printed if text not in COMMANDS]
    how_to_add = (
        "Give each an entry in COMMANDS (tests/test_documented_commands.py), keyed by its text as printed: "
        "`'<text>': command(<check of what it writes>, <flags appended to shorten it>, inputs={'<path it reads>': "
        "Output('<the documented command that writes it>') or a maker}, why='<what stands in, where it cannot run "
        "here as printed>')`."
    )
    assert not missing, "documented commands that no test runs:\n  " + "\n  ".join([*missing, how_to_add])
    stale = [text for text in COMMANDS if text not in printed]
    assert not stale, f"entries of COMMANDS that no document prints any more (remove them): {stale}"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(text, id=text, marks=[pytest.mark.multiprocess] if entry.launch != "in_process" else [])
        for text, entry in COMMANDS.items()
    ],
)  # fmt: skip
def test_the_documented_command_runs(text, runs):
    ran = runs(text)
    print(runs.how(text))
    where = ran.folder or "no folder: not run"
    assert ran.code == 0, f"{runs.how(text)}\nin {where}\n{ran.error}\n{ran.output[-4000:]}"
    COMMANDS[text].check(ran)
