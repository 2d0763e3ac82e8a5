"""The command line: LightningCLI with shorthands, the default recipe and run folders.

`python train.py` trains the default recipe, `configs/digits.yaml`, whose values are written there only. The
code defaults are Ho et al.'s (800k steps, Adam 2e-4 with 5000 warmup steps, ...) and this project's
conventions (TensorBoard runs under `runs/`, gradient clipping 1, validation every N steps); a recipe holds
what differs. Every Trainer, model and data argument is a flag (`--trainer.*`, `--model.*`, `--data.*`,
`--ema.*`, `--checkpoint.*`, `--sample_grid.*`) and the common Trainer flags have shorthands (`--devices 4`).

What can be checked before training is (option ranges, image size against the network, output folders, the
checkpoint to resume or start from: `diffusion.cli.train_checks`), and a user error ends in one line
(`diffusion.errors`).
"""

import operator
import sys
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

from jsonargparse import SUPPRESS, Namespace
from lightning.pytorch import LightningDataModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from diffusion.cli.command_line import SayOption, as_flag, where_written
from diffusion.cli.flags import DEBUG_VARIABLE, add_debug_flag, check_path_given, cpu_mixed_precision_note
from diffusion.cli.jsonargparse_internals import drop_print_config_request, take_negative_numbers_as_values
from diffusion.cli.legacy import accept_moved_class_paths, class_at
from diffusion.cli.parse_errors import CommandLine, link_arguments, parsed_command_line
from diffusion.cli.process_group import check_other_machines_named, closing_process_group
from diffusion.cli.reporting import reporting_user_errors
from diffusion.cli.resume import check_init_from_on_resume, resolve_resume, runs_own_init_from
from diffusion.cli.resumed_state import check_resume_fits, check_same_training_settings, check_steps_left
from diffusion.cli.train_checks import (
    check_monitored_metric,
    check_network_class,
    check_output_folders,
    check_settings_from_the_data,
    check_torchrun_restarts,
    check_torchrun_world_size,
    class_error_as_written,
    resolve_init_from,
    settings_written,
)
from diffusion.cli.train_warnings import CommandNote, notes_said_as_written, one_line_notes
from diffusion.cli.trainer_loggers import (
    allow_mlflow_file_store,
    check_logger_folders,
    check_logger_installed,
)
from diffusion.cli.trainer_options import (
    SHORTHANDS,
    TRAINER_DEFAULTS,
    check_hardware_flags,
    check_trainer_option_ranges,
    drop_ddp_on_one_device,
    expand_shorthands,
    runs_on_cpu,
    step_checkpoints_note,
    unused_root_dir_note,
    validation_off_note,
    warmup_note,
)
from diffusion.cli.training_run import (
    SaveConfigToRunFolder,
    callbacks_of,
    check_checkpoint_dirpath,
    chosen_resume,
    fit,
    log_learning_rate,
    refused_by_the_trainer,
    use_run_progress,
    with_default_config,
)
from diffusion.cli.written_twice import RENAMED_OPTIONS, take_old_names
from diffusion.core.sampling import SamplingOptions
from diffusion.errors import UserError
from diffusion.training.callbacks import EMA, Checkpoint, SampleGrid
from diffusion.training.callbacks.heartbeat import DEFAULT_DDP_TIMEOUT_S, Heartbeat
from diffusion.training.module import DiffusionModule

# LightningCLI's optimizer flags, not offered (DiffusionModule.configure_optimizers), and the flags that do their work.
CLASS_GROUPS = ("checkpoint", "ema", "sample_grid")  # the callbacks built from a group of flags (below)
NOT_OFFERED = {
    "optimizer": "--model.lr, --model.adam_betas and --model.weight_decay",
    "lr_scheduler": "--model.warmup_steps and --model.lr_schedule (constant or cosine)",
}
# The model's options the data sets, linked when the classes are built: what each is, how it is read from the data
# module. Written by the user, they are refused (jsonargparse named "data.sample_shape", no flag, or "<lambda>(data)").
SET_BY_THE_DATA = {
    "model.sample_shape": ("the shape of one sample: --data.channels and --data.image_size for images, --data.dim "
                           "for vectors", operator.attrgetter("sample_shape")),
    "model.normalization": ("the shift and scale that map the model's units back to the data's, as samples are "
                            "rendered", operator.attrgetter("normalization")),
    "model.class_names": ("the names of its classes, for class-conditional data: --data.conditional true",
                          lambda data: getattr(data, "class_names", None)),
}  # fmt: skip


class DiffusionCLI(LightningCLI):
    """LightningCLI for DiffusionModule and any LightningDataModule (no --config: the code defaults).

    `parser_kwargs` are merged into this CLI's own (`main` passes `exit_on_error=False`, so that a bad flag
    raises and is reported in one line rather than printing the usage block).
    """

    # Parsers built in this process, by what they were built from, each with a list naming the CLI using it now
    # (its links read that CLI's config): jsonargparse reading every signature is 0.12 s of a refused command
    # line's 0.3, paid once by a notebook's runs or the tests' (580 CLIs). Parsing leaves a parser as it was, save
    # for the --print_config request of a command line that failed (dropped on reuse). One CLI at a time, as a
    # process builds them; the oldest of more than 4 kinds goes (defaults whose repr differs at each call).
    _built_parsers: ClassVar[dict[str, tuple[LightningArgumentParser, list[weakref.ref]]]] = {}

    def __init__(
        self, args: list[str] | None = None, parser_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if args is None:  # from the command line: LightningCLI reads sys.argv itself
            sys.argv[1:] = expand_shorthands(sys.argv[1:])
        else:
            args = expand_shorthands(list(args))
        description = (
            "Train a DDPM. Without --config, trains configs/digits.yaml. Shorthands: "
            + ", ".join(f"--{name}" for name in SHORTHANDS)
            + " stand for --trainer.<name>; --ckpt_path last resumes the newest run of this name, auto this job's. "
            f"A user error ends in one line; --debug (or {DEBUG_VARIABLE}=1) shows its traceback."
        )
        self._resume_checkpoint: dict[str, Any] | None = None
        self._init_from_unread = False  # a resume's own --model.init_from (before_instantiate_classes)
        self._command_line: CommandLine | None = None
        self._said: SayOption = as_flag
        accept_moved_class_paths()  # configs written before the layered package name the old modules
        super().__init__(
            DiffusionModule,
            LightningDataModule,
            subclass_mode_data=True,
            run=False,
            seed_everything_default=0,
            # No flag taken by a prefix of its name: `--trainer.max_step 3` set max_steps, and its notes then named
            # the recipe's file as the value's source.
            parser_kwargs={"description": description, "allow_abbrev": False, **(parser_kwargs or {})},
            save_config_callback=SaveConfigToRunFolder,
            # A resumed run writes its config into the same folder.
            save_config_kwargs={"overwrite": True, "save_to_log_dir": False},
            trainer_defaults=TRAINER_DEFAULTS,
            # DiffusionModule configures its own Adam, warmup and schedule (--model.lr, --model.warmup_steps,
            # --model.lr_schedule, ...): LightningCLI's --optimizer and --lr_scheduler would replace them.
            auto_configure_optimizers=False,
            args=args,
            **kwargs,
        )

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        built_from = repr((
            type(self), add_subcommands, main_kwargs, subparser_kwargs, self.trainer_class, self.trainer_defaults,
            self.seed_everything_default, self.parser_class, self.auto_configure_optimizers,
        ))  # fmt: skip
        if built_from not in self._built_parsers:
            if len(self._built_parsers) >= 4:
                self._built_parsers.pop(next(iter(self._built_parsers)))
            self._parser_user = [weakref.ref(self)]
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
            self._built_parsers[built_from] = (self.parser, self._parser_user)
        self.parser, self._parser_user = self._built_parsers[built_from]
        self._parser_user[0] = weakref.ref(self)  # weak: a CLI the user drops goes, with its model and data
        drop_print_config_request(self.parser)  # an earlier command line's --print_config, never printed

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        take_negative_numbers_as_values(parser)  # `--model.lr -1e-3`
        parser.add_argument(
            "--ckpt_path", type=str | None, default=None,
            help="resume training from this checkpoint (its run's folder goes on); 'last' = the newest checkpoint (by "
            "step) of the newest run of this name; 'auto' = this job's own run (named by the logger's version, "
            "torchrun's run id or SLURM's job id), resumed, or started there when it has no checkpoint (restarts)",
        )  # fmt: skip
        parser.add_argument(
            "--ddp_timeout", type=float, default=DEFAULT_DDP_TIMEOUT_S,
            help="seconds a rank waits in a collective (DDP) before the job ends, naming the rank that stopped "
            "answering; raise it when rank 0 alone does long work, e.g. a first download in prepare_data",
        )  # fmt: skip
        add_debug_flag(parser)
        for name in NOT_OFFERED:  # in every config saved before they were withdrawn, as null
            parser.add_argument(f"--{name}", type=Any, default=None, help=SUPPRESS)
        parser.add_lightning_class_args(Checkpoint, "checkpoint")
        # No version counter: Lightning would write last-v1.ckpt beside last.ckpt whenever a resumed run's
        # checkpoint settings or folder differ from the saved ones; last.ckpt stays the newest instead.
        parser.set_defaults(
            {
                "checkpoint.save_last": True,
                "checkpoint.filename": "{step}",
                "checkpoint.enable_version_counter": False,
            }
        )
        parser.add_lightning_class_args(EMA, "ema")
        parser.add_lightning_class_args(SampleGrid, "sample_grid")
        parser.set_defaults(
            {
                "data": {"class_path": "diffusion.data.ImageDataModule"},
                "model.network": {"class_path": "diffusion.models.UNet"},
            }
        )
        # The data decides the shape of a sample, its normalization and class names, and the network's input width.
        for target, (what, compute) in SET_BY_THE_DATA.items():
            set_by = f"the data sets it ({what})"
            link_arguments(parser, "data", target, set_by, compute_fn=compute, apply_on="instantiate")
        for name, compute in self._network_settings_from_the_data().items():
            parser.link_arguments(
                "data", f"model.network.init_args.{name}", compute_fn=compute, apply_on="instantiate"
            )

    def _network_settings_from_the_data(self) -> dict[str, Callable[[Any], Any]]:
        """The network's input channels; its class embedding, sized by class-conditional data (--data.conditional
        true, --data.labels; other data: None, unconditional); its output channels, 2C for a model that learns its
        variance (--model.variance learned_range: the prediction, then the variance's v), else None (its input's).
        Linked at instantiation, and checked against what the user wrote (`check_settings_from_the_data`)."""

        parser_user = self._parser_user  # not `self`: the parser's links outlive the CLI that built it

        # `data`: the data module built, any of the project's (they have `sample_shape`, which Lightning's lacks)
        def output_channels(data: Any) -> int | None:
            cli = parser_user[0]()
            assert cli is not None, "the links run while their CLI instantiates its classes"
            learned = cli.config.get("model.variance") == "learned_range"
            return 2 * data.sample_shape[0] if learned else None

        return {
            "in_channels": lambda data: data.sample_shape[0],
            "num_classes": lambda data: getattr(data, "num_classes", None),
            "out_channels": output_channels,
        }

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        command_line = None
        if isinstance(args, dict | Namespace):  # a config given as an object, not a command line
            super().parse_arguments(parser, args)
        else:  # LightningCLI's parse_args, run as every command runs it (parse_errors.py)
            command_line = parsed_command_line(parser, args, RENAMED_OPTIONS)
            self.config = command_line.config
        network = self.config.get("model.network")
        # A network of another kind (torch.nn.Linear) is refused before anything is built: it failed at step 1.
        if network is not None and network.get("class_path"):
            check_network_class(network.class_path)
        self._settings_written = settings_written(self.config, parser.get_defaults())
        # A check below names an option as the user gave it: a flag, or a config file's key.
        self._said = where_written(command_line.written) if command_line else as_flag
        for name, instead in NOT_OFFERED.items():
            if self.config.get(name) is not None:
                written = command_line.written if command_line else []
                given = [item.shown() for item in written if item.key.split(".")[0] == name] or [f"--{name}"]
                raise UserError(
                    f"{given[-1]}: train.py takes no --{name}; the model configures its own Adam "
                    "(fused where it can be), warmup and learning-rate schedule",
                    f"set them with {instead}",
                )
        # `ema: null` in a file: Lightning's instantiation ends in a TypeError; `model: null` with a network flag
        # after it parses, into a model without its other options.
        nulled = [item.key for item in command_line.written if item.values == (None,)] if command_line else []
        # `trainer: null` failed in the Trainer's checks, `model: {sampling: null}` in the instantiation
        for group in ("model", "data", "trainer", "model.sampling", *CLASS_GROUPS):
            if group in nulled or (group in self.config and self.config[group] is None):
                raise UserError(
                    f"{self._said(group, 'null')}: this group cannot be null",
                    "remove the line, or write its options under it",
                )
        # Here, before LightningCLI seeds (numpy's words for a bad --seed_everything) and prints "Seed set to".
        check_trainer_option_ranges(self.config, self._said)
        if note := take_old_names(self.config, self._said, command_line.argv if command_line else None):
            rank_zero_warn(CommandNote(note))
        for note_of in (validation_off_note, warmup_note, step_checkpoints_note, unused_root_dir_note):
            if warning := note_of(self.config, self._said):
                rank_zero_warn(CommandNote(warning))
        check_hardware_flags(self.config.trainer)
        check_torchrun_restarts()  # before a restart would hang
        note = drop_ddp_on_one_device(self.config.trainer)
        if note:
            rank_zero_info(note)
        check_logger_installed(self.config.trainer)
        allow_mlflow_file_store(self.config.trainer)
        check_logger_folders(self.config.trainer)
        # A new run's --checkpoint.dirpath into another run's checkpoints, refused before --print_config too
        check_checkpoint_dirpath(self.config, self.config.trainer.fast_dev_run)
        # --print_config: printed once the classes are built and checked (after_instantiate_classes), as the run
        # would find them: the checkpoint to resume, the image size against the network, the output folders.
        self._command_line = command_line

    def before_instantiate_classes(self) -> None:
        config = self.config
        check_path_given(config.ckpt_path, "--ckpt_path")  # "" would start a new run without a word
        if config.ckpt_path:
            asked, (self._resume_checkpoint, saving) = config.ckpt_path, resolve_resume(config)
            self.save_config_kwargs.update(saving)
            self.resume_chosen = chosen_resume(asked, config.ckpt_path)  # held to it once the run is locked
        # The run's own init_from on a resume is not read (the checkpoint's weights win); another is resolved
        self._init_from_unread = runs_own_init_from(config.ckpt_path, config.model.init_from)
        if config.model.init_from and not self._init_from_unread:
            resolve_init_from(config)
        check_init_from_on_resume(config.ckpt_path, config.model.init_from)  # the resume's weights win
        note = cpu_mixed_precision_note(str(config.trainer.precision), training=True)
        if note and runs_on_cpu(config.trainer):  # --accelerator cpu, or auto on a machine without a GPU
            rank_zero_warn(CommandNote(note))

    def instantiate_classes(self) -> None:
        chosen = {group: self.config[group].class_path for group in ("data", "model.network")}
        groups = {class_at(path): group for group, path in chosen.items()}
        written = self._command_line.written if self._command_line else []
        init_from = self.config.model.init_from  # kept in the run's config.yaml, not read when resuming
        self.config.model.init_from = None if self._init_from_unread else init_from
        try:
            with notes_said_as_written(groups, written):  # a class's note said of the flags, in one line
                super().instantiate_classes()
        except MisconfigurationException as error:
            raise refused_by_the_trainer(error) from error
        except (ValueError, TypeError) as error:  # a class's own range or type check: name the flag
            named = class_error_as_written(error, groups, written, self.config)
            if named is None:
                raise
            raise named from error
        finally:
            self.config.model.init_from = init_from
            # LightningCLI's instantiators hold the CLI, which would outlive its user in the shared parser (which
            # jsonargparse also leaves in a context variable) with its model and data, whether the instantiation
            # succeeded or not: plain ones stand in until the next CLI's.
            for cls, subclasses in ((DiffusionModule, False), (LightningDataModule, True)):
                self.parser.add_instantiator(plain_instance, cls, subclasses)

    def after_instantiate_classes(self) -> None:
        derived = {
            name: compute(self.datamodule) for name, compute in self._network_settings_from_the_data().items()
        }
        check_settings_from_the_data(self._settings_written, derived, self._said)
        check_torchrun_world_size(self.trainer.num_devices, self.trainer.num_nodes)
        check_other_machines_named(self.trainer.num_nodes, self.trainer.strategy)  # before it waits for them
        timeout = self.config.ddp_timeout
        if timeout <= 0:
            raise UserError(f"--ddp_timeout {timeout:g} is out of range", "pass seconds > 0, e.g. 600")
        self.heartbeat = Heartbeat(timeout)
        callbacks_of(self.trainer).append(self.heartbeat)
        chosen = [
            str(c.get("class_path", ""))
            for c in self.config.trainer.get("callbacks") or []
            if hasattr(c, "get")
        ]
        use_run_progress(self.trainer, keep_bar=any(path.endswith("ProgressBar") for path in chosen))
        log_learning_rate(self.trainer)
        # The callbacks' checks of their setup at fit, made before --print_config too
        for callback in callbacks_of(self.trainer):
            sampling = getattr(callback, "sampling", None)
            if isinstance(sampling, SamplingOptions):
                sampling.check_steps_fit(self.model.schedule.num_timesteps, type(callback), "sampling.steps")
                conditional = self.model.num_classes is not None
                dropout = self.model.hparams.get("label_dropout")  # 0: guidance is refused
                sampling.check_guidance_fits(conditional, type(callback), "sampling.guidance_scale", dropout)
        check_input_shape = getattr(self.model.network, "check_input_shape", None)
        if check_input_shape is not None:
            check_input_shape(self.model.sample_shape)
        if self._resume_checkpoint is not None:
            check_resume_fits(self._resume_checkpoint, self.config.ckpt_path, self.model)
            check_steps_left(self._resume_checkpoint, self.trainer.max_steps)
            self._resume_checkpoint = None  # unmap the file: the resumed run will write its checkpoints
            check_same_training_settings(
                self.config.ckpt_path, self.parser.dump(self.config, skip_none=False), self.model.sample_shape
            )
        check_output_folders(self.trainer, self.config.checkpoint.dirpath, self.config.ckpt_path)
        check_monitored_metric(self.trainer, self.config.checkpoint.monitor)
        if self._command_line is not None:
            self._command_line.print_config_if_asked()  # what runs: the whole command line, checked


def plain_instance(cls: type, *args: Any, **kwargs: Any) -> Any:
    """jsonargparse's instantiator in its simplest form: the class called with its arguments."""
    return cls(*args, **kwargs)


def main(args: list[str] | None = None) -> DiffusionCLI:
    """`python train.py [flags]`: build the CLI and fit. A user error ends in one line and exit status 2."""
    with reporting_user_errors(args), closing_process_group(), one_line_notes():
        if args is None:
            sys.argv[1:] = with_default_config(sys.argv[1:])
        else:
            args = with_default_config(list(args))
        cli = DiffusionCLI(args, parser_kwargs={"exit_on_error": False})
        fit(cli)
        return cli


if __name__ == "__main__":  # the command is the repository's train.py
    from diffusion.cli.reporting import not_a_command

    not_a_command("train with python train.py (in the repository's root; --help for its options)")
