"""Training with learned variances (`--model.variance learned_range`, Nichol & Dhariwal 2021): the hybrid loss
L_simple + 0.001 L_vlb with the mean detached in L_vlb, the network's 2C outputs, checkpoints that say what they
hold, sampling with the learned variance by default; and older checkpoints sampling exactly as before."""

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import QUICK, TINY_UNET, tiny_run, warm

from diffusion.core.sampling import SamplingOptions
from diffusion.core.schedule import NoiseSchedule
from diffusion.core.variational_bound import ReverseProcess, vlb_term
from diffusion.models import MLP, UNet
from diffusion.training.loading import load_checkpoint
from diffusion.training.loss import VLB_WEIGHT, diffusion_loss
from diffusion.training.module import DiffusionModule

TESTS = Path(__file__).parents[1]
REPO, FIXTURES = TESTS.parent, TESTS / "fixtures"
TINY = {"channels": 8, "channel_mult": (1, 2), "num_res_blocks": 1, "attention_levels": (1,)}
X0 = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
NOISE = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(1))
T = torch.tensor([0, 1, 10, 300, 700, 999])


def learned_module(**options) -> DiffusionModule:
    torch.manual_seed(0)
    network = UNet(in_channels=1, out_channels=2, **TINY)
    for parameter in network.conv_out.parameters():  # zero-initialized: randomize so v and eps vary
        torch.nn.init.normal_(parameter, std=0.3)
    return DiffusionModule(network, sample_shape=(1, 8, 8), variance="learned_range", **options)


def test_hybrid_loss_is_the_simple_loss_plus_a_thousandth_of_T_times_the_bound_term():
    assert VLB_WEIGHT == 0.001  # lambda of Nichol & Dhariwal's L_hybrid
    module = learned_module()
    loss = module.per_sample_loss(X0, NOISE, T)
    x_t = module.schedule.q_sample(X0, T, NOISE)
    output = module.network(x_t, T)
    simple = (output[:, :1] - NOISE).pow(2).flatten(1).mean(1)
    process = ReverseProcess("eps", "learned_range", learned_variance=True, clip_denoised=False)
    vlb = 1000 * vlb_term(module.network, module.schedule, process, X0, T, NOISE)  # T L_t, bits/dim
    torch.testing.assert_close(loss, simple + VLB_WEIGHT * vlb.float(), rtol=1e-5, atol=1e-6)
    assert (VLB_WEIGHT * vlb > 1e-3 * simple).all()  # the L_vlb part is there to see


def test_the_bound_trains_only_the_variance_and_the_simple_loss_only_the_mean():
    schedule = NoiseSchedule()
    x_t = schedule.q_sample(X0, T, NOISE)
    output = torch.cat(
        [NOISE + 0.3 * torch.randn_like(NOISE), torch.rand_like(NOISE) * 2 - 1], 1
    ).requires_grad_()

    def gradient(network_output: torch.Tensor, variance: str) -> torch.Tensor:
        loss = diffusion_loss(schedule, network_output, X0, x_t, T, NOISE, variance=variance).sum()
        (grad,) = torch.autograd.grad(loss, output)
        return grad

    hybrid, simple = gradient(output, "learned_range"), gradient(output[:, :1], "fixed")
    torch.testing.assert_close(hybrid[:, :1], simple[:, :1], rtol=0, atol=0)  # stop-gradient on the mean
    assert hybrid[:, 1:].abs().min() > 0  # every v gets a gradient from L_vlb


def test_learned_variances_are_for_images_and_only_a_learned_model_samples_with_one():
    with pytest.raises(ValueError, match="variance='learned_range' is for images"):
        DiffusionModule(MLP(in_channels=2, out_channels=4), sample_shape=(2,), variance="learned_range")
    with pytest.raises(
        ValueError, match="sampling.variance learned_range needs a model that learns its variance"
    ):
        DiffusionModule(UNet(**TINY), sample_shape=(1, 8, 8), sampling={"variance": "learned_range"})


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory) -> Path:
    save_dir = tmp_path_factory.mktemp("runs")
    tiny_run(save_dir, "--model.variance", "learned_range")
    return save_dir / "digits" / "version_0" / "checkpoints" / "last.ckpt"


def test_a_learned_variance_run_says_so_and_samples_with_it(learned_run):
    checkpoint = torch.load(learned_run, weights_only=True, map_location="cpu")
    assert checkpoint["hyper_parameters"]["variance"] == "learned_range"
    assert checkpoint["hyper_parameters"]["network"]["init_args"]["out_channels"] == 2  # 2C for C = 1
    module = load_checkpoint(learned_run)
    assert module.network(torch.zeros(2, 1, 8, 8), torch.tensor([3, 4])).shape == (2, 2, 8, 8)
    # DDPM: the recipe's own sampler (DPM-Solver++) uses only the prediction, not the variance.
    default = module.sample(3, seed=1, options=SamplingOptions(sampler="ddpm", steps=5))
    learned = module.sample(
        3, seed=1, options=SamplingOptions(sampler="ddpm", steps=5, variance="learned_range")
    )
    fixed = module.sample(3, seed=1, options=SamplingOptions(sampler="ddpm", steps=5, variance="fixedlarge"))
    torch.testing.assert_close(default, learned, rtol=0, atol=0)
    assert not torch.allclose(default, fixed)
    assert default.shape == (3, 1, 8, 8) and default.isfinite().all()


@pytest.mark.parametrize("name", ["digits", "toy2d"])
def test_checkpoints_of_an_earlier_version_sample_exactly_as_before(name):
    """Samples of the run folders written at 06c7fb7, drawn by the code before learned variances existed
    (tests/fixtures/samples_before_learned_variances.npz): every sampler, fixed variances."""
    module = load_checkpoint(
        FIXTURES / "runs_made_at_06c7fb7" / name / "version_0" / "checkpoints" / "last.ckpt"
    )
    assert module.hparams.variance == "fixed"
    before = np.load(FIXTURES / "samples_before_learned_variances.npz")
    options = {
        "ddpm_all": SamplingOptions(sampler="ddpm"),
        "ddpm_10_small": SamplingOptions(sampler="ddpm", steps=10, variance="fixedsmall"),
        "ddpm_10_large": SamplingOptions(sampler="ddpm", steps=10),
        "ddim_5": SamplingOptions(sampler="ddim", steps=5, eta=0.5),
        "dpmpp_2m_sde_5": SamplingOptions(sampler="dpmpp_2m_sde", steps=5),
    }
    # DDPM's whole schedule is the same code for both networks: 1,000 UNet steps cost 20 s of CPU, the MLP's 3 s.
    if name == "digits":
        del options["ddpm_all"]
    for key, option in options.items():
        now = module.sample(3, seed=11, options=option).numpy()
        # A few float32 ulps of each value: another CPU's or thread count's summation order moves the toy2d
        # samples (hundreds in model units after DDPM's last steps) by ~5 ulps, 7.6e-5 at 235.
        np.testing.assert_allclose(now, before[f"{name}/{key}"], rtol=1e-6, atol=1e-5, err_msg=key)


def raw_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = torch.load(checkpoint, weights_only=True, map_location="cpu")["current_model_state"]
    return {k: v for k, v in state.items() if k.startswith("network.")}


CONDITIONAL = ["--model.variance", "learned_range", "--data.init_args.conditional", "true",
               "--model.label_dropout", "0.2", "--seed_everything", "0"]  # fmt: skip
EVERY_STEP = ["--checkpoint.every_n_train_steps", "1", "--checkpoint.save_top_k", "-1", "--max_steps", "6"]


def test_a_resumed_conditional_run_ends_with_the_weights_of_the_run_left_alone_and_samples_guided(tmp_path):
    tiny_run(tmp_path / "alone", *CONDITIONAL, *EVERY_STEP)
    folder = tmp_path / "alone" / "digits" / "version_0" / "checkpoints"
    # Resumed from a copy outside the run folder, so the resumed run writes a run folder of its own.
    shutil.copy(folder / "step=4.ckpt", tmp_path / "4.ckpt")
    tiny_run(tmp_path / "resumed", *CONDITIONAL, *EVERY_STEP, "--ckpt_path", str(tmp_path / "4.ckpt"))
    resumed = raw_weights(tmp_path / "resumed" / "digits" / "version_0" / "checkpoints" / "last.ckpt")
    alone, at_4 = raw_weights(folder / "last.ckpt"), raw_weights(folder / "step=4.ckpt")
    assert alone.keys() == resumed.keys()
    assert max((alone[k] - resumed[k]).abs().max() for k in alone) <= 1e-6
    assert max((alone[k] - at_4[k]).abs().max() for k in alone) > 1e-4  # the last two steps moved them
    module = load_checkpoint(folder / "last.ckpt")
    samples = module.sample(4, seed=0, labels=torch.tensor([0, 1, 2, 3]),
                            options=SamplingOptions(steps=4, guidance_scale=2.0))  # fmt: skip
    assert samples.shape == (4, 1, 8, 8) and samples.isfinite().all()


SAME = [*CONDITIONAL, "--model.noise_mode", "per_sample", "--data.init_args.val_fraction", "0",
        "--max_steps", "3", "--model.network.init_args.dropout", "0", "--accelerator", "cpu"]  # fmt: skip


def last_weights(save_dir: Path) -> dict[str, torch.Tensor]:
    return raw_weights(save_dir / "digits" / "version_0" / "checkpoints" / "last.ckpt")


@pytest.fixture(scope="module")
def whole_batch(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The raw weights after 3 steps of one process with the whole global batch of 16."""
    save_dir = tmp_path_factory.mktemp("whole")
    tiny_run(save_dir, *SAME, "--data.init_args.batch_size", "16")
    return last_weights(save_dir)


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and "network.conv_out.weight" in a
    assert max((a[k] - b[k]).abs().max() for k in a) <= 1e-5


def test_accumulation_gives_the_weights_of_the_whole_batch_with_learned_variances(whole_batch, tmp_path):
    tiny_run(tmp_path, *SAME, "--data.init_args.batch_size", "8", "--accumulate_grad_batches", "2")
    assert_same_weights(last_weights(tmp_path), whole_batch)


@pytest.mark.multiprocess
def test_ddp_gives_the_weights_of_the_whole_batch_with_labels_and_learned_variances(whole_batch, tmp_path):
    # SAME trains with labels and label dropout too (CONDITIONAL): test_conditional_training.py relies on this run.
    env = {k: v for k, v in os.environ.items() if k not in ("PL_GLOBAL_SEED", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    command = [sys.executable, str(REPO / "train.py"), *TINY_UNET, *QUICK, *SAME, "--devices", "2",
               "--strategy", "ddp", "--data.init_args.batch_size", "8",
               "--trainer.logger.init_args.save_dir", str(tmp_path)]  # fmt: skip
    result = warm.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, ranks=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_weights(last_weights(tmp_path), whole_batch)


def test_bf16_mixed_precision_trains_learned_variances_with_a_float32_loss(tmp_path):
    cli = tiny_run(
        tmp_path, "--model.variance", "learned_range", "--precision", "bf16-mixed", "--max_steps", "2",
        "--trainer.log_every_n_steps", "1",  # the loss is logged at logging steps only
    )  # fmt: skip
    loss = cli.trainer.callback_metrics["train/loss"]
    assert loss.dtype == torch.float32 and loss.isfinite()
