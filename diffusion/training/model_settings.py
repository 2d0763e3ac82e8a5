"""A model file's settings checked before the model is built from them: a checkpoint's ``hyper_parameters`` or an
export's ``config.json`` (`diffusion.training.exported`), refused by the checks building the model runs (the
schedule's, the network's, DiffusionModule's own), said as the file's keys (`<file>: prediction_type='q' is not
supported — <the file's fix>`), not as arguments or flags the user never passed.

Read by `load_checkpoint` before Lightning builds the module (whose jsonargparse check of a checkpoint's settings
said `Parser key "module.prediction_type": ...`, naming no file), by the commands before any work
(`model_hyperparameters`), and whenever an export's config.json is read (`read_export_config`).
"""

import inspect
import warnings
from typing import Any

import torch

from diffusion.core.sampling_dicts import sampling_options_from
from diffusion.core.schedule import schedule_betas
from diffusion.errors import COMMAND, InvalidValue, UserError, WrongType, check_whole_number, said
from diffusion.generation.render import check_normalization
from diffusion.models import MLP, UNet
from diffusion.models.checks import SampleShapeMisfit
from diffusion.training.module import DiffusionModule

NETWORKS: dict[str, type[torch.nn.Module]] = {"UNet": UNet, "MLP": MLP}

# What a model's file may leave out: DiffusionModule's own defaults.
MODULE_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(DiffusionModule.__init__).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}
# The file's settings DiffusionModule's checks are run on: its arguments but the network (built from its own
# settings) and init_from (a source of weights, never saved: a file holding one would load weights while checked).
# A key it does not take is not checked here: Lightning leaves it out, an export's is refused by `load_export`.
CHECKED = set(MODULE_DEFAULTS) - {"init_from"}


def check_model_settings(hparams: dict[str, Any], source: str, fix: str) -> None:
    """The settings of a model's file (`hparams`, a checkpoint's hyper_parameters) refused by the checks building
    the model runs, naming `source`, `fix` (what to do about the file) their fix: first those commands read before
    building it (the schedule, whose length bounds --steps; the sample shape; the network's classes; the
    normalization), then the network's own checks (`check_network_settings`), then DiffusionModule's on every
    other setting (`check_module_settings`). An edited config.json's `"num_timesteps": "abc"` ended in int()'s
    traceback in the sample command, a normalization's scale of 0 in images of one colour."""
    try:
        schedule_of(hparams)
        shape = hparams.get("sample_shape", MODULE_DEFAULTS["sample_shape"])
        if not isinstance(shape, list | tuple) or not shape:
            raise WrongType("sample_shape", shape, "a list of sizes, e.g. [3, 32, 32]", fix)
        for index, size in enumerate(shape):
            check_whole_number(f"sample_shape[{index}]", size, 1)
        network = hparams.get("network")
        if not isinstance(network, dict):
            raise WrongType("network", network, "a mapping of class_path and init_args", fix)
        if not isinstance(network.get("init_args", {}), dict):
            raise WrongType(
                "network.init_args", network["init_args"], "a mapping of the network's settings", fix
            )
        classes = network.get("init_args", {}).get("num_classes")
        if classes is not None:  # the labels to sample are counted from it before the network is built
            check_whole_number("network.init_args.num_classes", classes, 1)
        sampling_options_from(hparams.get("sampling") or {}, "sampling")
        normalization = hparams.get("normalization", MODULE_DEFAULTS["normalization"])
        if normalization is not None:
            if not isinstance(normalization, dict):
                raise WrongType("normalization", normalization, "a mapping of 'shift' and 'scale'", fix)
            if missing := [
                repr(key) for key in ("shift", "scale") if key not in normalization
            ]:  # "is a dict"
                raise InvalidValue(f"normalization={normalization!r} has no {' and no '.join(missing)}", fix)
            check_normalization(normalization)
    except UserError as error:  # a file's settings: a ValueError, whichever kind its check was
        raise InvalidValue(f"{source}: {error.problem}", fix, error.owner) from error
    built = check_network_settings(network, source, fix)
    if built is not None:
        check_module_settings(hparams, built, source, fix)


def check_network_settings(network: dict[str, Any], source: str, fix: str) -> torch.nn.Module | None:
    """The network's own argument checks on the settings a model's file holds (`network`: its class_path and
    init_args), said as the file's keys: `<source>: network.init_args.channels='eight' is a str, ... — <fix>`, not
    as the flags that build a network on a command line (`--model.network.channels`), which sample has not. The
    network is built on the meta device (no memory, no weights drawn) and returned; a network not of this project's
    is the caller's (`load_from_checkpoint(path, network=...)`), not checked here (None)."""
    module, _, name = str(network.get("class_path")).rpartition(".")
    if name not in NETWORKS or not (module == "diffusion" or module.startswith("diffusion.")):
        return None
    try:
        with torch.device("meta"):
            return NETWORKS[name](**network.get("init_args", {}))
    except TypeError as error:  # a key the network does not take
        if isinstance(error, UserError):
            raise said_as_key(error, source, fix) from error
        raise InvalidValue(
            f"{source}: network.init_args holds a setting {name} does not take ({error})", fix
        ) from error
    except UserError as error:
        raise said_as_key(error, source, fix) from error


def check_module_settings(hparams: dict[str, Any], network: torch.nn.Module, source: str, fix: str) -> None:
    """DiffusionModule's own checks (its constructor's: every setting's type, choice and range, and the settings
    against each other and against the network) on the settings of a model's file, said as the file's keys:
    `<source>: prediction_type='q' is not supported — <fix>`. The module is built from them around `network`
    (built on the meta device by `check_network_settings`) and dropped; the notes it says of unused options are
    said when the model is built for use."""
    settings = {key: value for key, value in hparams.items() if key in CHECKED}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            DiffusionModule(network, **settings)
    except UserError as error:
        raise InvalidValue(f"{source}: {problem_as_key(error, type(network))}", fix) from error


def problem_as_key(error: UserError, network: type) -> str:
    """What `error`, a check of DiffusionModule's arguments, finds wrong, said of a file's keys: its options as
    the keys (`{--lr}` as lr, the network's `{--in_channels}` as network.init_args.in_channels), a sample shape
    that does not fit the network said of sample_shape, not of "the data's samples"."""
    problem = error.problem
    if isinstance(error, SampleShapeMisfit) and error.argument is not None:
        problem = error.argument[0]

    def key(owner: type | str | None, option: str) -> str:
        if owner == COMMAND:
            return f"--{option}"
        if owner is network or owner == network.__name__:
            return f"network.init_args.{option}"
        return option

    return said(problem, key, error.owner)


def said_as_key(error: UserError, source: str, fix: str) -> InvalidValue:
    """A network's argument check said of the key `network.init_args.NAME` of the file `source`."""
    problem = said(error.problem, lambda owner, option: f"network.init_args.{option}")
    named = getattr(error, "name", None)
    if isinstance(named, str) and problem.startswith(f"{named}="):
        problem = f"network.init_args.{problem}"
    elif "network.init_args." not in problem:
        problem = f"network.init_args: {problem}"
    return InvalidValue(f"{source}: {problem}", fix)


def schedule_of(hparams: dict[str, Any]) -> torch.Tensor:
    """The float64 betas the settings `hparams` give (DiffusionModule's defaults for what they leave out)."""

    def setting(name: str) -> Any:
        return hparams.get(name, MODULE_DEFAULTS[name])

    return schedule_betas(
        setting("beta_schedule"), setting("num_timesteps"), setting("beta_start"), setting("beta_end"),
        setting("zero_terminal_snr"), setting("trained_betas"),
    )  # fmt: skip
