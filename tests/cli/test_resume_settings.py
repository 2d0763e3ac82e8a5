"""The settings a resumed run may change are named exactly (`diffusion/cli/resume.py`'s NOT_TRAINING and its one
group, `model.sampling`): each listed key is exempt from the check that a resume trains what its run trained, and a
key that merely starts like one (`model.compile_...`) is a training setting like any other."""

import inspect

import pytest

from diffusion.cli.resumed_state import (
    NOT_TRAINING,
    NOT_TRAINING_GROUPS,
    differing_training_settings,
    is_training_setting,
)
from diffusion.data.images import ImageDataModule
from diffusion.training.callbacks.ema import EMA
from diffusion.training.module import DiffusionModule


def nested(key: str, value) -> dict:
    """ "a.b.c", 1 -> {"a": {"b": {"c": 1}}}: a config as LightningCLI dumps it."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


EXEMPT = sorted(NOT_TRAINING) + ["model.sampling", "model.sampling.sampler", "model.sampling.steps"]
# Keys a prefix would have exempted along with the listed ones.
LOOK_ALIKES = [f"{key}_other" for key in sorted(NOT_TRAINING)] + [
    "model.sampling_other",
    "model.samplingx.steps",
]


@pytest.mark.parametrize("key", EXEMPT)
def test_every_listed_key_may_change_on_resume(key):
    assert not is_training_setting(key)
    assert differing_training_settings(nested(key, 1), nested(key, 2)) == []


@pytest.mark.parametrize("key", LOOK_ALIKES)
def test_a_key_that_only_starts_like_a_listed_one_is_a_training_setting(key):
    assert is_training_setting(key)
    assert differing_training_settings(nested(key, 1), nested(key, 2)) == [(key, 1, 2)]


def test_the_compile_settings_are_each_listed():
    """`model.compile` once exempted the other compile settings by prefix, unsaid; each is named now."""
    compile_settings = {
        name for name in inspect.signature(DiffusionModule).parameters if name.startswith("compile")
    }
    assert {f"model.{name}" for name in compile_settings} <= NOT_TRAINING
    assert compile_settings == {"compile", "compile_training", "compile_mode", "compile_channels_last"}


def test_every_listed_key_names_a_setting_the_code_takes():
    """A renamed option would leave its old exemption behind, and its new name checked."""
    takes = {
        "model": inspect.signature(DiffusionModule).parameters,
        "data.init_args": inspect.signature(ImageDataModule).parameters,
        "ema": inspect.signature(EMA).parameters,
    }
    for key in [*NOT_TRAINING, *NOT_TRAINING_GROUPS]:
        group, _, name = key.rpartition(".")
        assert name in takes[group], f"{key} is no setting of {group}"
