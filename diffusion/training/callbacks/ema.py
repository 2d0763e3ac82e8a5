"""EMA of the weights on Lightning's WeightAveraging, one foreach update per optimizer step; optionally post-hoc
EMA profiles and their snapshots beside it."""

from functools import partial
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.utilities import rank_zero_warn

from diffusion.errors import OutOfRange, check_bool, check_real, check_whole_number, options_of
from diffusion.training.option_notes import OptionNote, SayValue
from diffusion.training.post_hoc_ema import PostHocEMA

# The post-hoc EMA's options, as EMA's defaults: one that differs without post_hoc is said not to be used.
POST_HOC_DEFAULTS: dict[str, object] = {
    "sigma_rels": (0.05, 0.10),
    "snapshot_every": 100,
    "max_snapshot_gb": 2.0,
}


class EMA(WeightAveraging):
    """Exponential moving average of the weights, on Lightning's WeightAveraging callback.

    Updated once per optimizer step (so also under accumulate_grad_batches and DDP), stored in checkpoints
    (the EMA weights under "state_dict", the raw ones under "current_model_state") and restored on resume.

    decay warms up as min(decay, (1 + n) / (10 + n)) after n updates (Tensorflow's ExponentialMovingAverage
    with num_updates), so short CPU runs are not dominated by the random initial weights.

    The update is one `torch._foreach_lerp_` over all parameters, with the update count kept on the host:
    Lightning's default path (AveragedModel.update_parameters with a per-tensor `avg_fn`) walks the
    parameters in Python, builds a decay tensor per parameter and reads `n_averaged` back from the device
    every step, which cost ~16% of a CPU training step and a device sync per step on GPUs.

    Lightning swaps the EMA weights in for validation; this subclass swaps them back only in
    `on_validation_end`, so every `on_validation_epoch_end` hook (sample grids, FID) sees EMA weights
    whatever the order of the callbacks.

    Only parameters are averaged (use_buffers=False): the module's buffers are the constant noise schedule,
    which averaging could only blur by rounding; the EMA copy's buffers follow the module's at every update,
    as AveragedModel does with use_buffers=False.

    With `post_hoc`, it also tracks power-function EMA profiles and writes their snapshots into the run folder
    (`diffusion.training.post_hoc_ema.PostHocEMA`), from which `python -m diffusion.phema` builds
    the EMA of any length after training (Karras et al. 2024). The EMA above is unchanged by it.

    Args:
        decay: the EMA's decay per update (Ho et al. 0.9999).
        warmup: warm the decay up as min(decay, (1 + n) / (10 + n)).
        update_every_n_steps: update the EMA every this many optimizer steps.
        post_hoc: also track post-hoc EMA profiles and write their snapshots (see docs/post_hoc_ema.md).
        sigma_rels: the post-hoc profiles' relative widths (EDM2 tracks 0.05 and 0.10).
        snapshot_every: a snapshot of every profile every this many optimizer steps (and at the last).
        max_snapshot_gb: the disk the snapshots may take; a wider interval is used when they would take more.
    """

    def __init__(
        self,
        decay: float = 0.9999,
        warmup: bool = True,
        update_every_n_steps: int = 1,
        post_hoc: bool = False,
        sigma_rels: tuple[float, ...] = (0.05, 0.10),
        snapshot_every: int = 100,
        max_snapshot_gb: float = 2.0,
    ) -> None:
        with options_of(type(self)):  # a command says them as its flags (--ema.decay)
            check_real("decay", decay)
            check_bool("warmup", warmup)
            check_bool("post_hoc", post_hoc)
            if not 0.0 < decay < 1.0:
                raise OutOfRange("decay", decay, "in (0, 1)", "pass e.g. 0.9999 (Ho et al.)")
            check_whole_number("update_every_n_steps", update_every_n_steps, 1, "pass 1 to update every step")
        self.decay = decay
        self.warmup = warmup
        self.update_every_n_steps = update_every_n_steps
        self._raw_state_at_end: dict[str, torch.Tensor] | None = None
        self._num_updates = 0  # = the AveragedModel's n_averaged, kept on the host
        # (EMA params, params, EMA buffers, buffers), collected at the first update
        self._pairs: tuple[list[torch.Tensor], ...] | None = None
        self.post_hoc = PostHocEMA(sigma_rels, snapshot_every, max_snapshot_gb) if post_hoc else None
        if not post_hoc:
            rels = tuple(sigma_rels) if isinstance(sigma_rels, list | tuple) else sigma_rels
            given = {"sigma_rels": rels, "snapshot_every": snapshot_every,
                     "max_snapshot_gb": max_snapshot_gb}  # fmt: skip
            unused = {name: value for name, value in given.items() if value != POST_HOC_DEFAULTS[name]}
            if unused:
                rank_zero_warn(OptionNote(partial(_post_hoc_off, unused), type(self)))
        super().__init__(use_buffers=False)

    def current_decay(self, num_updates: int) -> float:
        """The decay of the update that follows `num_updates` updates."""
        if not self.warmup:
            return self.decay
        return min(self.decay, (1 + num_updates) / (10 + num_updates))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # A second fit with this callback (a notebook extending a run) must not save the first fit's raw weights.
        self._num_updates, self._pairs, self._raw_state_at_end = 0, None, None
        if self.post_hoc is not None and stage == "fit":
            self.post_hoc.setup(trainer, pl_module)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.post_hoc is not None:
            self.post_hoc.on_train_start(trainer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Lightning's condition, with update() in place of AveragedModel.update_parameters.
        if trainer.global_step > self._latest_update_step and self.should_update(
            step_idx=trainer.global_step - 1
        ):
            self.update(pl_module)
            self._latest_update_step = trainer.global_step
        if self.post_hoc is not None:
            self.post_hoc.on_train_batch_end(trainer)

    @torch.no_grad()
    def update(self, pl_module: L.LightningModule) -> None:
        """One EMA step: the first copies the weights (AveragedModel's n_averaged == 0), later ones lerp."""
        if self._pairs is None:
            # The Parameter objects, not detached views: the strategy moves the module to its device after
            # setup by swapping each parameter's data, which a cached view would not follow.
            average = self._average_model.module  # type: ignore[union-attr]  # made in setup
            self._pairs = (
                list(average.parameters()), list(pl_module.parameters()),
                list(average.buffers()), list(pl_module.buffers()),
            )  # fmt: skip
        ema_params, params, ema_buffers, buffers = self._pairs
        if self._num_updates == 0:
            torch._foreach_copy_(ema_params, params)
        else:
            torch._foreach_lerp_(ema_params, params, 1.0 - self.current_decay(self._num_updates))
        if buffers:
            torch._foreach_copy_(ema_buffers, buffers)
        self._average_model.n_averaged += 1  # type: ignore[union-attr]  # made in setup
        self._num_updates += 1

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        if self._average_model is not None:
            self._num_updates = int(self._average_model.n_averaged)  # once per resume, not per step

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and (step_idx + 1) % self.update_every_n_steps == 0

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # swapped back in on_validation_end instead

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning copies the EMA weights into the module here, before the final last.ckpt is written:
        # keep the raw weights so that checkpoint still holds both (and resuming continues the raw ones).
        self._raw_state_at_end = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        super().on_train_end(trainer, pl_module)
        if self.post_hoc is not None:
            self.post_hoc.on_train_end(trainer)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.post_hoc is not None:
            state["post_hoc"] = self.post_hoc.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if self.post_hoc is None:
            return
        if "post_hoc" in state_dict:
            self.post_hoc.load_state_dict(state_dict["post_hoc"])
        else:
            rank_zero_warn(
                "resuming with post_hoc=True from a checkpoint trained without it: the post-hoc EMA profiles "
                "start at this step, so reconstructions take the weights before it as equal to its own"
            )

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._raw_state_at_end is not None and "current_model_state" in checkpoint:
            checkpoint["current_model_state"] = self._raw_state_at_end


def _post_hoc_off(unused: dict[str, Any], option: SayValue) -> str:
    """The note on post-hoc EMA options given with the post-hoc EMA off, each option said by `option`."""
    shown = ", ".join(option(name, value) for name, value in unused.items())
    return (
        f"{shown} not used: options of the post-hoc EMA, which is off ({option('post_hoc', False)}) — pass "
        f"{option('post_hoc', True)} to track its profiles and write their snapshots"
    )
