"""What a checkpoint itself says about the training it continues, read where the run's config.yaml cannot say it:
a checkpoint copied out of its run folder still holds its post-hoc EMA profiles (the EMA callback's state), and a
resume without them would drop them without a word; a `python -m diffusion.phema` output holds a reconstruction
as its EMA weights, which a resume would take for the run's EMA and average on from.

The checks take the checkpoint's contents as `resolve_resume` read them (once) and the parsed config, before any
class is built, so a refusal comes before any work and under --print_config too."""

from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from diffusion.errors import UserError
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
