"""A schedule's options refused in one line naming the option, or said in a warning, never taken as something else
without a word: linear betas that would reach 1 (clipped, with a warning), a truthy text for a bool, a size no
memory holds, beta_start/beta_end a schedule does not take (a warning)."""

import warnings

import pytest
import torch

import diffusion.errors
from diffusion.core.schedule import NoiseSchedule
from diffusion.errors import OutOfRange, WrongType


@pytest.mark.parametrize(
    ("options", "fewest", "clipped"), [({"num_timesteps": 10}, 21, 5), ({"num_timesteps": 20}, 21, 1),
                                       ({"num_timesteps": 5, "beta_end": 0.1}, 101, 4)],
)  # fmt: skip
def test_linear_betas_that_would_reach_1_are_clipped_with_a_warning_that_says_so(options, fewest, clipped):
    # Scaled by 1000 / T, beta_end 0.02 reaches 1 at T = 20: the betas were clipped at 0.999 without a word. Kept
    # clipped (checkpoints of such schedules load as they trained), and said.
    with pytest.warns(
        UserWarning, match=rf"the last {clipped} are clipped at 0.999.* num_timesteps {fewest} or more"
    ):
        betas = NoiseSchedule(**options).betas
    assert float(betas.max()) == pytest.approx(0.999) and int((betas > 0.9989).sum()) == clipped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NoiseSchedule(**{**options, "num_timesteps": fewest})  # the fewest it names clips none
    assert NoiseSchedule("cosine", options["num_timesteps"]).betas.max() < 1  # as the fix says


def test_a_smaller_beta_end_fits_few_timesteps_unclipped():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        betas = NoiseSchedule(num_timesteps=10, beta_end=0.0099).betas
    torch.testing.assert_close(betas, torch.linspace(0.01, 0.99, 10))


@pytest.mark.parametrize("value", ["no", "False", 0, 1, None])
def test_zero_terminal_snr_takes_only_a_bool(value):
    # "no" was truthy: the schedule was rescaled to zero terminal SNR, the opposite of what was written.
    with pytest.raises(WrongType, match=r"^zero_terminal_snr=.* not True or False"):
        NoiseSchedule(zero_terminal_snr=value)


@pytest.mark.parametrize("name", ["beta_start", "beta_end"])
@pytest.mark.parametrize("value", [True, "0.01"])
def test_betas_take_only_numbers(name, value):
    with pytest.raises(WrongType, match=rf"^{name}=.* not a number"):
        NoiseSchedule(**{name: value})


def test_a_schedule_no_memory_holds_is_refused_before_allocating(monkeypatch):
    with pytest.raises(
        OutOfRange, match=r"^num_timesteps=1099511627776 must be small enough for this machine's"
    ):
        NoiseSchedule(num_timesteps=2**40)  # torch's allocation error of 8 TiB before
    monkeypatch.setattr(diffusion.errors, "machine_memory", lambda: 100_000)
    with pytest.raises(OutOfRange, match=r"the schedule's tensors would take"):
        NoiseSchedule(num_timesteps=1000)
    monkeypatch.setattr(diffusion.errors, "machine_memory", lambda: None)  # a system that does not say
    NoiseSchedule(num_timesteps=1000)


def test_range_checks_name_one_option():
    with pytest.raises(OutOfRange, match=r"^num_timesteps=0 must be a whole number >= 2") as error:
        NoiseSchedule(num_timesteps=0)
    assert error.value.name == "num_timesteps"
    with pytest.raises(OutOfRange, match=r"^beta_start=0.0 must be in \(0, 1\)"):
        NoiseSchedule(beta_start=0)
    with pytest.raises(OutOfRange, match=r"^beta_end=1.5 must be in \(beta_start, 1\)") as error:
        NoiseSchedule(beta_end=1.5)
    assert error.value.name == "beta_end"


@pytest.mark.parametrize("schedule", ["cosine", "sigmoid"])
def test_beta_range_of_a_schedule_that_takes_none_is_said_not_used(schedule):
    with pytest.warns(UserWarning, match=rf"^beta_start=0.001 not used: beta_schedule='{schedule}' takes no"):
        NoiseSchedule(schedule, beta_start=0.001)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NoiseSchedule(schedule)  # the defaults: nothing given, nothing said
        NoiseSchedule("linear", beta_start=0.001)
