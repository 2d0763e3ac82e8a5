"""DiffusionModule: a DDPM (Ho et al. 2020) as a LightningModule, composing a network and a NoiseSchedule.

The Trainer owns everything distributed (DDP, samplers, gradient sync, accumulation, precision, rank-zero
checkpointing); this file owns only the diffusion objective, the optimizer and the training hooks. Sampling is
its base's, `SamplingModule` (diffusion/training/sampling_module.py).
"""

import os
import warnings
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from typing import Any, Literal, cast

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import LRSchedulerConfigType, OptimizerLRSchedulerConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from diffusion.core.compiling import CompileMode, compile_graph, mode_for
from diffusion.core.guidance import call_network
from diffusion.core.sampling import DEFER, SamplingOptions, check_options
from diffusion.core.sampling_dicts import sampling_options_from
from diffusion.core.schedule import BetaSchedule, NoiseSchedule, PredictionType
from diffusion.data.batch import Batch, check_batch, check_sample_shape
from diffusion.data.labels import check_class_names
from diffusion.data.resumable import describe_batches
from diffusion.errors import check_bool, options_of
from diffusion.training import loss as objective
from diffusion.training.atomic_writes import install as install_checkpoint_io
from diffusion.training.checkpoint_files import CheckedLoad, drop_old_schedule_buffers, load_network_weights
from diffusion.training.divergence import (
    FirstBatch,
    ValidationData,
    check_checkpoint_weights,
    check_interval_loss,
    check_weights,
)
from diffusion.training.logging_steps import IntervalLoss
from diffusion.training.loss import LossWeighting, ModelVariance, diffusion_loss
from diffusion.training.optim import LRSchedule, adam, clip_gradients, use_tf32_on_cuda, warmup_scheduler
from diffusion.training.option_notes import OptionNote
from diffusion.training.options import (
    check_resumed_checkpoint,
    check_trainer_precision,
    check_training_options,
    checked_compile_training,
    checked_module_normalization,
    checked_noise_seed,
    unused_training_options,
)
from diffusion.training.random_states import (
    gather_from_ranks,
    global_random_states,
    restore_global_random_states,
    resumed_states,
)
from diffusion.training.sampling_module import (
    SamplingModule,
    check_fits_data,
    check_is_network,
    check_network_fits,
    checked_sample_shape,
)

NoiseMode = Literal["fast", "per_sample"]  # diffusion/training/loss.py
# compile_training: True, False, or "cuda" (compiled where it pays: on a CUDA device)
CompileWhen = Literal["cuda"]
TRAIN_LOSS, VAL_LOSS = "train/loss", "val/loss"  # the metrics it logs (a checkpoint can monitor them)
LEARNING_RATE = "train/lr"  # its learning rate, as LearningRateMonitor logs it


class DiffusionModule(CheckedLoad, SamplingModule):  # load_from_checkpoint checks its file first
    """Trains `network` to predict the noise (or x_0, or v) added by the forward process.

    Args:
        network: any `model(x_t, t) -> same shape as x_t` (diffusion.models.UNet or MLP).
        sample_shape: shape of one sample, (C, H, W) or (D,); set from the data by the CLI.
        normalization: {"shift": [...], "scale": [...]} mapping model units back to data units; set from the
            data by the CLI so a checkpoint can turn samples into images or vectors on its own.
        prediction_type: what the network outputs: the noise "eps" (Ho et al.), "x0", or "v".
        zero_terminal_snr: betas rescaled to alpha_bar_T = 0 (Lin et al. 2024); needs prediction_type v or x0.
        trained_betas: with beta_schedule "trained", the schedule's betas themselves, one per timestep (a diffusers
            model's ``trained_betas``, kept in the checkpoint as plain numbers); see `diffusion.core.schedule`.
        offset_noise: Guttenberg 2023's offset noise for images (0.1 in his examples; `training/loss.py`).
        loss_weighting: "none" (Ho et al.'s simple loss) or "min_snr" (Hang et al. 2023, gamma=min_snr_gamma).
        lr, warmup_steps, adam_betas, weight_decay: Adam with linear warmup (Ho et al.: 2e-4, 5000 steps).
        lr_schedule: after warmup, "constant" (Ho et al.) or "cosine" to zero at the run's last step
            (trainer.max_steps: a run extended later with a larger max_steps continues on the longer curve).
        sampling: this model's defaults for `sample()`, the callbacks and the sample CLI (a field left unset
            takes `reverse_steps`' default: DDPM over all T steps, as Ho et al.); they override it in turn.
        noise_mode: "fast" draws noise and timesteps from a per-rank generator; "per_sample" makes them a
            function of (noise_seed, optimizer step, dataset index), so a run on N devices reproduces a run on
            one device with accumulate_grad_batches=N (see README, "Scaling out").
        noise_seed: seed of the training noise; None uses the seed given to seed_everything (or 0).
        init_from: weights to start from: a checkpoint of this project or a state_dict of the network.
            Loaded here, before the strategy wraps the model, so every rank starts identical.
        compile_training: compile the network's training step (torch.compile) when fitting starts: True, False,
            or "cuda" (on a CUDA GPU only: the GPU recipes' choice). One graph of fixed shapes for training steps
            alone: validation, sample grids and the EMA weights run the network eagerly (a sampler's own `compile`
            option compiles its evaluation apart), so none of them recompiles or re-records it. Checkpoint keys,
            weights, optimizer state and EMA are those of the eager network.
        compile: the old name of compile_training, which configs and checkpoints written before 2026-11-27 use.
        compile_mode: torch.compile's mode for that graph; None: "reduce-overhead" (CUDA graphs) on CUDA,
            "default" elsewhere (`diffusion.core.compiling`).
        compile_channels_last: the compiled graph laid out NHWC end to end (Inductor's layout optimisation
            forced), where Inductor would keep a UNet's training graph NCHW and cuDNN transpose around each
            convolution; measure both (docs/gpu.md).
        label_dropout: for a class-conditional network (built with num_classes): the probability that a
            training sample's label is replaced by NO_LABEL, so the same network also learns the unconditional
            model that classifier-free guidance needs (Ho & Salimans 2022 use 0.1-0.2). Drawn per sample like
            the noise (see noise_mode).
        class_names: names of the classes 0..num_classes-1; set from the data by the CLI, kept in the checkpoint.
        variance: "fixed" (Ho et al.) or "learned_range" (Nichol & Dhariwal 2021): the network outputs 2C channels
            (see `diffusion.training.loss`), and DDPM samples with the learned variance by default. Images only.
    """

    def __init__(
        self,
        network: nn.Module,
        sample_shape: tuple[int, ...] = (1, 8, 8),
        normalization: dict[str, list[float]] | None = None,
        beta_schedule: BetaSchedule = "linear",
        num_timesteps: int = 1000,
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
        zero_terminal_snr: bool = False,
        trained_betas: list[float] | None = None,
        prediction_type: PredictionType = "eps",
        loss_weighting: LossWeighting = "none",
        min_snr_gamma: float = 5.0,
        lr: float = 2e-4,
        warmup_steps: int = 5000,
        lr_schedule: LRSchedule = "constant",
        adam_betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        sampling: SamplingOptions = DEFER,
        noise_mode: NoiseMode = "fast",
        noise_seed: int | None = None,
        init_from: str | None = None,
        compile_training: bool | CompileWhen = False,
        compile: bool | CompileWhen | None = None,
        compile_mode: CompileMode | None = None,
        compile_channels_last: bool = False,
        label_dropout: float = 0.0,
        class_names: list[str] | None = None,
        variance: ModelVariance = "fixed",
        offset_noise: float = 0.0,
    ) -> None:
        super().__init__()
        check_is_network(network)  # a name or a class would fail at the first step
        compile_training = checked_compile_training(compile_training, compile)  # or compile, its old name
        # Built first: whether alpha_bar_T = 0 is the schedule's to say (rescaled, or trained betas ending at 1).
        with options_of(type(self)):  # the checks' `{--name}`s are this class's options
            check_bool("compile_channels_last", compile_channels_last)
            sampling = sampling_options_from(DEFER if sampling is None else sampling, "sampling")
            check_options(sampling, "sampling", "DiffusionModule(network, sampling=SamplingOptions(...))")
            noise_seed = checked_noise_seed(noise_seed)  # taken modulo 2**64: another seed's noise
            sample_shape = checked_sample_shape(sample_shape)
            check_network_fits(network, sample_shape, variance)  # else found at the first step or sample
            normalization = checked_module_normalization(normalization, sample_shape)  # as lists of floats
            check_class_names(
                class_names, getattr(network, "num_classes", None), "pass the data's class_names, or None"
            )
            schedule = NoiseSchedule(
                beta_schedule, num_timesteps, beta_start, beta_end, zero_terminal_snr, trained_betas
            )
            check_training_options(
                choices=[
                    ("prediction_type", prediction_type, PredictionType),
                    ("loss_weighting", loss_weighting, LossWeighting),
                    ("noise_mode", noise_mode, NoiseMode),
                    ("lr_schedule", lr_schedule, LRSchedule),
                    ("variance", variance, ModelVariance),
                    *([] if compile_mode is None else [("compile_mode", compile_mode, CompileMode)]),
                ],
                lr=lr, warmup_steps=warmup_steps, adam_betas=adam_betas, weight_decay=weight_decay,
                min_snr_gamma=min_snr_gamma, label_dropout=label_dropout, prediction_type=prediction_type,
                zero_terminal_snr=schedule.zero_terminal_snr, network_num_classes=getattr(network, "num_classes", None),
                variance=variance, sample_shape=sample_shape, offset_noise=offset_noise,
                sampling_variance=getattr(sampling, "variance", None),
            )  # fmt: skip
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`.*")
            # init_from is a one-time source of weights: the checkpoint then holds them itself.
            self.save_hyperparameters(ignore=["init_from", "compile"])
        # A checkpoint stores plain data (it loads with weights_only=True): the options as a dict, which
        # load_from_checkpoint hands back to this __init__.
        self.sampling = sampling
        self.hparams["sampling"] = asdict(self.sampling)
        # Said each time it is built (a checkpoint loaded too): what it holds is still not used.
        for note in unused_training_options(
            loss_weighting=loss_weighting, min_snr_gamma=min_snr_gamma, compile_training=compile_training,
            compile_mode=compile_mode, compile_channels_last=compile_channels_last, sampling=self.sampling,
        ):  # fmt: skip
            rank_zero_warn(OptionNote(note, type(self)))  # train.py says it of the flags as written
        if isinstance(self.hparams.get("network"), nn.Module):
            # Built in Python rather than by the CLI: only the CLI records the network's config, so such a
            # checkpoint is loaded with `load_from_checkpoint(path, network=...)`.
            self.hparams.pop("network")
        self.network = network
        self.sample_shape = tuple(sample_shape)
        self.schedule = schedule
        # Constants every rank computes alike: DDP need not broadcast them from rank 0 before every forward.
        names = [f"schedule.{name}" for name, _ in self.schedule.named_buffers()]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(self, names)
        self.sampling.check_steps_fit(num_timesteps, type(self), "sampling.steps")
        conditional, dropout = self.num_classes is not None, self.hparams.get("label_dropout")
        self.sampling.check_guidance_fits(conditional, type(self), "sampling.guidance_scale", dropout)
        self._generator: torch.Generator | None = None
        self._training_graph: Callable | None = None  # the network compiled for training steps (setup)
        self._resumed_states: dict[str, Any] | None = None  # this rank's random states from the checkpoint
        self._resumed_step = 0
        self._states_before_validation: dict[str, Any] | None = None
        self._train_loss = IntervalLoss()  # logged at logging steps (diffusion/training/logging_steps.py)
        self._first_batch = FirstBatch()  # NaN data, labels unfit, said as such (training/divergence.py)
        self._validation_data = ValidationData()  # the same of validation's batches, read at its end
        if init_from is not None:
            load_network_weights(self.network, init_from, type(self))

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self._training_graph is not None and self.network.training and torch.is_grad_enabled():
            return self._training_graph(x_t, t, labels)
        return call_network(self.network, x_t, t, labels)

    # ---- training -------------------------------------------------------------------------------------
    @property
    def _noise_seed(self) -> int:
        seed = self.hparams["noise_seed"]
        return int(os.environ.get("PL_GLOBAL_SEED", 0)) if seed is None else seed

    def setup(self, stage: str) -> None:
        # A Python `Trainer.fit(module, datamodule=data)` never links the module to the data as train.py does
        # (Lightning sets the Trainer's `datamodule` at run time: its class does not declare it).
        check_fits_data(self, getattr(self.trainer, "datamodule", None))
        check_trainer_precision(str(self.trainer.precision))
        use_tf32_on_cuda(self.device)  # Lightning already points self.device at the run's device here
        install_checkpoint_io(self.trainer.strategy)  # atomic saves; a ckpt_path checked when read
        if self._compile_when_fitting() and stage == "fit" and self._training_graph is None:
            # After the EMA callback's setup has copied the module: its copy stays a plain module. A function of
            # the network rather than the network compiled in place: evaluation keeps calling the eager network.
            self._training_graph = compile_graph(
                partial(call_network, self.network), mode_for(self.device, self.hparams["compile_mode"]),
                channels_last=self.hparams["compile_channels_last"],
            )  # fmt: skip

    def _compile_when_fitting(self) -> bool:
        when = self.hparams["compile_training"]
        return when is True or (when == "cuda" and self.device.type == "cuda")

    def on_fit_start(self) -> None:
        # seed_everything gives every rank the same seed: without the rank in this generator's seed, all ranks
        # would draw identical noise and timesteps, wasting the extra devices. A resumed run continues the
        # stream saved in its checkpoint; without one for this rank (another world size) it takes fresh noise
        # from the checkpoint's step rather than replaying the first steps.
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(
            objective.sample_seed(self._noise_seed, self._resumed_step, self.global_rank + 1)
        )
        self._resumed_step = 0
        if self._resumed_states is not None and self._resumed_states.get("generator") is not None:
            self._generator.set_state(self._resumed_states["generator"])

    def on_train_start(self) -> None:
        # Restored here, after the sanity check and the data loaders' set-up, right before the first batch.
        if self._resumed_states is not None:
            restore_global_random_states(self._resumed_states, self.device)
            self._resumed_states = None
        self._train_loss.reset()
        self._first_batch.arm()
        rank_zero_info(describe_batches(self.trainer))

    def on_train_end(self) -> None:
        # A short fit may reach no logging step, validation or checkpoint save: its data and weights are checked here.
        self._first_batch.check()
        check_weights(dict(self.named_parameters()), self.trainer, at_end=True)

    # Validation must not move the training streams (the val loader seeds its iterator from the global RNG, an
    # augmented val set draws from it): a checkpoint taken before a validation would otherwise resume with
    # other dropout masks than the run that validated. A checkpoint saved during validation stores the
    # training states from before it.
    def on_validation_start(self) -> None:
        # Before the EMA's weights are swapped in and any sample grid is drawn from weights that diverged.
        self._first_batch.check()
        check_weights(dict(self.named_parameters()), self.trainer, before="validation")
        self._states_before_validation = global_random_states(self.device)
        self._validation_data.reset()

    def on_validation_epoch_end(self) -> None:
        self._validation_data.check(self)  # before on_validation_end's checkpoint: NaN data said as such

    def on_validation_end(self) -> None:
        if self._states_before_validation is not None:
            restore_global_random_states(self._states_before_validation, self.device)
            self._states_before_validation = None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The last hook before the file is written: a checkpoint of weights that diverged is never written.
        self._first_batch.check()
        check_checkpoint_weights(checkpoint, {name for name, _ in self.named_parameters()}, self.trainer)
        states = dict(self._states_before_validation or global_random_states(self.device))
        states["generator"] = None if self._generator is None else self._generator.get_state()
        checkpoint["random_states"] = gather_from_ranks(states, self.trainer.world_size)  # one per rank

    def draw_noise_and_timesteps(
        self, x0: torch.Tensor, indices: torch.Tensor, step: int, per_sample: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Noise like x0 and timesteps (B,) for one batch, from the rank's generator or per sample."""
        generator = None if per_sample else self._generator
        return objective.noise_and_timesteps(
            x0, indices, step, self.schedule.num_timesteps, self._noise_seed, generator,
            self.hparams["offset_noise"],
        )  # fmt: skip

    def drop_labels(
        self, labels: torch.Tensor, indices: torch.Tensor, step: int, per_sample: bool
    ) -> torch.Tensor:
        """Labels with each replaced by NO_LABEL with probability label_dropout (like the noise, per sample)."""
        generator = None if per_sample else self._generator
        return objective.drop_labels(
            labels, indices, step, self.hparams["label_dropout"], self._noise_seed, generator
        )

    def per_sample_loss(
        self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, labels: torch.Tensor | None = None,
        check_output: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        """The loss of each sample, shape (B,): `diffusion.training.loss.diffusion_loss` of the network output."""
        x_t = self.schedule.q_sample(x0, t, noise, check_range=False)  # t is drawn in range: not read
        return diffusion_loss(
            self.schedule, self.forward(x_t, t, labels), x0, x_t, t, noise, check_output=check_output,
            prediction_type=self.hparams["prediction_type"], loss_weighting=self.hparams["loss_weighting"],
            min_snr_gamma=self.hparams["min_snr_gamma"], variance=self.hparams["variance"],
        )  # fmt: skip

    def _checked(self, batch: Batch, which: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The batch's samples (of this module's sample_shape), indices and labels, checked (check_batch): the
        labels a tensor for a class-conditional model and None for an unconditional one."""
        x0, indices, labels = check_batch(batch, self.num_classes)
        network_check = getattr(self.network, "check_input_shape", None)
        check_sample_shape(x0, self.sample_shape, type(self).__name__, which, network_check)
        return x0, indices, cast(torch.Tensor | None, labels)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        x0, indices, labels = self._checked(batch, "training")
        # The labels as they came, before any label dropout.
        first = self._first_batch.see(x0, indices, batch.label, self.num_classes)
        per_sample = self.hparams["noise_mode"] == "per_sample"
        noise, t = self.draw_noise_and_timesteps(x0, indices, self.global_step, per_sample)
        if labels is not None:
            labels = self.drop_labels(labels, indices, self.global_step, per_sample)
        loss = self.per_sample_loss(x0, noise, t, labels, check_output=first).mean()  # as sampling checks it
        self._train_loss.add(loss)
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Read once per logging interval; the bar gets a number (a prog_bar metric is read after every batch).
        loss = self._train_loss.mean_at_logging_step(self.trainer)
        if loss is not None:
            self._first_batch.check()  # data that holds NaN is said as such, not as divergence
            check_interval_loss(loss, self.trainer)  # a host tensor: nothing more is read
            self.log(TRAIN_LOSS, loss, on_step=True, on_epoch=False)
            self.trainer.progress_bar_metrics[TRAIN_LOSS] = loss.item()

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        x0, indices, labels = self._checked(batch, "validation")
        # Fixed noise per validation sample (step 0), so val/loss is comparable across epochs and world sizes.
        # Labels are kept: a conditional model's val/loss is its conditional loss.
        noise, t = self.draw_noise_and_timesteps(x0, indices, step=0, per_sample=True)
        self._validation_data.see(x0, indices, batch.label)  # as they came: an unconditional model's too
        self.log(VAL_LOSS, self.per_sample_loss(x0, noise, t, labels).mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        optimizer = adam(
            self.parameters(), self.device, lr=self.hparams["lr"], betas=self.hparams["adam_betas"],
            weight_decay=self.hparams["weight_decay"],
        )  # fmt: skip
        total = self.trainer.estimated_stepping_batches if self._trainer is not None else float("inf")
        scheduler = warmup_scheduler(
            optimizer, self.hparams["lr_schedule"], self.hparams["warmup_steps"], total
        )
        # The name LearningRateMonitor logs the rate under (train.py adds one, logging at the logging steps).
        schedule: LRSchedulerConfigType = {"scheduler": scheduler, "interval": "step", "name": LEARNING_RATE}
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:  # fmt: skip
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)  # fused too (optim.py)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._trainer is not None:  # fitting: this rank's random states (on_fit_start, on_train_start)
            rank, world_size = self.trainer.global_rank, self.trainer.world_size
            self._resumed_states, self._resumed_step = resumed_states(checkpoint, rank, world_size)
        drop_old_schedule_buffers(checkpoint, set(self.state_dict()))
        if self._trainer is not None:  # before its weights are loaded (fit: its training settings too)
            check_resumed_checkpoint(self, checkpoint, self.trainer.ckpt_path, self.trainer.state.fn)
