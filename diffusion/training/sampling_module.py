"""SamplingModule: the sampling side of `DiffusionModule` (diffusion/training/module.py), the network and its
NoiseSchedule as samplers see them: each sample's initial noise, the model's own sampler, the denoiser, the
reverse process and its samples. What generation reads of a module (`diffusion.generation.ranks.Sampleable`)
lives here; the training objective, the optimizer and the training hooks are module.py's.
"""

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from torch import nn

from diffusion.core import noise as counter_noise
from diffusion.core.guidance import labels_unlearnt
from diffusion.core.noise import Generators, check_generator, check_initial_noise, randn
from diffusion.core.samplers.contract import Denoiser, Sampler, Step
from diffusion.core.sampling import (
    DEFER,
    ModelSampling,
    SamplingOptions,
    check_options,
    final_sample,
    guidance_without_labels,
)
from diffusion.core.schedule import NoiseSchedule
from diffusion.data.labels import labels_for_sampling
from diffusion.errors import InvalidValue, OutOfRange, WrongType, check_bool, check_whole_number
from diffusion.generation.arguments import check_model_can_sample, checked_seed
from diffusion.generation.render import check_normalization
from diffusion.models import MLP, UNet
from diffusion.models.checks import forward_parameters, sample_shape_given

LEARNED_VARIANCE = SamplingOptions(variance="learned_range")  # how a model that learned its variance samples
SHAPE_FIX = "pass the shape of one sample: (C, H, W) for images, (D,) for vectors, e.g. (1, 8, 8)"


def checked_sample_shape(sample_shape: Any) -> tuple[int, ...]:
    """`sample_shape` as a tuple of ints, refused unless a non-empty tuple or list of whole numbers >= 1: a
    negative or text size failed at the first sample, in torch's words."""
    if not isinstance(sample_shape, tuple | list):
        raise WrongType("sample_shape", sample_shape, "a tuple of sizes", SHAPE_FIX)
    if not sample_shape:
        raise OutOfRange("sample_shape", sample_shape, "a shape of one size or more", SHAPE_FIX)
    return tuple(
        check_whole_number(f"sample_shape[{i}]", size, 1, SHAPE_FIX) for i, size in enumerate(sample_shape)
    )


def check_is_network(network: Any) -> None:
    """A network built: a name or a class passed where it goes would fail only at the first step."""
    if not isinstance(network, nn.Module):
        raise WrongType(
            "network", network, "a network (a torch.nn.Module)", "pass one built, e.g. UNet(in_channels=1)"
        )


def check_network_fits(network: nn.Module, sample_shape: tuple[int, ...], variance: Any = "fixed") -> None:
    """The network's own check of one sample's shape (`check_input_shape`, where it has one: UNet, MLP), said of the
    `sample_shape` argument to a Python caller; a command, which sets it from the data, says it of the data. Then
    its output channels (`check_network_outputs`). First, its call: a module of another kind (`torch.nn.Linear`)
    failed at the first step with torch's `forward() takes 2 positional arguments but 3 were given`."""
    takes = forward_parameters(type(network))
    if takes is not None:
        raise WrongType(
            "network", network, f"a noise-prediction network (its forward takes {takes}, not (x, t, y=None))",
            "pass a diffusion.models network (UNet for images, MLP for vectors), or a torch.nn.Module whose "
            "forward takes (x, t, y=None)",
        )  # fmt: skip
    check_input_shape = getattr(network, "check_input_shape", None)
    if callable(check_input_shape):
        with sample_shape_given():
            check_input_shape(sample_shape)
    check_network_outputs(network, sample_shape, variance)


def output_channels(network: nn.Module) -> int | None:
    """The channels (features) a network of this project outputs, None for one that does not say (a user's own)."""
    if isinstance(network, UNet):
        return int(network.conv_out.out_channels)
    if isinstance(network, MLP):
        return int(network.out.out_features)
    return None


def check_network_outputs(network: nn.Module, sample_shape: tuple[int, ...], variance: Any) -> None:
    """A network that outputs C channels for samples of C (`variance` "fixed"), or 2C, the prediction then the
    variance's v ("learned_range", for images): another count trained on a loss broadcast against the samples and
    failed only when sampling, naming nothing the user wrote. An unknown `variance` is left to its own check, and
    "learned_range" for vectors to check_training_options ("is for images")."""
    given, learned, images = output_channels(network), variance == "learned_range", len(sample_shape) == 3
    if given is None or variance not in ("fixed", "learned_range") or (learned and not images):
        return
    count = sample_shape[0]
    wanted = 2 * count if learned else count
    if given == wanted:
        return
    name, unit = type(network).__name__, "channel" if images else "feature"
    why = (
        f"2 x {count} = {wanted} (the prediction, then the variance's v)"
        if learned
        else f"{count}, the {unit}s of sample_shape={tuple(sample_shape)}"
    )
    other = (
        ", or pass {--variance} 'fixed'"
        if learned and given == count
        else ", or pass {--variance} 'learned_range' (it learns the variance in the second half)"
        if images and given == 2 * count
        else ""
    )
    raise InvalidValue(
        f"{name} outputs {given} {unit}{'s' * (given != 1)} ({{{name}:--out_channels}}={given}), and with {{--variance}} "
        f"{variance!r} it must output {why}",
        f"build the {name} with {{{name}:--out_channels}}={wanted}{' (or leave it out)' * (not learned)}{other}",
    )


FROM_THE_DATA = (
    "build it from the data's values: DiffusionModule(network, sample_shape=data.sample_shape, "
    "normalization=data.normalization, class_names=data.class_names), "
    "the network with num_classes=data.num_classes (train.py does this)"
)


def _classes(num_classes: int | None) -> str:
    return "None (unconditional)" if num_classes is None else str(num_classes)


def _normalization(values: dict[str, list[float]]) -> str:
    return " ".join(f"{key} {values[key]}" for key in ("shift", "scale"))


def _same_normalization(a: dict[str, list[float]], b: dict[str, list[float]]) -> bool:
    return all(
        len(a[key]) == len(b[key])
        and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9) for x, y in zip(a[key], b[key], strict=True))
        for key in ("shift", "scale")
    )


DATA_NORMALIZATION_FIX = (
    "give the data module a normalization dict of a 'shift' and a 'scale' list of numbers, one of each per channel "
    "or feature (data = model * scale + shift)"
)


def check_fits_data(module: "SamplingModule", data: Any) -> None:
    """Refuse a module built for other data than `data`, the data module its trainer runs it on: train.py
    builds the module from the data (sample_shape, normalization, the network's num_classes, class_names), a
    Python `Trainer.fit(module, datamodule=data)` takes whatever the module was built with, and would sample
    shapes it never saw, render with another scale, or drop the data's labels without a word. What a data
    module does not say (one without these attributes), or the module was built without (normalization or
    class_names None), is not compared."""
    if data is None:
        return
    wrong = []
    data_shape = getattr(data, "sample_shape", None)
    if data_shape is not None and tuple(data_shape) != tuple(module.sample_shape):
        wrong.append(f"sample_shape {tuple(module.sample_shape)} where the data's is {tuple(data_shape)}")
    own, theirs = module.hparams.get("normalization"), getattr(data, "normalization", None)
    # A user's data module may hold tensors or arrays: compared as floats, each checked as the module's was.
    if own and isinstance(theirs, Mapping):
        ours = check_normalization(own)
        theirs = check_normalization(theirs, f"{type(data).__name__}.normalization", DATA_NORMALIZATION_FIX)
        if not _same_normalization(ours, theirs):
            wrong.append(f"normalization {_normalization(ours)} where the data's is {_normalization(theirs)}")
    own_names, names = module.hparams.get("class_names"), getattr(data, "class_names", None)
    if hasattr(data, "num_classes") and data.num_classes != module.num_classes:
        dropped = " (the data's labels would be dropped)" if module.num_classes is None else ""
        wrong.append(
            f"num_classes {_classes(module.num_classes)}{dropped} where the data's is {_classes(data.num_classes)}"
        )
    elif own_names is not None and names is not None and list(own_names) != list(names):
        wrong.append(f"class_names {list(own_names)} where the data's are {list(names)}")
    if wrong:
        raise InvalidValue(
            f"this {type(module).__name__} was built for other data than its trainer's {type(data).__name__}: "
            + "; ".join(wrong),
            FROM_THE_DATA,
        )


class SamplingModule(L.LightningModule):
    """Sampling from a trained network: the base of `DiffusionModule`, whose `__init__` sets what this reads
    (the attributes below, and the hyperparameters `normalization`, `prediction_type` and `variance`)."""

    network: nn.Module
    schedule: NoiseSchedule
    sample_shape: tuple[int, ...]
    sampling: SamplingOptions  # this model's defaults for `sample()`, the callbacks and the sample CLI

    @property
    def num_classes(self) -> int | None:
        """Classes of a class-conditional network, None for an unconditional one."""
        return getattr(self.network, "num_classes", None)

    @property
    def normalization(self) -> dict[str, list[float]]:
        """Maps model units to data units (data = model * scale + shift); set from the data by the CLI."""
        if not self.hparams.get("normalization"):
            raise InvalidValue(
                "this model has no normalization, so its samples cannot be turned into data units",
                "build it with DiffusionModule(..., normalization=datamodule.normalization) (train.py does)",
            )
        return self.hparams["normalization"]

    def initial_noise(
        self, num_samples: int, seed: int | None = None, indices: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, Generators]:
        """x_T (num_samples, *sample_shape) and the generator(s) the reverse process draws from.

        With `seed`, the noise of sample i is a function of (seed, i) for i in `indices` (default
        0..num_samples-1; counter-based, diffusion/core/noise.py), so any split of N samples into batches, ranks
        or devices gives the same N samples. Without, the global RNG.
        """
        generator = None
        if seed is None and indices is not None:  # they would choose nothing: the global RNG draws the noise
            raise InvalidValue(
                "indices without a seed choose nothing (the noise then comes from the global random generator)",
                "pass seed= too (sample i's noise is a function of (seed, i)), or leave indices out",
            )
        if seed is not None:
            # torch would take a larger or a negative one modulo 2**64: another seed's samples, without a word
            seed = checked_seed(seed)
            indices = torch.arange(num_samples) if indices is None else indices
            if not isinstance(indices, torch.Tensor):
                raise WrongType("indices", indices, "a tensor", "pass torch.arange(n) or a slice of it")
            if indices.is_floating_point() or indices.is_complex():
                raise InvalidValue(
                    f"indices of dtype {indices.dtype} would be truncated (sample 0.5 drawn as sample 0)",
                    "pass whole-number indices, e.g. torch.arange(n) or a slice of it",
                )
            if indices.numel() and int(indices.min()) < 0:
                raise OutOfRange(
                    "indices", sorted(set(indices[indices < 0].tolist()))[:5], "sample indices >= 0",
                    "pass torch.arange(n) or a slice of it (sample i's noise is a function of (seed, i))",
                )  # fmt: skip
            if indices.shape != (num_samples,):
                raise InvalidValue(
                    f"indices has shape {tuple(indices.shape)}, not ({num_samples},) for num_samples={num_samples}",
                    "pass one index per sample (the noise of sample i is a function of (seed, i))",
                )
            generator = counter_noise.PerSampleNoise(seed, indices, step=0)
        return randn((num_samples, *self.sample_shape), generator, self.device), generator

    @property
    def model_sampling(self) -> ModelSampling:
        """What this model adds to a user's sampling options: its defaults (its `sampling`, then the learned
        variance of a model that learned it, unless told otherwise) and what a sampler must fit."""
        learned = self.hparams["variance"] == "learned_range"
        return ModelSampling(
            (self.sampling, LEARNED_VARIANCE if learned else DEFER),
            self.schedule,
            learned,
            self.num_classes is not None,
            self.hparams.get("label_dropout"),  # None where a loaded model lacks it: then nothing is said
        )

    def sampler(self, options: SamplingOptions | None = None) -> Sampler:
        """The sampler `options` ask for: fields set there override this model's defaults field by field; built
        once, checked against this model (`model_sampling`)."""
        return self.model_sampling.sampler(options)

    def denoiser(self, num_samples: int, labels: torch.Tensor | None = None) -> Denoiser:
        """The network as samplers see it, for `num_samples` samples of these `labels` (B,): the class of each
        sample of a class-conditional model (NO_LABEL: none); None samples a conditional model unconditionally,
        refused, as NO_LABEL is, for a model trained with label_dropout 0 (it never learnt that)."""
        checked = labels_for_sampling(labels, self.num_classes, num_samples)
        if self.num_classes is not None:  # a model that never learnt without labels: every sample takes one
            labels_unlearnt(checked, self.num_classes, self.hparams.get("label_dropout"))
        return Denoiser(
            self.network, self.schedule, self.hparams["prediction_type"],
            learned_variance=self.hparams["variance"] == "learned_range", labels=self._to_device(checked),
        )  # fmt: skip

    def _to_device(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        return None if tensor is None else tensor.to(self.device)

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Eval mode within the block, the module's own mode after it."""
        was_training = self.training
        self.eval()
        try:
            yield
        finally:
            self.train(was_training)

    def trajectory(
        self, x_T: torch.Tensor, generator: Generators = None, options: SamplingOptions | None = None,
        progress: bool = False, labels: torch.Tensor | None = None,
    ) -> Iterator[Step]:  # fmt: skip
        """The reverse process from x_T in eval mode: (t, x_{t_prev}, predicted x_0) after every step, by
        `self.sampler(options)` for `self.denoiser(len(x_T), labels)`, guided by `guidance_scale`.

        Its arguments are checked when it is called, before the first step, by `reverse_steps`' own checks: x_T a
        finite floating-point tensor (N, *sample_shape) on this model's device, the generator(s) and `progress`;
        the model as `sample` checks it (`check_model_can_sample`)."""
        check_options(options, "options", "module.trajectory(x_T, options=SamplingOptions(...))")
        check_bool("progress", progress)  # "x" is truthy: a bar, as reverse_steps and generate refuse it
        check_model_can_sample(self)  # as sample: a .half() module, a meta one
        check_initial_noise(x_T, self.network, "module.sample_shape", "module.sample({n})")
        self._check_noise_fits(x_T)
        check_generator(generator, len(x_T))
        self._check_guidance_has_labels(options, labels, "len(x_T)")
        return self._reverse(x_T, generator, options, progress, labels)

    def _check_guidance_has_labels(self, options: SamplingOptions | None, labels: Any, count: str) -> None:
        """The caller's guidance (a scale but 0 and 1) without labels, refused: no sample has a label, so both
        halves are the unconditional prediction, guidance 0's samples at twice its cost. The model's own scale
        (its `sampling`) samples unconditionally as ever; one trained with label_dropout 0 is refused guidance
        by its sampler (`model_sampling`), as is a model without classes."""
        scale = None if options is None else options.guidance_scale
        if labels is not None or scale in (None, 0, 1) or self.num_classes is None:
            return
        if self.hparams.get("label_dropout") != 0:
            raise guidance_without_labels(
                scale, f"labels=class_labels({count}, {self.num_classes}), one class per sample",
                "or leave guidance_scale unset (0 for unconditional samples)",
            )  # fmt: skip

    def _check_noise_fits(self, x_T: torch.Tensor) -> None:
        """x_T of (N, *sample_shape) on this model's device, read without a host sync: another shape would be said
        as the data's (a vector model's) or sampled at a size the model never saw, a 0-d tensor would end in torch's
        len(), another device in torch's words."""
        shape = tuple(self.sample_shape)
        if x_T.ndim == 0 or tuple(x_T.shape[1:]) != shape:
            one = ", ".join(map(str, shape))
            raise InvalidValue(
                f"x_T has shape {tuple(x_T.shape)}, and this model samples (N, {one}) (its sample_shape={shape})",
                "pass the initial noise of its shape, e.g. torch.randn(n, *module.sample_shape)",
            )
        if x_T.device != self.device:
            raise InvalidValue(
                f"x_T is on {x_T.device} and this model on {self.device}",
                "pass x_T.to(module.device), or move the model there: module.to(x_T.device)",
            )

    def _reverse(
        self, x_T: torch.Tensor, generator: Generators, options: SamplingOptions | None, progress: bool,
        labels: torch.Tensor | None,
    ) -> Iterator[Step]:  # fmt: skip
        """The steps of `trajectory`, its arguments checked (or made here, by `sample`): sampler and denoiser built
        now, so that their refusals come at the call too, and the steps run in eval mode."""
        sampler = self.sampler(options)
        denoiser = self.denoiser(len(x_T), labels)

        def steps() -> Iterator[Step]:
            with self.evaluating():
                yield from sampler(denoiser, x_T, generator, progress)

        return steps()

    def sample(
        self, num_samples: int, *, seed: int | None = None, indices: torch.Tensor | None = None,
        options: SamplingOptions | None = None, progress: bool = False, labels: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Draw samples in model units, shape (num_samples, *sample_shape); see `initial_noise`, `trajectory`.
        `num_samples` is refused unless a whole number >= 1, and a module converted to 16 bits, as `generate`
        refuses them."""
        num_samples = check_whole_number(
            "num_samples", num_samples, 1, "pass how many samples to draw, e.g. module.sample(64)"
        )
        check_bool("progress", progress)  # "no" is truthy: a bar, as generate refuses it
        check_model_can_sample(self)  # a .half() module ended in torch's dtype error at its first layer
        # Its own form: module.sampler's ("module.sampler(SamplingOptions(**...))") led to the next refusal here.
        check_options(options, "options", "module.sample(n, options=SamplingOptions(...))")
        self._check_guidance_has_labels(options, labels, "num_samples")
        x_T, generator = self.initial_noise(num_samples, seed, indices)
        return final_sample(self._reverse(x_T, generator, options, progress, labels))
