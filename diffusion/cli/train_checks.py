"""What train.py checks before any training time is spent, each failure one line naming the flag (a
UserError, `diffusion.errors`): option ranges (and the data module's and network's own range checks, reworded
with the flag), the network settings the data decides, the weights to start from or resume (a diffusers model's
own settings taken with its weights), the output folders, and the world size under torchrun."""

import inspect
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from jsonargparse import Namespace
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_info

from diffusion.cli.command_line import SayOption, Written, as_flag, where_written, written_as
from diffusion.cli.flag_names import flag_text, prefix_of
from diffusion.cli.flags import check_writable_folder, out_of_range
from diffusion.cli.legacy import class_at, same_class
from diffusion.cli.training_run import callbacks_of
from diffusion.errors import (
    OutOfRange,
    UserError,
    WrongType,
    said,
)
from diffusion.models import UNet
from diffusion.models.checks import forward_parameters
from diffusion.training.atomic_writes import check_replaceable, naming_a_refusing_folder
from diffusion.training.callbacks.sample_quality import FID, KID, SampleQualityCallback
from diffusion.training.checkpoint_files import read_checkpoint
from diffusion.training.exported import check_init_from_export
from diffusion.training.from_diffusers import init_settings
from diffusion.training.loading import model_source
from diffusion.training.module import TRAIN_LOSS, VAL_LOSS
from diffusion.training.run_folders import CHECKPOINTS, run_folder_of


def resolve_init_from(config: Namespace) -> None:
    """--model.init_from as what the path is (a diffusers folder, an export, a checkpoint or a folder holding one),
    decided where every command decides it, so a broken diffusers folder is reported as one; checked against the
    network."""
    kind, source = model_source(config.model.init_from, "--model.init_from")
    if kind == "diffusers":
        take_diffusers_settings(config)
    elif kind == "export":  # its one set of weights, as a checkpoint's network weights
        weights = check_init_from_export(source, class_at(config.model.network.class_path))
        config.model.init_from = str(source)
        rank_zero_info(f"--model.init_from {source}: starting from the {weights} weights the export holds")
    else:
        config.model.init_from = str(source)
        check_init_from(config.model.init_from, config.model.network.class_path)


def check_init_from(path: str, network_class: str) -> None:
    """The weights to start from can be read, and a checkpoint of this project holds the same network class."""
    checkpoint = read_checkpoint(path, "--model.init_from")
    saved = checkpoint.get("hyper_parameters", {}).get("network")
    saved_class = saved.get("class_path") if isinstance(saved, dict) else None
    if saved_class and not same_class(saved_class, network_class):
        raise UserError(
            f"--model.init_from {path} holds {saved_class.rsplit('.', 1)[-1]} weights (of a run on samples of "
            f"shape {checkpoint['hyper_parameters'].get('sample_shape')}), but this config's network is "
            f"{network_class.rsplit('.', 1)[-1]}",
            "start from a checkpoint of the same kind of run, or pass that run's config (--config)",
        )


def check_monitored_metric(trainer: Trainer, monitor: str | None) -> None:
    """--checkpoint.monitor names a metric the run logs: Lightning finds out only at the first validation, when
    the training before it is lost. A callback from outside this project may log more, so with one the check
    is left to Lightning."""
    modules = [type(callback).__module__ for callback in callbacks_of(trainer)]
    if monitor is None or any(not name.startswith(("diffusion.", "lightning.")) for name in modules):
        return
    logged = {TRAIN_LOSS, VAL_LOSS, "step", "epoch"}  # Lightning adds step and epoch
    for callback in callbacks_of(trainer):
        if isinstance(callback, SampleQualityCallback):
            logged |= {FID, KID} if callback.kid else {FID}
    if monitor not in logged:
        raise UserError(
            f"--checkpoint.monitor {monitor} is not a metric this run logs",
            f"pass one of {', '.join(sorted(logged))} ({FID} needs the SampleQualityCallback, {KID} one that "
            "computes KID, i.e. without reference_stats)",
        )


def check_output_folders(
    trainer: Trainer, checkpoint_dirpath: str | None, resumed: str | None = None
) -> None:
    """The run folder and the checkpoint folder can be written, before any training time is spent: the runs'
    folder, and a resumed run's own folders (`resumed`: its checkpoint), which exist and may refuse writes."""
    save_dir = getattr(trainer.logger, "save_dir", None)
    if save_dir:
        check_writable_folder(save_dir, "--trainer.logger.init_args.save_dir")
    else:
        check_writable_folder(trainer.default_root_dir, "--trainer.default_root_dir")
    if checkpoint_dirpath:
        check_writable_folder(checkpoint_dirpath, "--checkpoint.dirpath")
    run = run_folder_of(resumed) if resumed else None
    # The run folder and each folder of it (checkpoints/, samples/, post_hoc_ema/, ...: all the run's own writes)
    run_path = run.path if run is not None and run.path.is_dir() else None
    own = [run_path, *sorted(p for p in run_path.iterdir() if p.is_dir())] if run_path is not None else []
    for folder in own:
        if folder.is_dir():  # a probe file, as the run's own writes would be (root passes os.access)
            with (
                naming_a_refusing_folder(folder, "the resumed run's files"),
                tempfile.TemporaryFile(dir=folder),
            ):
                pass
    for replaced in [run_path / CHECKPOINTS / "last.ckpt", run_path / "loss.png"] if run_path else []:
        check_replaceable(replaced)  # an immutable file: the save at the end would fail


def check_torchrun_world_size(num_devices: int, num_nodes: int) -> None:
    """Under torchrun, the Trainer must use exactly the processes torchrun started.

    Lightning checks this only at fit time and only for a multi-device strategy: with the default
    `--devices auto` on CPU (or `--devices 1`) each of torchrun's processes silently trains its own copy of
    the model, all writing the same run folder. Fail at startup instead, saying which flags to pass.
    """
    if not TorchElasticEnvironment.detect():
        return
    world_size = int(os.environ["WORLD_SIZE"])
    if num_devices * num_nodes == world_size:
        return
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    raise UserError(
        f"torchrun started WORLD_SIZE={world_size} processes ({per_node} per node), but the Trainer is set to "
        f"devices={num_devices} x num_nodes={num_nodes} = {num_devices * num_nodes}",
        f"Pass --devices {per_node} --num_nodes {world_size // per_node}: --devices must equal torchrun's "
        "--nproc_per_node and --num_nodes its --nnodes",
    )


def check_torchrun_restarts() -> None:
    """torchrun may restart the job (--max-restarts) only on a fresh rendezvous store.

    Since torch 2.5 torchrun's agent shares its store with the ranks (TORCHELASTIC_USE_AGENT_STORE) and keeps it
    across restarts: the restarted ranks' process group can read the lost ranks' addresses there and wait for
    them, a hang of the 30-minute start-up timeout, NCCL and gloo alike (pytorch/pytorch#135712; here 4
    restarts of 5 of two gloo ranks never connected). Refused at the first start, when the command can still be fixed, not at the restart.
    """
    restarts = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")
    if not TorchElasticEnvironment.detect() or restarts == "0":
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise UserError(
            f"torchrun --max-restarts {restarts} shares its rendezvous store with the ranks, and a restart would "
            "find the lost ranks' addresses there and hang (pytorch/pytorch#135712)",
            "start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and a c10d rendezvous (one machine: no "
            "--master_port; several: --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id NAME)",
        )


def naming_the_flag(
    error: BaseException, groups: dict[type, str], say: SayOption = as_flag, config: Namespace | None = None
) -> UserError | None:
    """A range check (`OutOfRange`) of a class the CLI built, said of the option the user wrote: '--data.batch_size
    0 is out of range (must be >= 1) — <the check's fix>'. The option is the owner's (its group: `groups`, the
    data module and network chosen, then flag_names' table), or, for a check that names no owner (a sampler's
    `eta`, in `--model.sampling` or `--sample_grid.sampling`), the one option of `config` of that name holding
    that value. None for any other error, and for a check of one of the class's parts (a ResBlock's channels are
    no flag of the user's). jsonargparse may wrap the class's error (a union of types): the chain of causes is
    searched, by type."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OutOfRange | WrongType):
            key = _option_checked(cause, groups, config)
            if key is None:
                return None
            if isinstance(
                cause, WrongType
            ):  # `--model.network.init_args.channels null`: the class's own name
                shown = "null" if cause.value is None else cause.value
                return UserError(f"{say(key, shown)} is not {cause.expected}", fix_as_flags(cause, groups))
            return out_of_range(cause, say(key, cause.value), fix_as_flags(cause, groups))
        cause = cause.__cause__ or cause.__context__
    return None


def class_error_placeholders_written(
    error: UserError, groups: dict[type, str], written: Sequence[Written]
) -> UserError:
    """A class's own check (not a range: `naming_the_flag`) with the options of what is wrong said as the user gave
    them, a flag or a config file's key (`run.yaml: model.sampling.steps 5000 is more steps ...`); its fix's as
    flags."""

    def as_given(owner: type | str | None, name: str) -> str:
        flag = flag_text(owner, name, groups)
        return written_as(written, flag[2:]) if flag.startswith("--") else flag

    return UserError(said(error.problem, as_given, error.owner), fix_as_flags(error, groups))


def class_error_as_written(
    error: BaseException, groups: dict[type, str], written: Sequence[Written], config: Namespace
) -> UserError | None:
    """An error a class the command built from its flags raised, said of the options as the user gave them: a
    range check by `naming_the_flag`, another check of the class's by `class_error_placeholders_written`, a data
    module without what train.py reads of one by `data_lacking`; None for any other."""
    named = naming_the_flag(error, groups, where_written(written), config)
    if named is None and isinstance(error, UserError):
        named = class_error_placeholders_written(error, groups, written)
    return named or data_lacking(error, groups, written, config)


DATA_NEEDS = ("sample_shape", "normalization")  # what train.py reads of a data module (docs/architecture.md)


def data_lacking(
    error: BaseException, groups: dict[type, str], written: Sequence[Written], config: Namespace
) -> UserError | None:
    """A data module without `sample_shape` (a LightningDataModule of another project): the link that sizes the
    network from it failed, wrapped by jsonargparse (`Call to compute_fn of link ... failed`). Found by its cause,
    an AttributeError of the data module built; None for any other error."""
    cause: BaseException | None = error
    while cause is not None and not (
        isinstance(cause, AttributeError) and groups.get(type(getattr(cause, "obj", None))) == "data"
    ):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    data = getattr(cause, "obj", None)
    lacking = [name for name in DATA_NEEDS if not _has(data, name)] or [str(getattr(cause, "name", "?"))]
    return UserError(
        f"{written_as(written, 'data')} {config['data'].class_path}: {type(data).__name__} has no "
        f"{' and no '.join(lacking)}, which train.py reads of its data (the shape of one sample, and how model "
        "units map to data units)",
        "pass one of the project's data modules (diffusion.data.ImageDataModule, diffusion.data.VectorDataModule, "
        "or a diffusion.data.SplitDataModule of your dataset), or give yours sample_shape and normalization and "
        "have it yield diffusion.data.Batch(x, index[, label])",
    )


def _has(value: Any, name: str) -> bool:
    try:
        return hasattr(value, name)
    except Exception:  # a property that fails: there, but broken (its own error comes when it is read)
        return True


def check_network_class(class_path: str) -> None:
    """The network chosen keeps the networks' call, `forward(x, t)` (and `y`, the labels, for class-conditional
    data): a module of another kind (`torch.nn.Linear`) failed at the first step with torch's TypeError."""
    network = class_at(class_path)
    takes = forward_parameters(network) if isinstance(network, type) else None
    if takes is not None:
        raise UserError(
            f"--model.network {class_path}: {network.__name__} is no noise-prediction network (its forward takes "
            f"{takes}, not (x, t, y=None))",
            "pass a diffusion.models network such as diffusion.models.UNet (diffusion.models.MLP for vectors), "
            "or a torch.nn.Module whose forward takes (x, t, y=None)",
        )


def fix_as_flags(error: UserError, groups: dict[type, str]) -> str:
    """The error's fix with its options said as flags (a fix is something to type, whatever set the value)."""
    return said(error.fix, lambda owner, name: flag_text(owner, name, groups), error.owner)


def _option_checked(
    error: OutOfRange | WrongType, groups: dict[type, str], config: Namespace | None
) -> str | None:
    group = prefix_of(error.owner, groups) if error.owner is not None else None
    if group:
        return f"{group}.{error.name}"
    if error.owner is not None or config is None:  # a class's part, no option of the user's
        return None
    holding = [
        key
        for key, value in config.items()
        if f".{key.replace('.init_args.', '.')}".endswith(f".{error.name}") and _same(value, error.value)
    ]
    return holding[0] if holding else None


def _same(value: Any, checked: Any) -> bool:
    """The value an option holds is the one a check refused (NaN, which equals nothing, included)."""
    nan = (
        isinstance(value, float) and isinstance(checked, float) and math.isnan(value) and math.isnan(checked)
    )
    return nan or value == checked


DATA_SETS = {  # the network settings train.py takes from the data, and from what
    "in_channels": "the data's channels, --data.channels for images, --data.dim for vectors",
    "num_classes": "the data's classes with --data.conditional true, else none",
    "out_channels": "the data's channels, twice with --model.variance learned_range",
}


def settings_written(config: Any, defaults: Any) -> dict[str, Any]:
    """The network settings the data decides (DATA_SETS) as the parsed `config` holds them where they differ from
    what the parser fills in unwritten: the chosen network class's own default, or the parser's default network's
    (`defaults`; a --config that switches the class keeps the arguments the two classes share). So a value the user
    wrote, in whatever form the parser read it (a flag, a --config file, a group's file such as --model.network
    net.yaml, JSON); one written equal to such a default reads as unwritten, and the data's value is taken, as for
    any unwritten one."""
    network = config.get("model.network")
    init_args = network.get("init_args") if network is not None else None
    if init_args is None:
        return {}
    parameters = inspect.signature(class_at(network.class_path)).parameters
    default_args = defaults.get("model.network.init_args") or {}
    return {
        name: init_args[name]
        for name in DATA_SETS
        if name in parameters
        and name in init_args
        and init_args[name]
        not in (parameters[name].default, default_args.get(name, parameters[name].default))
    }


def check_settings_from_the_data(
    written: dict[str, Any], derived: dict[str, Any], say: SayOption = as_flag
) -> None:
    """The network settings train.py links from the data were not written as something else: the link would
    replace the user's value without a word."""
    for name, value in written.items():
        if value != derived[name]:
            shown = "unset" if derived[name] is None else derived[name]
            raise UserError(
                f"{say(f'model.network.{name}', value)}: the data sets it ({shown} here: {DATA_SETS[name]})",
                f"leave --model.network.{name} out",
            )


def take_diffusers_settings(config: Any) -> None:
    """--model.init_from a diffusers folder: train its network and schedule (read from its configs, whatever the
    recipe says)."""
    settings = init_settings(config.model.init_from, "--model.init_from")
    assert settings is not None, "model_source said diffusers"
    if not issubclass(class_at(config.model.network.class_path), UNet):
        raise UserError(
            f"--model.init_from {config.model.init_from} is a diffusers UNet, but this config's network is "
            f"{config.model.network.class_path}", "fine-tune it with an image recipe (a UNet network)",
        )  # fmt: skip
    for key, value in settings.pop("model.network")["init_args"].items():
        config.model.network.init_args[key] = value
    for key, value in settings.items():
        config[key] = value
    rank_zero_info(
        f"--model.init_from {config.model.init_from}: the network and schedule are the diffusers model's "
        f"(UNet {dict(config.model.network.init_args)}, {config.model.beta_schedule} betas over "
        f"{config.model.num_timesteps} steps, {config.model.prediction_type} prediction)"
    )
