"""Sampling under autocast (`python -m diffusion.sample --precision bf16-mixed`): the network runs in reduced
precision, the sampler's arithmetic stays float32, and the samples stay close to 32-bit ones.

On a CPU, bf16 autocast is what runs (16-mixed too, as Lightning does for training); CUDA's fp16 is the same
code path with another dtype (`autocast_dtype`).
"""

import re

import numpy as np
import pytest
import torch

from diffusion.cli.sample import main
from diffusion.core.sampling import SamplingOptions
from diffusion.generation.precision import autocast_dtype, network_precision
from diffusion.training.loading import load_checkpoint

ARGS = ["--num_samples", "5", "--batch_size", "5", "--seed", "7", "--sampler", "ddim", "--steps", "3",
        "--device", "cpu"]  # fmt: skip
DDIM_3 = SamplingOptions(sampler="ddim", steps=3)
# bf16 keeps 8 significant bits: one rounding is off by up to 2^-9 (0.2%) relative. The tiny UNet's output
# under autocast was measured 0.45% (relative L2) from its float32 output, a few roundings deep.
NETWORK_RTOL = 0.02
# In samples (model units, [-1, 1]) that 0.45% is amplified where x_0 is predicted from eps early in the
# reverse process (by sqrt(1 - abar) / sqrt(abar), ~150 at t = 999) before x_0 is clipped to [-1, 1]: measured
# max |bf16 - float32| 0.059 (DDIM-3, 16 samples), mean 8e-5; two seeds' samples differ by ~0.5 on average.
SAMPLE_ATOL, SAMPLE_MEAN_ATOL = 0.15, 0.005


@pytest.fixture(scope="module")
def module(digits_checkpoint):
    return load_checkpoint(digits_checkpoint)


def test_autocast_dtype_follows_lightnings_names():
    assert autocast_dtype("32", "cpu") is None and autocast_dtype("32-true", "cuda") is None
    assert autocast_dtype("bf16-mixed", "cpu") == autocast_dtype("bf16-mixed", "cuda") == torch.bfloat16
    assert autocast_dtype("16-mixed", "cuda") == torch.float16
    assert autocast_dtype("16-mixed", "cpu") == torch.bfloat16  # Lightning's substitute: fp16 AMP needs CUDA
    with pytest.raises(ValueError, match=r"precision='16-true' is not supported — choose one of \['32'"):
        autocast_dtype("16-true", "cpu")


def test_the_network_runs_in_bf16_while_the_sampler_stays_float32(module):
    network = module.network
    x = torch.randn(8, *module.sample_shape, generator=torch.Generator().manual_seed(0))
    t = torch.full((8,), 500)
    seen: dict[str, set] = {
        "conv": set(),
        "network_input": set(),
        "posterior": set(),
        "posterior_autocast": set(),
    }
    first_conv = next(m for m in network.modules() if isinstance(m, torch.nn.Conv2d))
    hooks = [
        first_conv.register_forward_hook(lambda m, args, out: seen["conv"].add(out.dtype)),
        network.register_forward_pre_hook(lambda m, args: seen["network_input"].add(args[0].dtype)),
    ]
    q_posterior = module.schedule.q_posterior

    def recording_q_posterior(*args, **kwargs):  # the sampler's step 3, between two network calls
        seen["posterior_autocast"].add(torch.is_autocast_enabled("cpu"))
        mean, variance, beta = q_posterior(*args, **kwargs)
        seen["posterior"].update({mean.dtype, variance.dtype, beta.dtype})
        return mean, variance, beta

    module.schedule.q_posterior = recording_q_posterior  # instance attribute: this test only
    try:
        with torch.no_grad():
            reference_output = network(x, t)
        seen["conv"].clear()
        with network_precision(module, "bf16-mixed"), torch.no_grad():
            output = module.network(x, t)
            samples = module.sample(4, seed=7, options=DDIM_3)
    finally:
        del module.schedule.q_posterior
        for hook in hooks:
            hook.remove()
    assert seen["conv"] == {torch.bfloat16}  # the network computed in reduced precision
    assert seen["network_input"] == {torch.float32}  # x_t as the sampler hands it over
    assert seen["posterior_autocast"] == {False} and seen["posterior"] == {torch.float32}
    assert output.dtype == samples.dtype == torch.float32
    assert not torch.equal(output, reference_output)  # rounded in bf16...
    relative = (output - reference_output).norm() / reference_output.norm()
    assert relative < NETWORK_RTOL  # ...and close to float32
    assert module.network is network  # put back after the block


def test_bf16_samples_are_float32_and_close_to_32_bit_ones(module):
    reference = module.sample(16, seed=7, options=DDIM_3)
    with network_precision(module, "bf16-mixed"):
        bf16 = module.sample(16, seed=7, options=DDIM_3)
    assert bf16.dtype == torch.float32
    assert not torch.equal(bf16, reference)
    difference = (bf16 - reference).abs()
    assert difference.max() <= SAMPLE_ATOL and difference.mean() <= SAMPLE_MEAN_ATOL
    other_seed = module.sample(16, seed=8, options=DDIM_3)
    assert (other_seed - reference).abs().mean() > 20 * SAMPLE_MEAN_ATOL  # the tolerance tells samples apart
    torch.testing.assert_close(module.sample(16, seed=7, options=DDIM_3), reference, rtol=0, atol=0)


def test_the_network_is_put_back_when_sampling_fails(module):
    network = module.network
    with pytest.raises(RuntimeError, match="stop"), network_precision(module, "bf16-mixed"):
        assert module.network is not network
        raise RuntimeError("stop")
    assert module.network is network


@pytest.fixture(scope="module")
def sample_cli(digits_checkpoint, tmp_path_factory):
    """Run the CLI with ARGS and a --precision; memoized: (samples.npz's arr_0, stderr)."""
    runs: dict[str, tuple[np.ndarray, str]] = {}

    def run(precision: str, capsys) -> tuple[np.ndarray, str]:
        if precision not in runs:
            capsys.readouterr()
            out = tmp_path_factory.mktemp("samples")
            path = main(
                ["--ckpt", str(digits_checkpoint), "--out", str(out), *ARGS, "--precision", precision]
            )
            runs[precision] = np.load(path)["arr_0"], capsys.readouterr().err
        return runs[precision]

    return run


def test_the_sample_cli_samples_in_bf16_with_a_note_on_a_cpu(sample_cli, capsys):
    reference, quiet = sample_cli("32", capsys)
    samples, note = sample_cli("bf16-mixed", capsys)
    assert samples.dtype == np.uint8 and samples.shape == reference.shape
    assert "--precision" not in quiet
    assert "note: --precision bf16-mixed on a CPU runs the network in bf16" in note
    levels = np.abs(samples.astype(int) - reference.astype(int))
    assert 0 < levels.max() <= SAMPLE_ATOL * 127.5  # bf16 reached the network; model units [-1, 1] -> 0..255


@pytest.mark.parametrize(("precision", "same_as"), [("32-true", "32"), ("16-mixed", "bf16-mixed")])
def test_lightnings_aliases_sample_the_same(precision, same_as, sample_cli, capsys):
    samples, err = sample_cli(precision, capsys)
    np.testing.assert_array_equal(samples, sample_cli(same_as, capsys)[0])
    if precision == "16-mixed":  # on a CPU it runs as bf16, as in training
        assert "16-mixed runs as bf16-mixed" in err


@pytest.mark.parametrize("precision", ["16-true", "bf16-true", "64", "16", "fp16"])
def test_other_precisions_are_refused_in_one_line(precision, digits_checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "--ckpt",
                str(digits_checkpoint),
                "--out",
                str(tmp_path / "out"),
                *ARGS,
                "--precision",
                precision,
            ]
        )
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert re.match(
        rf"error: --precision {precision} is not supported for sampling — choose 32, 16-mixed or bf16-mixed",
        lines[0],
    )
    assert not (tmp_path / "out").exists()
