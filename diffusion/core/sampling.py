"""How to sample, in one place: the registry of samplers (`SAMPLERS`), `SamplingOptions` (the settings every layer
names the same way: every registered sampler's options, declared with their types, their help read from the
samplers), `build_sampler` (options -> the sampler that
runs), `ModelSampling` (what a model adds: its default options and what its sampler must fit) and
`reverse_steps`, which runs one on a bare network.

A sampler is resolved once, here, and then handed on built: `python -m diffusion.sample --sampler ddim` makes
the flags a `SamplingOptions` (cli/sample.py), `module.model_sampling.sampler(options)` layers them over the
model's defaults and builds the sampler (this file, which constructs the family's class in
`diffusion/core/samplers/`), and generation (`diffusion.generation.ranks`) runs the built sampler; nothing
resolves options afterwards.

A sampler is one object with one signature (`diffusion.core.samplers.contract`); its options are its dataclass
fields, checked where they are declared. The commands' flags (`python -m diffusion.sample --sampler --steps
--eta ...`), the config keys (`--model.sampling.*`, `--sample_grid.sampling.*`, the FID callback's) and their
help are made from `SamplingOptions`, so every layer reads the names, defaults and help from here.
"""

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import Field, dataclass, fields
from numbers import Real
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import torch
from torch import nn

from diffusion.core.guidance import (  # the guidance lines, said where guidance is
    NO_LABEL,
    guidance_unlearnt,
    guidance_without_labels,
    mark_models_own_guidance,
    unconditional_guidance,
)
from diffusion.core.noise import Generators, check_generator, check_initial_noise
from diffusion.core.samplers import ddpm_ddim, dpm_solver, karras
from diffusion.core.samplers.contract import Denoiser, Sampler, Step
from diffusion.core.samplers.contract import final_sample as final_sample  # its home was here
from diffusion.core.samplers.spacing import Spacing
from diffusion.core.schedule import NoiseSchedule, PredictionType
from diffusion.core.variance import VarianceType
from diffusion.errors import InvalidValue, OutOfRange, WrongType, check_bool, check_choice, check_whole_number

# The registry. A new sampler is its file in diffusion/core/samplers/ and one line here.
SAMPLERS: dict[str, type[Sampler]] = {
    sampler.name: sampler
    for sampler in (
        ddpm_ddim.DDPM,
        ddpm_ddim.DDIM,
        dpm_solver.DPMSolverPP2M,
        dpm_solver.DPMSolverPP2MSDE,
        karras.Heun,
        karras.EulerAncestral,
    )
}
DEFAULT_SAMPLER = "ddpm"  # a model whose options name no sampler samples as Ho et al. (all T steps)
# --sampler's choices, written out so type checkers and editors see them (a test holds them to SAMPLERS).
SamplerName = Literal["ddpm", "ddim", "dpmpp_2m", "dpmpp_2m_sde", "heun", "euler_ancestral"]


def options_of(sampler: type[Sampler]) -> dict[str, Field]:
    """A sampler's options: its dataclass fields, by name."""
    return {option.name: option for option in fields(sampler)}


def defaults_text(name: str) -> str:
    """Every default of an option, with the samplers that have it when they differ, e.g. for steps 'all T for
    ddpm, 50 for ddim, 20 for dpmpp_2m and dpmpp_2m_sde, ...'."""
    by_default: dict[str, list[str]] = {}
    for sampler in OPTION_OWNERS[name]:
        default = sampler.default_steps_text() if name == "steps" else str(options_of(sampler)[name].default)
        by_default.setdefault(default, []).append(sampler.name)
    if len(by_default) == 1:
        return next(iter(by_default))
    return ", ".join(f"{default} for {' and '.join(names)}" for default, names in by_default.items())


def _owners() -> dict[str, list[type[Sampler]]]:
    """Every option name, with the samplers that have it (in registration order)."""
    owners: dict[str, list[type[Sampler]]] = {}
    for sampler in SAMPLERS.values():
        for name in options_of(sampler):
            owners.setdefault(name, []).append(sampler)
    return owners


OPTION_OWNERS = _owners()


def option_help(name: str) -> str:
    """The help of an option, with the samplers that have it and their defaults."""
    owners = OPTION_OWNERS[name]
    declared = [options_of(sampler)[name] for sampler in owners]
    text = "; ".join(dict.fromkeys(option.metadata.get("help", "") for option in declared))
    whom = "every sampler" if len(owners) == len(SAMPLERS) else ", ".join(sampler.name for sampler in owners)
    return f"{text} ({whom}; default {defaults_text(name)})"


def sampler_help() -> str:
    listed = "; ".join(f"{name}: {sampler.summary}" for name, sampler in SAMPLERS.items())
    return f"the sampler: {listed} (default {DEFAULT_SAMPLER})"


@dataclass(frozen=True)
class SamplingOptions:
    """How to run the reverse process (the full help, from the registry, is set below the class)."""

    sampler: SamplerName | None = None
    steps: int | None = None
    clip_denoised: bool | None = None
    guidance_scale: float | None = None
    spacing: Spacing | None = None
    compile: bool | None = None
    variance: VarianceType | None = None
    eta: float | None = None
    s_churn: float | None = None
    s_tmin: float | None = None
    s_tmax: float | None = None
    s_noise: float | None = None

    def __post_init__(self) -> None:
        for name, value in self.as_kwargs().items():
            check_option_type(name, value)
        own: Iterable[str] = ()
        if self.sampler is not None:
            check_choice("sampler", self.sampler, SamplerName)
            build_sampler(self)  # the chosen sampler checks every option it has
            own = options_of(SAMPLERS[self.sampler])
        # An option of other samplers (all, with no sampler named yet) is still the default of a command that samples
        # with one of them (a checkpoint's eta 2 for a later --sampler ddim): refused when no sampler takes it.
        for name, value in self.as_kwargs().items():
            if name == "sampler" or name in own:
                continue
            errors = []
            for sampler in OPTION_OWNERS[name]:
                try:
                    sampler(**{name: value})
                    break
                except ValueError as error:
                    errors.append(error)
            else:
                raise errors[0]

    @classmethod
    def taken_from(cls, values: Any) -> "SamplingOptions":
        """The options among `values` (a command's parsed flags, which hold other keys too), checked."""
        return cls(**{f.name: values[f.name] for f in fields(cls)})

    def check_steps_fit(
        self, num_timesteps: int, owner: type | str | None = None, name: str = "steps"
    ) -> None:
        """Steps beyond the schedule, refused when a run starts rather than at its first validation; `owner`'s
        option `name` holds these options (a module's `sampling`: name 'sampling.steps')."""
        if self.steps is not None and self.steps > num_timesteps:
            raise InvalidValue(
                f"{{--{name}}} {self.steps} is more steps than the schedule's num_timesteps={num_timesteps}",
                f"pass at most {num_timesteps}, or leave it unset",
                owner,
            )

    def check_guidance_fits(
        self, conditional: bool, owner: type | None = None, name: str = "guidance_scale",
        label_dropout: float | None = None,
    ) -> None:  # fmt: skip
        """Guidance asked of a model without classes, or of one trained with `label_dropout` 0 (None: not known),
        refused when a run starts rather than at its first sample grid; `owner`'s option `name` holds it (a
        module's `sampling`: 'sampling.guidance_scale')."""
        if self.guidance_scale not in (None, 1) and not conditional:
            raise InvalidValue(
                f"{{--{name}}} {self.guidance_scale:g} asks for classifier-free guidance, "
                "but the model is unconditional (it has no classes to guide towards)",
                "leave it unset (or 1), or train a class-conditional model",
                owner,
            )
        if self.guidance_scale not in (None, 1) and label_dropout == 0:
            raise guidance_unlearnt(self.guidance_scale, name, owner)

    def over(self, base: "SamplingOptions | None") -> "SamplingOptions":
        """These options on top of `base`: a field set here wins, an unset one comes from `base`."""
        if base is None:
            return self
        return type(self)(
            **{f.name: getattr(base, f.name) if getattr(self, f.name) is None else getattr(self, f.name)
               for f in fields(self)}
        )  # fmt: skip

    def as_kwargs(self) -> dict[str, Any]:
        """The fields that are set."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def option_types() -> dict[str, object]:
    """Every option of the registered samplers, with its type (several samplers' types of one name: any of them):
    what `SamplingOptions` declares, field for field (tests/test_public_api.py holds the two equal)."""
    hints = {}
    for name, owners in OPTION_OWNERS.items():
        types = tuple(dict.fromkeys(get_type_hints(owner)[name] for owner in owners))
        hints[name] = Union[types] if len(types) > 1 else types[0]  # noqa: UP007
    return hints


def check_option_type(name: str, value: Any) -> None:
    """Refuse a set option of the wrong kind, as the commands' typed flags do: a fraction of steps is not rounded,
    text is not a number, 1 is not True."""
    kinds = [kind for kind in get_args(SamplingOptions.__annotations__[name]) if kind is not type(None)]
    if int in kinds:
        check_whole_number(name, value, fix=f"pass {name} as an int, or leave it unset")
    elif float in kinds and (isinstance(value, bool) or not isinstance(value, Real)):
        raise WrongType(name, value, "a number", f"pass {name} as a float, or leave it unset")
    elif bool in kinds and not isinstance(value, bool):
        raise WrongType(name, value, "True or False", f"pass {name}=True or {name}=False, or leave it unset")
    elif kinds and get_origin(kinds[0]) is Literal and not isinstance(value, str):
        raise WrongType(name, value, f"one of {list(get_args(kinds[0]))}", f"pass {name} by its name")


_OPTIONS_HELP = "\n".join(f"    {name}: {option_help(name)}" for name in OPTION_OWNERS)
SamplingOptions.__doc__ = (  # the help of the config keys and flags made from it, read from the registry
    "How to run the reverse process: the one place these settings are named and checked, for every layer.\n\n"
    "Every layer that chooses how to sample holds one (the model's defaults in its checkpoint, `SampleGrid`,\n"
    "`FIDCallback`, `python -m diffusion.sample`); a field left None takes the value of the layer below\n"
    "(`over`), and finally the sampler's own default. A field the chosen sampler does not have is not used:\n"
    "given to `module.sampler(...)` or `reverse_steps`, a warning says so (UnusedSamplingOption).\n\n"
    f"Args:\n    sampler: {sampler_help()}\n{_OPTIONS_HELP}\n"
)

DEFER = SamplingOptions()
"""Every field unset: each defers to the layer below (the default of the callbacks' and the module's options)."""


def build_sampler(*layers: "SamplingOptions | None") -> Sampler:
    """The sampler of these layers of options, the first on top (the user's, then a model's defaults, ...): each
    field takes the first layer that sets it, `sampler` included (default ddpm), and the sampler's own default
    where none does; a field the sampler does not have is left out (the user's are warned of where they are given:
    `warn_unused_options`). Built once: its checks run there."""
    merged: dict[str, Any] = {}
    for layer in reversed([layer for layer in layers if layer is not None]):
        merged.update(layer.as_kwargs())
    sampler = SAMPLERS[merged.get("sampler") or DEFAULT_SAMPLER]
    own = options_of(sampler)
    return sampler(**{name: value for name, value in merged.items() if name in own})


class UnusedSamplingOption(UserWarning):
    """An option given that the chosen sampler does not have (`eta` of ddpm): not used, and said so."""


def unused_options(sampler: Sampler, given: Iterable[str]) -> dict[str, str]:
    """Of the options `given`, those `sampler` has no option for, each with the samplers that take it ('ddim,
    euler_ancestral'): the one place that knows, for the API's warning and the sample command's note."""
    return {
        name: ", ".join(owner.name for owner in OPTION_OWNERS[name])
        for name in OPTION_OWNERS
        if name in given and type(sampler) not in OPTION_OWNERS[name]
    }


def warn_unused_options(
    sampler: Sampler, options: "SamplingOptions | dict[str, Any] | None", stacklevel: int = 3
) -> None:
    """Warn (UnusedSamplingOption) of every option set in `options`, the caller's own, that `sampler` does not
    have: `module.sampler(SamplingOptions(sampler='ddpm', eta=0.5))` would otherwise drop eta without a word.
    The sample command says the same as a note of its flags, and silences this warning around its call."""
    given = options.as_kwargs() if isinstance(options, SamplingOptions) else dict(options or {})
    for name, takers in unused_options(sampler, given).items():
        verb = "take" if "," in takers else "takes"
        warnings.warn(
            f"{name}={given[name]!r} is no option of the {sampler.name} sampler: not used ({takers} {verb} it)",
            UnusedSamplingOption,
            stacklevel=stacklevel,
        )


@dataclass(frozen=True)
class ModelSampling:
    """What a model adds to the user's options, read from it once (`DiffusionModule.model_sampling`).

    defaults: the model's own layers of options under the user's, the first on top (a checkpoint's `sampling`,
        then the default of a model that learned its variance).
    schedule, learned_variance, conditional: what the sampler must fit (`Sampler.check_fits`).
    label_dropout: the model's (None: not known); 0, it never learnt the unconditional prediction guidance needs.
    """

    defaults: tuple["SamplingOptions", ...]
    schedule: NoiseSchedule
    learned_variance: bool
    conditional: bool
    label_dropout: float | None = None

    def sampler(self, options: "SamplingOptions | None" = None) -> Sampler:
        """The sampler `options` ask for, fields set there over this model's defaults, built once and checked
        against the model."""
        check_options(options, "options", "module.sampler(SamplingOptions(...))")
        if options is not None and options.guidance_scale not in (None, 1) and not self.conditional:
            raise unconditional_guidance(options.guidance_scale)
        if options is not None and options.guidance_scale not in (None, 1) and self.label_dropout == 0:
            raise guidance_unlearnt(options.guidance_scale)
        sampler = build_sampler(options, *self.defaults)
        sampler.check_fits(self.schedule, self.learned_variance, conditional=self.conditional)
        if (
            options is None or options.guidance_scale is None
        ):  # without labels: unconditional, as it always was
            mark_models_own_guidance(sampler)
        # The user's own options only (a default's is the model's): said at the caller of module.sampler
        warn_unused_options(sampler, options, stacklevel=4)
        return sampler


def check_options(options: Any, name: str, form: str) -> None:
    """Refuse anything but SamplingOptions (or None) where options go, naming what was given: a sampler's name,
    a dict of options, an already built sampler."""
    if options is None or isinstance(options, SamplingOptions):
        return
    if isinstance(options, Sampler):
        fix = f"it is built already: pass it where a sampler goes (generate(module, n, sampler={name}))"
    elif isinstance(options, str | dict):
        fix = f"wrap it: {form.replace('...', 'sampler=...' if isinstance(options, str) else '**...')}"
    else:
        fix = f"pass {form}"
    raise WrongType(name, options, "SamplingOptions", fix)


def reverse_steps(
    model: nn.Module,
    schedule: NoiseSchedule,
    x_T: torch.Tensor,
    *,
    prediction_type: PredictionType = "eps",
    generator: Generators = None,
    progress: bool = False,
    labels: torch.Tensor | None = None,
    learned_variance: bool = False,
    **options: Any,
) -> Iterator[Step]:
    """Run the reverse process of a bare network from x_T, yielding (t, x_{t_prev}, predicted x_0) after every
    step; `DiffusionModule.trajectory` does the same for a model with its own defaults.

    options: `SamplingOptions`' fields (sampler, steps, eta, variance, clip_denoised, guidance_scale, ...); unset,
        the sampler's defaults (ddpm over all T steps).
    labels: (B,) class labels for a class-conditional `model(x, t, y)` (NO_LABEL: none); None calls `model(x, t)`.
    learned_variance: the network outputs 2C channels, its prediction then its variance's v
        (`diffusion.core.variance`).
    """
    check_reverse_steps_arguments(model, schedule, x_T, labels, options, generator)
    check_bool("learned_variance", learned_variance)
    check_bool("progress", progress)
    sampler = build_sampler(SamplingOptions(**options))
    check_choice("prediction_type", prediction_type, PredictionType)
    sampler.check_fits(schedule, learned_variance, conditional=labels is not None)
    warn_unused_options(sampler, options)
    denoiser = Denoiser(model, schedule, prediction_type, learned_variance, labels)
    return sampler(denoiser, x_T, generator, progress)


def check_reverse_steps_arguments(
    model: Any, schedule: Any, x_T: Any, labels: Any, options: dict[str, Any], generator: Any = None
) -> None:
    """`reverse_steps`' arguments, each refused by name before the first step: the kinds of its model, schedule
    and x_T (floating point and finite: integer noise failed in torch's matmul, NaN noise gave NaN samples), its
    generator, its options' names, its labels (one whole number per sample) and guidance without labels."""
    if not callable(model):  # a network, or any callable model(x, t[, y]) (a wrapped or guided one)
        raise WrongType(
            "model", model, "a network, model(x, t)", "pass the network itself, e.g. module.network"
        )
    if not isinstance(schedule, NoiseSchedule):
        raise WrongType("schedule", schedule, "a NoiseSchedule", "pass the model's, e.g. module.schedule")
    check_initial_noise(x_T, model)
    check_generator(generator, len(x_T) if x_T.ndim else 0)
    unknown = sorted(set(options) - {f.name for f in fields(SamplingOptions)})
    if unknown:
        raise WrongType(
            unknown[0], options[unknown[0]], "an option of reverse_steps",
            f"pass SamplingOptions' fields as keywords ({', '.join(f.name for f in fields(SamplingOptions))})",
        )  # fmt: skip
    if isinstance(options.get("sampler"), SamplingOptions | Sampler):
        raise WrongType("sampler", options["sampler"], "a sampler's name", "pass the options' fields as keywords: "
                        "reverse_steps(..., **options.as_kwargs())")  # fmt: skip
    num_classes = getattr(model, "num_classes", 0)  # None: a network without classes; 0: not said
    if labels is None:
        scale = options.get("guidance_scale")
        if scale not in (None, 1) and num_classes is None:
            raise unconditional_guidance(scale)
        if scale not in (None, 0, 1):  # a conditional network (or one that does not say); 0: unconditional
            each = f"class_labels(len(x_T), {num_classes})" if num_classes else "torch.tensor([...])"
            raise guidance_without_labels(
                scale, f"labels={each}, one class per sample of x_T", "or leave guidance_scale unset"
            )
        return
    if not isinstance(labels, torch.Tensor) or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise WrongType("labels", labels, "an integer tensor", "pass torch.tensor([...], dtype=torch.long)")
    if labels.shape != (len(x_T),):
        raise OutOfRange(
            "labels", f"<shape {tuple(labels.shape)}>", f"one label per sample of x_T, shape ({len(x_T)},)",
            "pass as many labels as x_T has samples",
        )  # fmt: skip
    outside = (labels < NO_LABEL) | (labels >= num_classes) if num_classes else labels < NO_LABEL
    if bool(outside.any()):  # once, before the first step; the network's forward would say it of its `y`
        classes = f"classes 0..{num_classes - 1}" if num_classes else "classes"
        raise OutOfRange("labels", sorted(set(labels[outside].tolist()))[:12], f"{classes} (or {NO_LABEL}: no label)",
                         f"pass labels of this model's classes, e.g. class_labels(len(x_T), {num_classes or 'N'})")  # fmt: skip
