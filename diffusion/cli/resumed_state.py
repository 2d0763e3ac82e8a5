"""A resume's checks of the checkpoint against the run it continues (train.py's `--ckpt_path`).

What a checkpoint itself says about the training it continues, read where the run's config.yaml cannot say it: a
checkpoint copied out of its run folder still holds its post-hoc EMA profiles (the EMA callback's state), and a
resume without them would drop them without a word; a `python -m diffusion.phema` output holds a reconstruction as
its EMA weights, which a resume would take for the run's EMA and average on from. These take the checkpoint's
contents as `resolve_resume` read them (once) and the parsed config, before any class is built, so a refusal comes
before any work and under --print_config too.

Once the classes are built: the checkpoint's weights fit the module, and its samples' shape is the data's
(`check_resume_fits`); steps are left to train (`check_steps_left`); the run's config.yaml and the command line
agree on every setting that changes what is trained (`check_same_training_settings`)."""

from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from diffusion.cli.legacy import same_class
from diffusion.errors import UserError, WeightsDoNotFit, check_weights_fit
from diffusion.training.checkpoint_files import check_written_by_train
from diffusion.training.module import DiffusionModule
from diffusion.training.run_folders import run_folder_of

PHEMA_OUTPUT = "post_hoc_ema"  # the key diffusion.cli.phema adds to the checkpoint it writes: what it holds


def post_hoc_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The post-hoc EMA's state in a checkpoint (the EMA callback's `post_hoc`: step, sigma_rels, profiles), None
    when it was trained without post-hoc EMA. Found by its content, whatever the callback's state key."""
    callbacks = checkpoint.get("callbacks")
    if not isinstance(callbacks, dict):
        return None
    for state in callbacks.values():
        post_hoc = state.get("post_hoc") if isinstance(state, dict) else None
        if isinstance(post_hoc, dict) and "sigma_rels" in post_hoc:
            return post_hoc
    return None


def _recorded_dirpath(checkpoint: dict[str, Any]) -> str | None:
    """The checkpoints folder the checkpoint's run saved into (ModelCheckpoint's state), when it still exists."""
    for state in (checkpoint.get("callbacks") or {}).values():
        dirpath = state.get("dirpath") if isinstance(state, dict) else None
        if isinstance(dirpath, str) and Path(dirpath).is_dir():
            return dirpath
    return None


def check_not_a_phema_output(checkpoint: dict[str, Any], path: str) -> None:
    """Refuse to resume a phema output: its EMA weights ("state_dict") are a reconstruction from the snapshots,
    not the run's EMA, and a resumed run would go on averaging from them as if they were."""
    made = checkpoint.get(PHEMA_OUTPUT)
    if not isinstance(made, dict):
        return
    sigma_rel, step = made.get("sigma_rel"), made.get("step")
    what = f"sigma_rel {sigma_rel:g} at step {step}" if isinstance(sigma_rel, float) else f"step {step}"
    folder = _recorded_dirpath(checkpoint)
    own = f" (in {folder})" if folder else ""
    raise UserError(
        f"--ckpt_path {path} is a post-hoc EMA reconstruction (python -m diffusion.phema, {what}), "
        "not a training state: its EMA weights are the reconstruction's, "
        "and a resumed run's EMA would go on from them",
        f"resume the run's own checkpoint{own}, or start a new run from the reconstructed weights: "
        f"--model.init_from {path} (without --ckpt_path)",
    )


def _config_records_post_hoc(path: str) -> bool:
    """Whether the run folder the checkpoint sits in has a config.yaml that records the post-hoc EMA settings: then
    the comparison of the whole config (`check_same_training_settings`) names every setting that differs."""
    run = run_folder_of(path)
    if run is None or not run.config_file.is_file():
        return False
    saved = yaml.safe_load(run.config_file.read_text()) or {}
    ema = saved.get("ema") if isinstance(saved, dict) else None
    return isinstance(ema, dict) and "post_hoc" in ema and "sigma_rels" in ema


def _floats(values: Any) -> list[float] | None:
    try:
        return [float(value) for value in values]
    except (TypeError, ValueError):
        return None


def check_post_hoc_kept(checkpoint: dict[str, Any], path: str, config: Namespace) -> None:
    """Refuse a resume that would drop or change the checkpoint's post-hoc EMA profiles (--ema.post_hoc false, or
    other --ema.sigma_rels), read from the checkpoint itself when no config.yaml of its run records them (a
    checkpoint copied out of its run folder): the same refusal as the run's config.yaml gives in its folder."""
    state = post_hoc_state(checkpoint)
    ema = config.get("ema")
    if state is None or ema is None or _config_records_post_hoc(path):
        return
    theirs, ours = _floats(state["sigma_rels"]), _floats(ema.get("sigma_rels") or ())
    if not ema.get("post_hoc"):
        off = ema.get("post_hoc")
        shown = (
            f"--ema.post_hoc True there, {off!r} here: this run would drop the post-hoc EMA profiles it holds"
        )
    elif theirs is not None and theirs != ours:
        shown = (
            f"--ema.sigma_rels {theirs} there, {ours} here: the post-hoc EMA profiles it holds are not these"
        )
    else:
        return  # the same profiles: they go on
    flags = "--ema.post_hoc true"
    if theirs is not None and theirs != ours:
        flags += f" --ema.sigma_rels [{','.join(f'{value:g}' for value in theirs)}]"
    raise UserError(
        f"--ckpt_path {path} belongs to a run trained with other settings: {shown}",
        f"resume it with its post-hoc EMA: {flags}, or start a new run from its weights: --model.init_from {path} "
        "(without --ckpt_path)",
    )


def _plain(value: Any) -> Any:
    """A jsonargparse Namespace (a network's config as the CLI built it) as the dict a checkpoint stores."""
    as_dict = getattr(value, "as_dict", None)
    return as_dict() if callable(as_dict) else value


def network_differences(saved: Any, current: Any) -> list[str]:
    """'channels 8 in the checkpoint, 16 now' for each network setting (init_args) that differs, or the two
    network classes."""
    saved, current = _plain(saved), _plain(current)
    if not (isinstance(saved, dict) and isinstance(current, dict)):
        return []
    differences = []
    saved_path, current_path = (str(c.get("class_path", "?")) for c in (saved, current))
    if not same_class(saved_path, current_path):  # the settings of two classes do not compare
        saved_class, current_class = (path.rsplit(".", 1)[-1] for path in (saved_path, current_path))
        return [f"the network {saved_class} in the checkpoint, {current_class} now"]
    saved_args, current_args = saved.get("init_args") or {}, current.get("init_args") or {}
    for key in sorted(saved_args.keys() & current_args.keys()):
        if saved_args[key] != current_args[key]:
            differences.append(f"{key} {saved_args[key]} in the checkpoint, {current_args[key]} now")
    return differences


def check_resume_fits(checkpoint: dict[str, Any], path: str, module: DiffusionModule) -> None:
    """The checkpoint to resume holds this module's weights, by name and shape; else name the network settings
    that differ, and the two ways on that work."""
    check_written_by_train(checkpoint, path, "--ckpt_path")
    hparams = checkpoint.get("hyper_parameters", {})
    try:
        check_weights_fit(module, checkpoint["state_dict"], f"--ckpt_path {path}", "")
    except WeightsDoNotFit as misfit:
        weights, cause = misfit.summary, misfit
    else:
        # A UNet's weights fit samples of any size: a run of 16x16 digits went on at 8x8 without a word, from its
        # own config of a version whose `image_size: null` meant 16 (the native 8 now).
        trained = tuple(hparams.get("sample_shape") or ())
        if trained and trained != tuple(module.sample_shape):
            raise UserError(
                f"--ckpt_path {path} trained on samples of shape {trained}, and the data now gives "
                f"{tuple(module.sample_shape)}",
                "resume it on the data it trained on"
                + (f" (e.g. --data.image_size {trained[-1]})" if len(trained) == 3 else "")
                + ", or train this data as a new run, without --ckpt_path (--model.init_from starts it from "
                "these weights)",
            )
        return
    settings = network_differences(hparams.get("network"), module.hparams.get("network"))
    if tuple(hparams.get("sample_shape") or ()) != tuple(module.sample_shape):
        settings.append(
            f"samples of shape {hparams.get('sample_shape')} in the checkpoint, {module.sample_shape} now"
        )
    differences = "; ".join(settings) or f"the network {type(module.network).__name__}"
    run = run_folder_of(path)
    own = (
        f"--config {run.config_file} with no flag that changes these"
        if run is not None and run.config_file.is_file()
        else "the config of the run that saved it"
    )
    raise UserError(
        f"--ckpt_path {path} is from a run with another network: {differences} ({weights})",
        f"resume it with its own settings ({own}), or train the changed network as a new run, without "
        "--ckpt_path (its weights do not fit it, so neither does --model.init_from)",
    ) from cause


def check_steps_left(checkpoint: dict[str, Any], max_steps: int) -> None:
    """A resumed run has steps left to train: Lightning would stop at once, exit 0 and add files to the run."""
    step = int(checkpoint.get("global_step", 0))
    if max_steps != -1 and max_steps <= step:
        raise UserError(
            f"--max_steps {max_steps} is not past step {step} of the checkpoint to resume: it would train nothing",
            f"pass --max_steps > {step} to train on",
        )


# ---- the right run: settings a resumed run must share with the run it continues ---------------------------
# Everything in the groups of TRAINING_GROUPS and the keys of TRAINING_KEYS changes what is trained (network,
# schedule, loss, optimizer and lr, data, batch, EMA, noise seed), except what NOT_TRAINING names: how to sample
# (the whole `model.sampling` group), where the first weights came from, whether and how the training step is
# compiled, how to read the data and how often to keep EMA snapshots may change on resume. Keys are exact (a group
# is its key and the keys under it, never a prefix of a longer name), so a new setting is a training setting until
# it is listed here. How long to train, how often to validate, sample or save, and the world size (with the warning
# in `DiffusionModule`) are trainer settings outside these groups.
TRAINING_GROUPS = ("model", "data", "ema")
TRAINING_KEYS = frozenset({
    "seed_everything", "trainer.accumulate_grad_batches", "trainer.gradient_clip_val",
    "trainer.gradient_clip_algorithm", "trainer.precision",
})  # fmt: skip
NOT_TRAINING_GROUPS = ("model.sampling",)
NOT_TRAINING = frozenset({
    "model.init_from",
    "model.compile_training", "model.compile", "model.compile_mode", "model.compile_channels_last",
    "data.init_args.num_workers", "data.init_args.verify",
    "ema.snapshot_every", "ema.max_snapshot_gb",
})  # fmt: skip


def _in_group(key: str, groups: tuple[str, ...]) -> bool:
    return any(key == group or key.startswith(f"{group}.") for group in groups)


def is_training_setting(key: str) -> bool:
    """Whether a flattened config key (`model.lr`, `data.init_args.batch_size`) changes what a run trains."""
    if key in NOT_TRAINING or _in_group(key, NOT_TRAINING_GROUPS):
        return False
    return key in TRAINING_KEYS or _in_group(key, TRAINING_GROUPS)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differing_training_settings(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) for every training setting that differs between two configs as
    LightningCLI dumps them (a run's config.yaml). Keys that one of them lacks (a config written by an older
    version of the code) are not compared."""
    saved, current = flatten(saved), flatten(current)
    return [
        (key, saved[key], current[key])
        for key in sorted(saved.keys() & current.keys())
        if is_training_setting(key)
        and saved[key] != current[key]
        and not (key.endswith("class_path") and same_class(saved[key], current[key]))
    ]


def check_same_training_settings(path: str, current_config: str, sample_shape: tuple[int, ...] = ()) -> None:
    """Refuse to resume a run with settings that change what it trains (network, data, optimizer, ...), naming
    them: the optimizer state, EMA and data order in the checkpoint belong to the run's own settings. An image
    size given where the run's config left it unset (null: the data set's default) is the same setting when it is
    the size the run trained at (`sample_shape`, its checkpoint's and the data's: `check_resume_fits`): digits'
    default was 16 when some runs were written, 8 now."""
    run = run_folder_of(path)
    if run is None or not run.config_file.is_file():
        return  # not in a run folder, or a run made without the CLI: nothing to compare with
    saved = yaml.safe_load(run.config_file.read_text()) or {}
    differences = [
        (key, theirs, ours)
        for key, theirs, ours in differing_training_settings(saved, yaml.safe_load(current_config) or {})
        if not (key == "data.init_args.image_size" and theirs is None and sample_shape[-1:] == (ours,))
    ]
    if not differences:
        return
    shown = "; ".join(
        f"--{key.replace('.init_args.', '.')} {theirs!r} there, {ours!r} here"
        for key, theirs, ours in differences[:4]
    )
    more = f" (and {len(differences) - 4} more)" if len(differences) > 4 else ""
    raise UserError(
        f"--ckpt_path {path} belongs to a run trained with other settings: {shown}{more}",
        f"resume it with its own config: --config {run.config_file} (flags such as --max_steps may follow), "
        f"or start a new run from its weights: --model.init_from {path} (without --ckpt_path)",
    )
