"""What sampling took and then answered wrongly without a word (tester round 5b): a sampler option the chosen sampler
does not have (dropped: now a warning, once, and the sample command's own note instead of it), a negative scale of a
normalization (images inverted), a model whose weights are NaN or on the meta device (NaN samples, torch's error), a
network's timesteps of another length than its batch. (Refusals of one argument each are rows of
tests/test_public_api_arguments.py's CASES.)"""

import copy
import re
import warnings

import numpy as np
import pytest
import torch
from helpers import tiny_vector_model

from diffusion.core.sampling import SamplingOptions, UnusedSamplingOption, final_sample, reverse_steps
from diffusion.data.vectors import feature_scaling
from diffusion.errors import InvalidValue, OutOfRange
from diffusion.generation.ranks import generate
from diffusion.generation.render import denormalize, to_uint8
from diffusion.models import MLP, UNet
from diffusion.training.module import DiffusionModule

ETA_OF_DDPM = r"^eta=0.5 is no option of the ddpm sampler: not used \(ddim, euler_ancestral take it\)$"


def unused_warnings(call) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if issubclass(w.category, UnusedSamplingOption)]


def test_an_option_the_sampler_does_not_have_is_said_once_where_the_user_gave_it():
    module = tiny_vector_model()
    said = unused_warnings(lambda: module.sampler(SamplingOptions(sampler="ddpm", eta=0.5)))
    assert len(said) == 1 and re.match(ETA_OF_DDPM, said[0]), said
    x_T = torch.zeros(2, 2)
    said = unused_warnings(
        lambda: final_sample(
            reverse_steps(module.network, module.schedule, x_T, sampler="ddim", steps=2, s_churn=3.0)
        )
    )
    assert said == ["s_churn=3.0 is no option of the ddim sampler: not used (heun takes it)"]
    # generate's deprecated options= builds its sampler through module.sampler: said there
    said = unused_warnings(
        lambda: generate(module, 2, options=SamplingOptions(sampler="dpmpp_2m", steps=2, s_churn=5.0))
    )
    assert said == ["s_churn=5.0 is no option of the dpmpp_2m sampler: not used (heun takes it)"]


def test_options_the_sampler_has_and_the_models_own_defaults_are_not_warned_of():
    module = tiny_vector_model()
    assert not unused_warnings(lambda: module.sampler(SamplingOptions(sampler="ddim", eta=0.5, steps=2)))
    assert not unused_warnings(lambda: module.sampler())
    # The model's own default sampling options are its checkpoint's (said when it is built), not the caller's.
    module.sampling = SamplingOptions(sampler="ddim", steps=2, eta=0.5)
    assert not unused_warnings(lambda: module.sampler(SamplingOptions(sampler="ddpm")))


def test_a_negative_scale_is_refused_and_no_data_module_gives_one():
    # -0.5 drew a white image black; the data modules' scales are spreads, 1 for a constant feature.
    with pytest.raises(OutOfRange, match=r"^normalization\['scale'\]\[0\]=-0.5 must be > 0 \(a negative one"):
        to_uint8(torch.ones(1, 1, 2, 2), {"shift": [0.5], "scale": [-0.5]})
    data = np.array([[1.0, 5.0, -3.0], [2.0, 5.0, -7.0], [0.5, 5.0, -1.0]])
    for normalize in ("minmax", "standardize"):
        _, scale = feature_scaling(data, normalize, 3.0)
        assert (scale > 0).all(), (normalize, scale)


def test_samples_of_bool_or_integers_are_refused_not_mapped():
    # A bool tensor came back bool; an int one truncated the scale 0.5 to 0.
    normalization = {"shift": [0.5], "scale": [0.5]}
    for dtype in (torch.bool, torch.int64):
        for convert in (denormalize, to_uint8):
            with pytest.raises(TypeError, match=r"^x is an? (bool|int64) tensor, not a floating-point"):
                convert(torch.ones(1, 1, 2, 2, dtype=dtype), normalization)


def test_a_model_whose_weights_are_nan_or_on_the_meta_device_is_refused_before_sampling():
    module = tiny_vector_model()
    with torch.no_grad():
        module.network.out.bias[0] = float("nan")
    for draw in (lambda: generate(module, 2), lambda: module.sample(2)):
        with pytest.raises(
            InvalidValue, match=r"^module's weights hold NaN or infinity \(first network.out.bias\)"
        ):
            draw()
    on_meta = copy.deepcopy(tiny_vector_model()).to("meta")
    with pytest.raises(
        InvalidValue, match=r"^module is on the meta device \(network\.[^)]+\), whose tensors"
    ):
        generate(on_meta, 2)


def test_a_networks_timesteps_are_one_per_sample():
    # Three timesteps for two images ended in torch's size mismatch deep in a residual block.
    unet = UNet(channels=8, channel_mult=[1], num_res_blocks=1, attention_levels=[])
    with pytest.raises(
        OutOfRange, match=r"^t=<shape \(3,\)> must be of shape \(2,\), one per sample of x — "
    ):
        unet(torch.zeros(2, 1, 4, 4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"^t=3 is an int, not a tensor of timesteps"):
        unet(torch.zeros(2, 1, 4, 4), 3)
    assert unet(torch.zeros(2, 1, 4, 4), torch.zeros(2, dtype=torch.long)).shape == (2, 1, 4, 4)


def test_a_zero_terminal_snr_model_samples_its_last_timesteps_inf_is_no_broken_schedule():
    # 1 / sqrt(alpha_bar_T) is +inf by right at alpha_bar_T = 0: the check of a .half().float() schedule refused it.
    torch.manual_seed(0)
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8)
    module = DiffusionModule(
        network, sample_shape=(2,), num_timesteps=20, beta_schedule="cosine", zero_terminal_snr=True,
        prediction_type="v", normalization={"shift": [0.0, 0.0], "scale": [1.0, 1.0]},
        sampling=SamplingOptions(sampler="ddim", steps=2),
    )  # fmt: skip
    assert torch.isfinite(generate(module, 2)).all() and torch.isfinite(module.sample(2)).all()


def test_a_sampler_of_more_steps_than_the_schedule_is_refused_as_it_is_built():
    """Round 17b (noted): `module.sampler(SamplingOptions(steps=2000))` of a T=50 model built a sampler that only
    generate() refused; a sampler of every step still builds."""
    module = tiny_vector_model()
    steps = module.schedule.num_timesteps
    with pytest.raises(
        OutOfRange, match=rf"^steps={steps + 1} must be between 1 and the schedule's num_timesteps"
    ):
        module.sampler(SamplingOptions(sampler="ddim", steps=steps + 1))
    assert module.sampler(SamplingOptions(sampler="ddim", steps=steps)).steps == steps
