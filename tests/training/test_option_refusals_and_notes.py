"""DiffusionModule's and EMA's options: a truthy text or a bool refused where a bool or a number goes, the
schedule's checks said of the module's option (so train.py names the flag), and options that nothing uses without
the option that enables them said in a warning rather than dropped."""

import warnings

import pytest

import diffusion.errors
from diffusion.cli.flag_names import flag_text
from diffusion.core.sampling import SamplingOptions
from diffusion.errors import OutOfRange, UserError, WrongType
from diffusion.models import MLP
from diffusion.training.callbacks.ema import EMA
from diffusion.training.module import DiffusionModule


def module(**options) -> DiffusionModule:
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8)
    return DiffusionModule(network, sample_shape=(2,), **options)


@pytest.mark.parametrize(
    ("options", "name"),
    [({"lr": True}, "lr"), ({"lr": "2e-4"}, "lr"), ({"weight_decay": False}, "weight_decay"),
     ({"min_snr_gamma": True}, "min_snr_gamma"), ({"label_dropout": True}, "label_dropout"),
     ({"offset_noise": True}, "offset_noise"), ({"adam_betas": (True, 0.999)}, "adam_betas"),
     ({"adam_betas": 0.9}, "adam_betas"),
     ({"warmup_steps": True}, "warmup_steps"), ({"compile_channels_last": "no"}, "compile_channels_last"),
     ({"zero_terminal_snr": "no"}, "zero_terminal_snr"), ({"beta_end": True}, "beta_end")],
)  # fmt: skip
def test_a_bool_or_text_is_refused_where_a_number_or_a_bool_goes(options, name):
    # lr=True trained at an lr of 1.0; zero_terminal_snr="no" rescaled the schedule.
    with pytest.raises(WrongType, match=rf"^{name}=") as error:
        module(**options)
    assert error.value.owner is DiffusionModule


@pytest.mark.parametrize(
    ("options", "flag", "line"),
    [({"num_timesteps": 0}, "--model.num_timesteps", "must be a whole number >= 2"),
     ({"beta_end": 1.5}, "--model.beta_end", r"must be in \(beta_start, 1\)"),
     ({"beta_start": 0.05, "beta_end": 0.001}, "--model.beta_end", "must be in")],
)  # fmt: skip
def test_the_schedules_range_checks_are_of_the_modules_option(options, flag, line):
    # Said `num_timesteps=0 is too few` with no owner before: train.py could name neither flag nor file.
    with pytest.raises(OutOfRange, match=line) as error:
        module(**options)
    assert error.value.owner is DiffusionModule and flag_text(error.value.owner, error.value.name) == flag


def test_trained_betas_without_their_schedule_are_said_as_the_modules_flags():
    with pytest.raises(UserError) as error:
        module(trained_betas=[0.1, 0.2])
    assert error.value.said(flag_text).startswith(
        "--model.trained_betas: --model.beta_schedule linear takes none — pass --model.beta_schedule trained"
    )
    assert isinstance(error.value, ValueError)  # an InvalidValue, as the schedule's other checks


def test_a_schedule_no_memory_holds_is_refused_before_the_process_is_killed(monkeypatch):
    # num_timesteps=10**9 was killed by the kernel's OOM killer (exit 137); here 1 GB on a machine of 1 MiB
    monkeypatch.setattr(diffusion.errors, "machine_memory", lambda: 2**20)
    with pytest.raises(OutOfRange, match=r"^num_timesteps=10000000 must be small enough") as error:
        module(num_timesteps=10**7)
    assert flag_text(error.value.owner, error.value.name) == "--model.num_timesteps"


@pytest.mark.parametrize(
    ("options", "note"),
    [({"min_snr_gamma": 3.0}, r"^min_snr_gamma=3.0 is not used: loss_weighting=none — pass "
                             "loss_weighting=min_snr"),
     ({"compile_mode": "max-autotune"}, r"^compile_mode=max-autotune is not used: .* pass compile_training=True"),
     ({"compile_channels_last": True}, r"^compile_channels_last=True is not used: .* pass compile_training=True"),
     ({"sampling": SamplingOptions(sampler="dpmpp_2m_sde", eta=0.5)},
      r"^sampling.eta=0.5 is no option of the dpmpp_2m_sde sampler: not used .*\(ddim, euler_ancestral take it"),
     ({"sampling": {"eta": 0.5}}, r"^sampling.eta=0.5 is no option of the ddpm sampler"),
     ({"beta_schedule": "cosine", "beta_start": 1e-3}, r"^beta_start=0.001 not used: beta_schedule='cosine'")],
)  # fmt: skip
def test_an_option_nothing_uses_is_said_not_used(options, note):
    with pytest.warns(UserWarning, match=note):
        module(**options)


@pytest.mark.parametrize(
    "options",
    [{}, {"loss_weighting": "min_snr", "min_snr_gamma": 3.0}, {"compile_training": True, "compile_mode": "default"},
     {"compile_training": "cuda", "compile_channels_last": True},
     {"compile_training": "cuda", "compile_mode": "default"}, {"min_snr_gamma": 5},
     {"sampling": SamplingOptions(sampler="ddim", eta=0.5)}, {"beta_schedule": "cosine"}],
)  # fmt: skip
def test_options_in_use_or_at_their_defaults_are_not_said(options):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        module(**options)


@pytest.mark.parametrize(
    ("options", "note"),
    [({"sigma_rels": [0.1, 0.2]}, r"^sigma_rels=\(0.1, 0.2\) not used: options of the post-hoc EMA"),
     ({"snapshot_every": 5}, r"^snapshot_every=5 not used"), ({"max_snapshot_gb": 5}, r"^max_snapshot_gb=5 not used"),
     ({"snapshot_every": 5, "max_snapshot_gb": 5.0}, r"^snapshot_every=5, max_snapshot_gb=5.0 not used")],
)  # fmt: skip
def test_post_hoc_options_without_post_hoc_are_said_not_used(options, note):
    with pytest.warns(UserWarning, match=note):
        EMA(**options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        EMA()
        EMA(sigma_rels=[0.05, 0.10])  # the defaults, written out
        EMA(post_hoc=True, **options)


@pytest.mark.parametrize(
    ("options", "name"),
    [({"warmup": "no"}, "warmup"), ({"post_hoc": "yes"}, "post_hoc"), ({"decay": True}, "decay")],
)  # fmt: skip
def test_ema_takes_bools_and_numbers_only(options, name):
    with pytest.raises(WrongType, match=rf"^{name}="):
        EMA(**options)


@pytest.mark.parametrize(
    ("options", "line"),
    [({"compile_training": "yes"}, "compile_training='yes' is not supported"),
     ({"compile_training": 1}, "compile_training=1 is not supported"),
     ({"compile_training": "CUDA"}, "compile_training='CUDA' is not supported"),
     ({"compile": "yes"}, "compile='yes' is not supported (compile is the old name of compile_training)")],
)  # fmt: skip
def test_compile_training_of_another_value_is_said_with_its_three_values(options, line):
    # "choose one of ['cuda']" hid True and False (tester 18b, M5); the old name, compile=, is said as written
    with pytest.raises(ValueError) as error:
        module(**options)
    assert str(error.value) == f"{line} — pass True, False or 'cuda' (compile on a CUDA device only)"


@pytest.mark.parametrize("value", [True, False, "cuda"])
def test_compile_training_and_its_old_name_take_true_false_and_cuda(value):
    assert module(compile_training=value).hparams["compile_training"] == value
    # given both, the old name wins, as a config written before the rename is read
    assert module(compile=value, compile_training=not value).hparams["compile_training"] == value
