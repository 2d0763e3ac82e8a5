"""A training that diverged stops, with its last finite checkpoint kept.

An extreme option (a learning rate far too high, 16-bit activations that overflow) or extreme data can make the
loss and then the weights NaN or infinite; once a weight is NaN, Adam keeps it so. Training on would spend the
rest of the run and write checkpoints and snapshots of NaN weights, `last.ckpt` among them. Instead the run stops
with one line (`UserError`, exit status 2) naming the step and the likely causes:

- at the first logging step whose interval loss is not finite: the loss read there anyway
  (`diffusion.training.logging_steps`), so the check reads nothing more (not under 16-mixed's GradScaler, which
  skips a step whose fp16 values overflowed);
- before a validation, a checkpoint save or a post-hoc EMA snapshot, if the weights are not finite (one read of a
  flag per check, at times that read or write the weights anyway). A save that fails this check writes nothing,
  so the checkpoints written before it, `last.ckpt` among them, stay as they were.

Every rank holds the same weights and the same all-reduced interval loss, so every rank stops at the same step.

Data that holds NaN or infinity makes the loss and the weights NaN at once: the fit's first training batch is checked
(`FirstBatch`, computed on the device at that batch, read at the first of these places) and refused as data, before
any line blames divergence. The same read refuses labels that do not fit the model: a class-conditional model's
first batch without a single class (unlabelled data: it would train as unconditional), or an unconditional model's
with classes (they would be ignored); a validation's batches are checked alike (`ValidationData`, read at its
end). A run too short to reach any of them (a Python `Trainer.fit` of a few steps, no checkpoint, no validation) is
checked at its end (`DiffusionModule.on_train_end`): the data, then the weights.
"""

import os
from collections.abc import Iterable, Mapping
from typing import Any

import lightning as L
import torch

from diffusion.core.guidance import NO_LABEL
from diffusion.errors import InvalidValue, UserError


class TrainingDiverged(UserError, RuntimeError):
    """The loss or the weights stopped being finite: said as one line with the likely causes (a command's exit status
    2); a RuntimeError too, for Python code that runs `trainer.fit` itself."""


def all_finite(tensors: Iterable[torch.Tensor]) -> tuple[bool, int]:
    """Whether every floating-point tensor holds only finite values, read with one transfer to the host; and the
    position of the first one that does not (-1 if none)."""
    tensors = [t.detach() for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        return True, -1
    flags = torch.stack([torch.isfinite(t).all() for t in tensors]).cpu()  # the one read
    if bool(flags.all()):
        return True, -1
    return False, int((~flags).nonzero()[0])


def check_interval_loss(loss: torch.Tensor, trainer: L.Trainer) -> None:
    """At the logging step about to be taken: stop if the interval's mean loss (a host tensor) is not finite.

    Not under a GradScaler (16-mixed): there an fp16 overflow makes a step's loss infinite now and then, the scaler
    skips that step and lowers its scale, and the weights stay finite; the weights' checks still stop a run whose
    weights diverge."""
    if bool(torch.isfinite(loss)) or getattr(trainer.precision_plugin, "scaler", None) is not None:
        return
    step, every = trainer.global_step + 1, trainer.log_every_n_steps  # type: ignore[attr-defined]  # set at run time
    first = (step - 1) // every * every + 1  # the interval's first step
    steps = f"step {step}" if first == step else f"steps {first}-{step}"
    raise TrainingDiverged(
        f"training diverged: the training loss of {steps} is {float(loss)}, not finite; "
        f"the run stopped at step {step}, before saving it ({kept(trainer)})",
        likely_causes(trainer),
    )


def check_weights(
    weights: Mapping[str, torch.Tensor], trainer: L.Trainer, before: str = "", at_end: bool = False
) -> None:
    """Stop, naming the first tensor, if any of `weights` (name -> tensor) is not finite, `before` doing something
    with them ("a checkpoint save", "validation", ...), or `at_end` of the fit."""
    finite, first = all_finite(weights.values())
    if finite:
        return
    name = [n for n, t in weights.items() if isinstance(t, torch.Tensor) and t.is_floating_point()][first]
    where = "found at the end of training" if at_end else f"the run stopped before {before}"
    raise TrainingDiverged(
        f"training diverged: the weights are not finite (NaN or infinity) at step {trainer.global_step}, first "
        f"{name}; {where} ({kept(trainer)})",
        likely_causes(trainer),
    )


def check_checkpoint_weights(checkpoint: dict[str, Any], trained: set[str], trainer: L.Trainer) -> None:
    """`check_weights` of a checkpoint about to be written: its trained parameters (`trained`, by name) in the module's
    and the EMA's weights. Parameters only: the schedule's buffers may be infinite by design (1/sqrt(alpha_bar) at zero
    terminal SNR)."""
    for key in ("state_dict", "current_model_state"):
        weights = {name: t for name, t in (checkpoint.get(key) or {}).items() if name in trained}
        check_weights(weights, trainer, before="a checkpoint save")


# Images beyond this in model units (-1..1) are no model units: 0..255 pixels made floats without the scaling. Their
# samples are clipped to -1..1 (`clip_denoised`), so such a model can never draw them; a user's own standardized
# images (a few units) stay well below it.
IMAGE_UNITS_LIMIT = 10.0
SCALE_IMAGES = (
    "scale the images in your dataset: x / 127.5 - 1 for 0..255 pixels, x * 2 - 1 for 0..1 (the project's data "
    "modules do)"
)


def image_peak(x: torch.Tensor) -> torch.Tensor:
    """The largest magnitude of a batch of images' finite values (0 for vectors: any scale), on its device."""
    if x.ndim != 4:
        return torch.zeros((), device=x.device)
    x = x.detach()
    return torch.where(torch.isfinite(x), x, 0).abs().amax().float()


class FirstBatch:
    """Whether the fit's first training batch holds NaN or infinity, labels that do not fit the model (none at all
    for a class-conditional one, classes for an unconditional one), or images far outside model units: computed on
    the device at that batch (no read: the steps stay free of syncs), read once at the first place that reads anyway
    (`check`)."""

    def __init__(self) -> None:
        self._armed = False
        # (per sample: not finite, its index, the labels do not fit, the images' largest magnitude (0 for vectors),
        # the model's num_classes)
        self._found: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int | None] | None = None

    def arm(self) -> None:
        """A fit starts: its next training batch is the one checked."""
        self._armed, self._found = True, None

    def see(
        self, x: torch.Tensor, index: torch.Tensor, label: object = None, num_classes: int | None = None
    ) -> bool:
        """At each training batch: the first after `arm` is kept, as flags on its device. `label` is the batch's as it
        came (before any label dropout), `num_classes` the model's (None: unconditional). Whether this batch is that
        first one (its step checks the network's output too: `diffusion.training.loss.check_network_output`)."""
        if not self._armed:
            return False
        self._armed = False
        bad = ~torch.isfinite(x.detach().flatten(1)).all(dim=1)
        if not isinstance(label, torch.Tensor):  # None or an int: check_batch refuses it if conditional
            misfit = torch.zeros((), dtype=torch.bool, device=bad.device)
        elif num_classes is None:  # classes given to an unconditional model would be ignored
            misfit = (label != NO_LABEL).any()
        else:  # a conditional model given no class would train as an unconditional one
            misfit = (label == NO_LABEL).all()
        peak = image_peak(x)  # of the finite values: NaN data is said as such first
        self._found = (bad, index, misfit.to(bad.device), peak.to(bad.device), num_classes)
        return True

    def check(self) -> None:
        """Refuse the data if the batch seen holds NaN or infinity, or labels that do not fit the model (one read, the
        first time only)."""
        if self._found is None:
            return
        bad, index, misfit, peak, num_classes = self._found
        self._found = None
        flags = torch.cat([bad.float(), misfit.float().view(1), peak.view(1)]).cpu()  # the read
        if bool(flags[:-2].any()):
            positions = index[bad.to(index.device)].tolist()
            shown = ", ".join(map(str, positions[:5])) + (", ..." if len(positions) > 5 else "")
            raise InvalidValue(
                "the training data holds NaN or infinity: "
                f"{len(positions)} of the {len(bad)} samples of the fit's first training batch are not finite "
                f"(dataset positions {shown}), and every step on them makes the weights NaN",
                "clean the data: drop or repair those samples (torch.nan_to_num replaces such values) before training",
            )
        if float(flags[-1]) > IMAGE_UNITS_LIMIT:
            raise InvalidValue(
                f"the fit's first training batch holds images with values up to {float(flags[-1]):g}, far outside "
                "model units (-1..1): the samples are clipped to -1..1, so this model could never draw them",
                SCALE_IMAGES,
            )
        if not bool(flags[-2]):
            return
        if num_classes is None:
            raise InvalidValue(
                "the fit's first training batch holds class labels, and this model is unconditional (its network "
                "has no num_classes): it would train without them, as unconditional",
                "build the network with num_classes (the number of classes) to train a class-conditional model, "
                "or leave with_labels out of IndexedDataset to train an unconditional one",
            )
        raise InvalidValue(
            f"every label of the fit's first training batch is NO_LABEL (-1), and this model is class-conditional "
            f"(num_classes={num_classes}): it would train as an unconditional one, its classes never learnt",
            "build IndexedDataset(..., with_labels=True) over (x, label) items, or train with "
            "{LightningDataModule:--conditional} true; or build the network without num_classes for an "
            "unconditional model",
        )


class ValidationData:
    """Whether a validation's batches hold NaN or infinity (its loss would be NaN without a word, where a fit refuses
    such data at its first batch), images far outside model units (0..255 floats, as `FirstBatch`), no class at all
    for a class-conditional model that never learnt an unconditional prediction (label_dropout 0), or classes for an
    unconditional model (as `FirstBatch`: they would be ignored): counts kept
    on the device batch by batch (no read: no sync per batch), read once at the validation's end (`check`, with one gather across the ranks), where its loss is read."""

    def __init__(self) -> None:
        # (samples not finite, the first one's dataset position, labelled samples, samples seen, the images' largest
        # magnitude in thousandths (`image_peak`, a running max)): on the device
        self._found: list[torch.Tensor] | None = None

    def reset(self) -> None:
        """A validation starts: nothing seen yet."""
        self._found = None

    def see(self, x: torch.Tensor, index: torch.Tensor, labels: object) -> None:
        """At each validation batch, after check_batch (`labels`: the batch's as they came, a tensor of classes and
        NO_LABEL, or None, or NO_LABEL itself)."""
        bad = ~torch.isfinite(x.detach().flatten(1)).all(dim=1)
        unseen = torch.full_like(index, torch.iinfo(index.dtype).max)
        first = torch.where(bad.to(index.device), index, unseen).min().to(bad.device)
        labelled = torch.zeros((), dtype=torch.long, device=bad.device)
        if isinstance(labels, torch.Tensor):
            labelled = (labels != NO_LABEL).sum().to(bad.device)
        seen = torch.full((), len(bad), dtype=torch.long, device=bad.device)  # a fill: no copy from the host
        # the images' largest magnitude in thousandths: an integer, as the counts are
        milli = (image_peak(x).clamp(max=1e15) * 1000).round().long().to(bad.device)
        found = [bad.sum(), first, labelled, seen, milli]
        if self._found is None:
            self._found = found
        else:
            totals = self._found
            self._found = [totals[0] + found[0], torch.minimum(totals[1], first), totals[2] + found[2],
                           totals[3] + found[3], torch.maximum(totals[4], milli)]  # fmt: skip

    def check(self, module: L.LightningModule) -> None:
        """Refuse the data if a sample validated on any rank held NaN or infinity, or (`module` class-conditional,
        trained without label_dropout) no sample held a class, or (`module` unconditional) any did; every rank calls
        it (the gather)."""
        found, self._found = self._found, None
        if found is None:
            found = [torch.zeros((), dtype=torch.long, device=module.device)] * 5
            found[1] = torch.full((), torch.iinfo(torch.long).max, device=module.device)
        flags = torch.stack([value.to(module.device, torch.long) for value in found])
        if module._trainer is not None and module.trainer.world_size > 1:
            flags = module.all_gather(flags).reshape(-1, 5)  # type: ignore[union-attr]
        flags = flags.reshape(-1, 5).cpu()  # the read
        bad, first = int(flags[:, 0].sum()), int(flags[:, 1].min())
        labelled, total = flags[:, 2:4].sum(0).tolist()
        peak = int(flags[:, 4].max()) / 1000
        if bad:
            raise InvalidValue(
                "the validation data holds NaN or infinity: "
                f"{bad} of the {total} samples validated are not finite (first at dataset position {first}), and "
                "the validation loss is NaN",
                "clean the data: drop or repair those samples (torch.nan_to_num replaces such values) before "
                "validating or training",
            )
        if peak > IMAGE_UNITS_LIMIT:
            raise InvalidValue(
                f"the validation data holds images with values up to {peak:g}, far outside model units (-1..1): "
                "its validation loss says nothing of the model, whose samples are clipped to -1..1",
                SCALE_IMAGES,
            )
        num_classes = getattr(module, "num_classes", None)
        if num_classes is None and labelled:
            raise InvalidValue(
                f"the validation data holds class labels ({labelled} of the {total} samples validated), "
                "and this model is unconditional (its network has no num_classes): "
                "it would validate without them, as unconditional",
                "leave with_labels out of IndexedDataset to validate an unconditional model, "
                "or build the network with num_classes (the number of classes) to train a class-conditional one",
            )
        if total and num_classes is not None and not labelled and not module.hparams.get("label_dropout"):
            raise InvalidValue(
                f"every label of the validation data is NO_LABEL (-1), and this model is class-conditional "
                f"(num_classes={num_classes}) and never learnt an unconditional prediction ({{--label_dropout}} 0): "
                "its validation loss would say nothing of the model",
                "build IndexedDataset(..., with_labels=True) over (x, label) items, or validate with "
                "{LightningDataModule:--conditional} true",
                type(module),
            )


def last_checkpoint(trainer: L.Trainer) -> str:
    """The newest checkpoint of the run on disk ("" if none): its weights are finite, as no save of others gets
    this far. ModelCheckpoint names a file before saving it, so a name counts only once its file exists."""
    callback = trainer.checkpoint_callback
    candidates = [
        getattr(callback, name, "")
        for name in ("_last_checkpoint_saved", "last_model_path", "best_model_path")
    ]
    candidates.append(trainer.ckpt_path or "")  # a resumed run that has saved nothing yet
    return next((str(path) for path in candidates if path and os.path.isfile(path)), "")


def kept(trainer: L.Trainer) -> str:
    path = last_checkpoint(trainer)
    if not path:
        return "no checkpoint was written"
    return f"its last checkpoint, {path}, holds finite weights and is kept"


def likely_causes(trainer: L.Trainer) -> str:
    """The fix: the likely causes, the ones this run's settings point to first, and how to go on."""
    lr = trainer.lightning_module.hparams.get("lr")
    causes = ["lower {DiffusionModule:--lr}" + (f" (now {lr:g})" if isinstance(lr, float | int) else "")]
    precision = str(trainer.precision)
    if precision.startswith("16"):
        causes.append(
            f"train with {{Trainer:--precision}} bf16-mixed or 32 (16-bit values overflow; now {precision})"
        )
    if not trainer.gradient_clip_val:
        causes.append("clip gradients ({Trainer:--gradient_clip_val} 1)")
    causes.append("check the data for extreme values")
    path = last_checkpoint(trainer)
    again = (
        f"a new run, from the kept weights with {{DiffusionModule:--init_from}} {path}"
        if path
        else "a new run"
    )
    return f"{', '.join(causes)}, and train {again}"
