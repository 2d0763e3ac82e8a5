"""Speed options give the results of the plain path: `--model.compile_training true`, the fused Adam (in every precision,
with clipping), TF32 on CUDA only, and the speed benchmark's plumbing (benchmarks/speed/speed.py --quick)."""

import copy
import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import TINY_MLP, counting_backend, tiny_run, warm
from lightning.pytorch.plugins import MixedPrecision
from torch.utils.data import DataLoader

from diffusion.cli.train import main
from diffusion.core.compiling import compiling_with, inductor_options, mode_for
from diffusion.core.sampling import SamplingOptions
from diffusion.data.batch import Batch
from diffusion.models import MLP, UNet
from diffusion.training.loading import load_checkpoint
from diffusion.training.module import DiffusionModule
from diffusion.training.optim import adam, use_tf32_on_cuda

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def compile_calls():
    """The project's compiles (`diffusion.core.compiling`) with a backend that records the Inductor options of
    each graph Dynamo hands it, then runs it with aot_eager: Dynamo and AOTAutograd trace the network as with
    Inductor, without its C++ code generation (minutes on a small CPU)."""
    graphs, options = [], []
    torch._dynamo.reset()
    with compiling_with(counting_backend(graphs, options)):
        yield options
    torch._dynamo.reset()


@pytest.mark.slow
def test_compile_trains_the_same_weights_under_the_same_checkpoint_keys(tmp_path, compile_calls):
    eager = tiny_run(tmp_path / "eager")
    assert compile_calls == []
    compiled = tiny_run(tmp_path / "compiled", "--model.compile_training", "true")
    assert len(compile_calls) == 1  # the training graph, once, by the module's setup
    assert compiled.model.hparams.compile_training and not eager.model.hparams.compile_training
    # Same seeds, data and noise: the 4 steps, the validation and the sample grid agree to float rounding.
    checkpoints = [
        torch.load(run / "digits/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)
        for run in (tmp_path / "eager", tmp_path / "compiled")
    ]
    for key in ("state_dict", "current_model_state"):
        expected, actual = checkpoints[0][key], checkpoints[1][key]
        assert list(actual) == list(expected)  # no "_orig_mod." anywhere
        for name in expected:
            torch.testing.assert_close(actual[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)
    assert checkpoints[1]["global_step"] == checkpoints[0]["global_step"] == 4
    # The checkpoint loads as any other (sampling does not compile).
    module = load_checkpoint(tmp_path / "compiled/digits/version_0/checkpoints/last.ckpt")
    assert module.sample(2, seed=0, options=SamplingOptions(steps=2)).shape == (2, 1, 8, 8)


@pytest.mark.slow
def test_a_compiled_run_builds_one_graph_for_training_and_evaluates_eagerly(tmp_path, compile_calls):
    """No recompilation at a ragged last batch, at validation or at the sample grid: 30 training samples in
    batches of 12 (whole global batches: 2 steps an epoch, no batch of 6), 10 validation samples (one batch
    of 10) and a grid of 5, over 3 epochs with a validation every 2 steps. Dynamo compiles the network once,
    for training steps; validation, the sanity check and the grid run it eagerly, so they never recompile or
    (under CUDA graphs) re-record the training graph."""
    from torch._dynamo.utils import counters

    counters.clear()
    main([
        "--config", str(ROOT / "configs" / "toy2d.yaml"), *TINY_MLP, "--model.compile_training", "true",
        "--data.init_args.dataset", "gaussian", "--data.init_args.dim", "2", "--data.init_args.num_samples", "40",
        "--data.init_args.val_fraction", "0.25", "--data.init_args.batch_size", "12",
        "--max_steps", "6", "--trainer.val_check_interval", "2", "--model.warmup_steps", "1",
        "--sample_grid.num_samples", "5", "--sample_grid.sampling.steps", "3",
        "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", str(tmp_path),
    ])  # fmt: skip
    assert len(compile_calls) == 1
    assert counters["frames"]["ok"] == counters["frames"]["total"] == 1  # no graph break, no recompile
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], None),  # a CPU: torch.compile's default mode, no CUDA graphs, Inductor's own layout choice
        (["--model.compile_mode", "reduce-overhead"], {"triton.cudagraphs": True}),
        (["--model.compile_channels_last", "true"], {"force_layout_optimization": True}),
        (
            ["--model.compile_mode", "max-autotune", "--model.compile_channels_last", "true"],
            {**torch._inductor.list_mode_options("max-autotune"), "force_layout_optimization": True},
        ),
    ],
)
def test_the_compile_options_reach_the_compile_call(tmp_path, compile_calls, flags, expected):
    main(["--config", str(ROOT / "configs" / "toy2d.yaml"), *TINY_MLP, "--model.compile_training", "true", *flags,
          "--max_steps", "1", "--trainer.limit_val_batches", "0",
          "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"])  # fmt: skip
    assert compile_calls == [expected]


def test_the_training_graph_takes_cuda_graphs_on_cuda_only():
    assert mode_for(torch.device("cuda", 0)) == "reduce-overhead"
    assert inductor_options(mode_for(torch.device("cuda", 0))) == {"triton.cudagraphs": True}
    assert mode_for(torch.device("cpu")) == "default" and inductor_options("default") == {}
    assert mode_for(torch.device("cuda", 0), "default") == "default"  # what the user chose


def test_compile_keeps_parameter_names(compile_calls):
    network = UNet(in_channels=1, channels=8, channel_mult=[1, 2], num_res_blocks=1, attention_levels=[1])
    module = DiffusionModule(network, sample_shape=(1, 16, 16), compile_training=True)
    names = list(module.state_dict())
    module.trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    module.setup("fit")
    assert module._training_graph is not None
    assert list(module.state_dict()) == names and not any("_orig_mod" in name for name in names)


@pytest.mark.parametrize("written", [True, "cuda", False])
def test_the_old_name_compile_still_loads_as_compile_training(written):
    # Configs and checkpoints written before 2026-11-27 say `compile` (a sampler's `compile` is another option).
    network = UNet(in_channels=1, channels=8, channel_mult=[1, 2], num_res_blocks=1, attention_levels=[1])
    module = DiffusionModule(network, sample_shape=(1, 16, 16), compile=written)
    assert module.hparams.compile_training == written and "compile" not in module.hparams
    again = DiffusionModule(network, **{k: v for k, v in module.hparams.items() if k != "sampling"})
    assert again.hparams.compile_training == written


def test_fused_adam_takes_the_steps_of_the_per_tensor_loop():
    torch.manual_seed(0)
    network = UNet(in_channels=1, channels=8, channel_mult=[1, 2], num_res_blocks=1, attention_levels=[1])
    module = DiffusionModule(network, sample_shape=(1, 8, 8), lr=1e-2, warmup_steps=1, weight_decay=0.01)
    fused = module.configure_optimizers()["optimizer"]
    assert fused.defaults["fused"] is True  # on a CPU module
    initial = [p.detach().clone() for p in module.parameters()]
    reference = [p.clone().requires_grad_() for p in initial]
    loop = torch.optim.Adam(reference, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01, foreach=False)
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        for p, q in zip(module.parameters(), reference, strict=True):
            p.grad = torch.randn(p.shape, generator=generator)
            q.grad = p.grad.clone()
        fused.step()
        loop.step()
    for p, q in zip(module.parameters(), reference, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), atol=1e-6, rtol=1e-5)
    assert (
        max((p.detach() - p0).abs().max() for p, p0 in zip(module.parameters(), initial, strict=True)) > 0.01
    )


@pytest.mark.parametrize("precision", [None, "32-true", "16-mixed", "bf16-mixed"])
def test_every_path_gets_the_fused_adam_whatever_the_precision(precision):
    """The speed benchmark's plain loop calls configure_optimizers without a Trainer (precision None); the
    project path with one: both get the same fused Adam."""
    module = DiffusionModule(MLP(in_channels=4, hidden_dim=16, num_blocks=1), sample_shape=(4,))
    if precision is not None:
        module._trainer = SimpleNamespace(precision=precision, estimated_stepping_batches=10)
    optimizer = module.configure_optimizers()["optimizer"]
    assert optimizer.defaults["fused"] is True and optimizer._step_supports_amp_scaling


STEPS, CLIP = 4, 1e-3


def tiny_unet_module() -> DiffusionModule:
    torch.manual_seed(0)
    network = UNet(in_channels=1, channels=8, channel_mult=[1, 2], num_res_blocks=1, attention_levels=[1])
    # Per-sample noise (a function of seed, step and index) so that both loops draw the same; weight decay so
    # that clipping changes the steps (Adam alone would not see a gradient scaled the same at every step).
    return DiffusionModule(
        network, sample_shape=(1, 8, 8), lr=1e-3, warmup_steps=1, weight_decay=0.1, noise_mode="per_sample",
        noise_seed=0,
    )  # fmt: skip


def trainer_precision(precision: str) -> dict:
    if precision == "16-mixed":  # Lightning's flag would run bf16-mixed on a CPU: fp16 with a GradScaler
        return {"plugins": [MixedPrecision("16-mixed", "cpu")]}
    return {"precision": precision}


def plain_loop(module: DiffusionModule, batches: list[Batch], precision: str, clip: float | None) -> None:
    """backward, unscale, clip, step by hand (Lightning's order, benchmarks/speed/speed_paths.py's plain loop), with the
    same fused Adam: a near-zero gradient (the zero-initialised layers' first steps) makes Adam's update
    lr * g / (|g| + eps) depend on its last bits, which the fused and per-tensor kernels round differently
    (the test above compares the two on ordinary gradients)."""
    params = list(module.parameters())
    optimizer = adam(params, torch.device("cpu"), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.1)
    half = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cpu") if precision == "16-mixed" else None
    for step, (x0, indices, _) in enumerate(batches):
        with torch.autocast(
            "cpu", dtype=half or torch.float32, enabled=half is not None, cache_enabled=False
        ):
            noise, t = module.draw_noise_and_timesteps(x0, indices, step, per_sample=True)
            loss = module.per_sample_loss(x0, noise, t).mean()
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "16-mixed"])
def test_the_fused_adam_with_clipping_takes_the_steps_of_the_plain_loop(precision):
    """The Trainer's steps (fused Adam; the module clips before it, unscaling first under a GradScaler, where
    Lightning's plugin refuses to clip) against unscale_, clip_grad_norm_ and the step by hand, with the
    gradients clipped at every step; without the clipping the plain loop lands elsewhere."""
    generator = torch.Generator().manual_seed(1)
    data = [Batch(x, i) for i, x in enumerate(torch.randn(4 * STEPS, 1, 8, 8, generator=generator))]
    batches = list(DataLoader(data, batch_size=4))
    module = tiny_unet_module()
    plain, unclipped = copy.deepcopy(module), copy.deepcopy(module)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=STEPS, gradient_clip_val=CLIP, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        **trainer_precision(precision),
    )  # fmt: skip
    trainer.fit(module, DataLoader(data, batch_size=4))
    assert trainer.global_step == STEPS and trainer.optimizers[0].defaults["fused"] is True
    plain_loop(plain, batches, precision, CLIP)
    plain_loop(unclipped, batches, precision, None)

    def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
        return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))

    assert max_difference(module, plain) < 1e-5
    assert max_difference(plain, unclipped) > 1e-4


def test_a_checkpoint_of_the_foreach_adam_resumes_with_the_fused_step():
    """An optimizer state saved by a foreach Adam: its flags would replace the fused ones on load, and a foreach
    step refuses the found-inf flag a GradScaler hands a fused optimizer."""
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(8, 4)
    old = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=True)
    model(x).square().mean().backward()
    old.step()
    resumed, continued = copy.deepcopy(model), copy.deepcopy(model)
    fused = adam(resumed.parameters(), torch.device("cpu"), lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0)
    fused.load_state_dict(
        copy.deepcopy(old.state_dict())
    )  # a copy: a fused step moves the step counts in place
    assert fused.param_groups[0]["fused"] is True and fused.param_groups[0]["foreach"] is None
    reference = torch.optim.Adam(continued.parameters(), lr=1e-2, foreach=True)
    reference.load_state_dict(copy.deepcopy(old.state_dict()))
    for network, optimizer in ((resumed, fused), (continued, reference)):
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(network(x).square().mean()).backward()
        scaler.step(optimizer)
        scaler.update()
    for p, q in zip(resumed.parameters(), continued.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


@pytest.fixture
def float32_matmul_precision():
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(saved)


def test_tf32_is_switched_on_for_cuda_only_and_an_explicit_choice_is_kept(float32_matmul_precision):
    use_tf32_on_cuda(torch.device("cpu"))
    assert torch.get_float32_matmul_precision() == "highest"
    use_tf32_on_cuda(torch.device("cuda"))  # sets a flag only: runs without a GPU
    assert torch.get_float32_matmul_precision() == "high"
    torch.set_float32_matmul_precision("medium")
    use_tf32_on_cuda(torch.device("cuda"))
    assert torch.get_float32_matmul_precision() == "medium"


def test_the_module_sets_tf32_when_fitting_on_cuda(float32_matmul_precision):
    network = UNet(in_channels=1, channels=8, channel_mult=[1, 2], num_res_blocks=1, attention_levels=[1])
    module = DiffusionModule(network, sample_shape=(1, 8, 8))
    module._trainer = SimpleNamespace(precision="32-true", strategy=SimpleNamespace(checkpoint_io=None))
    module.setup("fit")  # on the CPU
    assert torch.get_float32_matmul_precision() == "highest"
    module._device = torch.device("cuda", 0)  # what Lightning sets before setup on a GPU run
    module.setup("fit")
    assert torch.get_float32_matmul_precision() == "high"


@pytest.mark.slow
def test_speed_benchmark_quick_mode_runs_end_to_end(tmp_path):
    result = warm.run(
        [sys.executable, "benchmarks/speed/speed.py", "--quick", "--out", str(tmp_path), "--threads", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = (tmp_path / "speed.md").read_text()
    assert "QUICK MODE" in table and "44,969 parameters" in table
    for row in ("| project: Lightning Trainer + EMA callback |", "| plain loop, same module |"):
        assert row in table
    assert "framework tax: project / plain loop <= 1.03" in table and "images / s" in table
    # train.py in a process of its own, timed by its StepTimer; the loader alone; both samplers.
    assert "| `train.py` as users run it (StepTimer; 32-true, global batch 64) |" in table
    assert "Data path alone (ImageDataModule(digits): the training data held on cpu" in table
    assert "| ddim-3 | 32 | 64 |" in table and "| dpmpp_2m_sde-3 | 32 | 64 |" in table
    # ... and each compiled (--sampling_compile, always on in --quick: the eager backend on the CPU).
    assert "| ddim-3 compiled | 32 | 64 |" in table and "| dpmpp_2m_sde-3 compiled | 32 | 64 |" in table
    assert "the first batch, which compiles: ddim-3" in table
    assert json.loads((tmp_path / "speed.json").read_text())["train_py"][0]["timed_steps"] == 2
    try:
        import diffusers  # noqa: F401
    except ImportError:
        return
    assert "| diffusers UNet2DModel, plain loop (UNet2DModel, 44,969 parameters, eager) |" in table
    assert "project / diffusers <= 0.8" in table


@pytest.mark.slow
def test_speed_benchmark_times_the_compiled_network_beside_the_eager_one(tmp_path, monkeypatch):
    from torch._dynamo.utils import counters

    from benchmarks.speed import speed

    torch._dynamo.reset()
    counters.clear()

    def broken_peer(*args):
        raise ModuleNotFoundError("No module named 'diffusers.models.unets'")

    monkeypatch.setattr(speed, "diffusers_path", broken_peer)  # a peer that fails to import says why
    options = ["--quick", "--compiled", "--no_train_py", "--loader_batches", "0", "--samplers", ""]
    levels = {name: logging.getLogger(name).level for name in ("lightning.pytorch", "lightning.fabric")}
    table = speed.main([*options, "--out", str(tmp_path)])
    # Its Trainers' banners were quieted for the run only: a later test in this process reads Lightning's lines.
    assert {name: logging.getLogger(name).level for name in levels} == levels
    assert (
        counters["stats"]["unique_graphs"] == 1
    )  # the compiled path's training graph alone: the rest is eager
    torch._dynamo.reset()
    assert "| plain loop, network compiled (torch.compile, eager backend, as fitting compiles it) |" in table
    assert "Compiling: the compiled path's first round took" in table
    expected = "diffusers UNet2DModel, plain loop: not run, ModuleNotFoundError: No module named 'diffusers.models.unets'"
    assert f"| {expected} |" in table
