"""DiffusionModule's options said whole (tester round 11b): a misspelled key of a `sampling` dict named with the
option meant and every option there is; repeated class names refused; `compile_channels_last` without a compiled
training step said not used, as `compile_mode` is, and both said of the flags on train.py's command line; the fix
of `module.sample(options=<a dict>)` one that `sample` takes."""

import warnings

import pytest
import torch

from diffusion.cli.train_warnings import note_as_written
from diffusion.core.sampling import SamplingOptions
from diffusion.data.labels import class_labels
from diffusion.models import MLP
from diffusion.training.module import DiffusionModule
from diffusion.training.option_notes import OptionNote


def module(num_classes: int | None = None, **options) -> DiffusionModule:
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8, num_classes=num_classes)
    return DiffusionModule(network, sample_shape=(2,), num_timesteps=20, beta_end=0.2, **options)


@pytest.mark.parametrize(
    ("sampling", "line"),
    [({"sampler": "ddim", "step": 2}, "sampling has no option 'step' (SamplingOptions has sampler, steps, "
      "clip_denoised, guidance_scale, spacing, compile, variance, eta, s_churn, s_tmin, s_tmax, s_noise) — write "
      "'steps' if that is what was meant, or leave 'step' out"),
     ({"bogus": 1}, "sampling has no option 'bogus' (SamplingOptions has sampler, steps, clip_denoised, "
      "guidance_scale, spacing, compile, variance, eta, s_churn, s_tmin, s_tmax, s_noise) — leave 'bogus' out")],
)  # fmt: skip
def test_a_misspelled_sampling_key_is_said_with_the_options_there_are(sampling, line):
    # Was Python's "SamplingOptions.__init__() got an unexpected keyword argument 'step'", naming no option.
    with pytest.raises(TypeError) as error:
        module(sampling=sampling)
    assert str(error.value) == line
    assert module(sampling={"sampler": "ddim", "steps": 2}).sampling == SamplingOptions(
        sampler="ddim", steps=2
    )


@pytest.mark.parametrize(
    ("call", "line"),
    [(lambda: module(3, class_names=["x", "y", "x"]), "class_names has 'x' twice (classes 0 and 2) — give each "
      "class its own name"),
     (lambda: class_labels(4, 3, class_label="b", class_names=["a", "b", "b"]), "class_names has 'b' twice "
      "(classes 1 and 2)"),
     (lambda: class_labels(4, 3, class_names=["a", "a", "a"]), "class_names has 'a' 3 times (classes 0, 1 and 2)")],
)  # fmt: skip
def test_a_class_name_given_twice_is_refused(call, line):
    # `class_label='b'` sampled class 1 only: class 2 could not be asked for by name.
    with pytest.raises(ValueError) as error:
        call()
    assert str(error.value).startswith(line), error.value


def notes_of(**options) -> list[OptionNote]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module(**options)
    return [warning.message for warning in caught if isinstance(warning.message, OptionNote)]


def test_compile_channels_last_without_a_compiled_step_is_said_not_used():
    (note,) = notes_of(compile_channels_last=True)
    assert str(note) == (
        "compile_channels_last=True is not used: the training step is not compiled — pass compile_training=True "
        "(or cuda) to compile it"
    )
    # train.py says it of its flags, as it says the module's errors
    assert note_as_written(note, {DiffusionModule: "model"}, []) == (
        "--model.compile_channels_last true is not used: the training step is not compiled — pass "
        "--model.compile_training true (or cuda) to compile it"
    )
    assert not notes_of(compile_channels_last=True, compile_training=True)
    assert not notes_of(compile_channels_last=False)


def test_compile_mode_is_said_of_the_flags_on_the_command_line():
    # Was said in Python's words on train.py's command line: "compile_mode='default' ... pass compile_training true"
    (note,) = notes_of(compile_mode="default")
    assert note_as_written(note, {DiffusionModule: "model"}, []).startswith(
        "--model.compile_mode default is not used: the training step is not compiled — pass "
        "--model.compile_training true"
    )


@pytest.mark.parametrize(
    ("options", "fix"),
    [({"sampler": "ddim", "steps": 2}, "wrap it: module.sample(n, options=SamplingOptions(**...))"),
     ("ddim", "wrap it: module.sample(n, options=SamplingOptions(sampler=...))")],
)  # fmt: skip
def test_the_fix_of_options_given_to_sample_is_one_sample_takes(options, fix):
    # Said "wrap it: module.sampler(SamplingOptions(**...))", and sample refused the sampler that made.
    model = module()
    with pytest.raises(TypeError) as error:
        model.sample(2, seed=0, options=options)
    assert str(error.value).endswith(fix), error.value
    wrapped = SamplingOptions(**options) if isinstance(options, dict) else SamplingOptions(sampler=options)
    assert model.sample(2, seed=0, options=wrapped).shape == (2, 2)  # doing what it says samples
    with pytest.raises(
        TypeError, match=r"wrap it: module.trajectory\(x_T, options=SamplingOptions\(\*\*...\)\)$"
    ):
        next(model.trajectory(torch.zeros(2, 2), options={"steps": 2}))
    # a sampler built already goes where a sampler goes: generate(module, n, sampler=...)
    with pytest.raises(
        TypeError, match=r"pass it where a sampler goes \(generate\(module, n, sampler=options\)\)$"
    ):
        model.sample(2, options=model.sampler(SamplingOptions(steps=2)))
