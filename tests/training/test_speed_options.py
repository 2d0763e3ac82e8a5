"""Speed options give the results of the plain path: `--model.compile true`, the fused Adam, TF32 on CUDA only,
and the speed benchmark's plumbing (benchmarks/speed.py --quick)."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_run
from helpers import TINY_MLP

from diffusion.cli.train import main
from diffusion.core.sampling import SamplingOptions
from diffusion.models import UNet
from diffusion.training.loading import load_checkpoint
from diffusion.training.module import DiffusionModule
from diffusion.training.optim import use_tf32_on_cuda

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def compile_calls(monkeypatch):
    """nn.Module.compile with the aot_eager backend: Dynamo and AOTAutograd trace the network as with the
    default backend, without inductor's C++ code generation (minutes on a small CPU). Records the callers."""
    calls = []
    original = torch.nn.Module.compile

    def compile_(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return original(self, *args, **{**kwargs, "backend": "aot_eager"})

    monkeypatch.setattr(torch.nn.Module, "compile", compile_)
    yield calls
    torch._dynamo.reset()


@pytest.mark.slow
def test_compile_trains_the_same_weights_under_the_same_checkpoint_keys(tmp_path, compile_calls):
    eager = tiny_run(tmp_path / "eager")
    assert compile_calls == []
    compiled = tiny_run(tmp_path / "compiled", "--model.compile", "true")
    assert compile_calls == ["UNet"]  # the network, once, by the module's setup
    assert compiled.model.hparams.compile and not eager.model.hparams.compile
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
    assert module.sample(2, seed=0, options=SamplingOptions(steps=2)).shape == (2, 1, 16, 16)


@pytest.mark.slow
def test_a_compiled_run_builds_one_training_graph_and_one_evaluation_graph(tmp_path, compile_calls):
    """No recompilation at a ragged last batch, at validation or at the sample grid: 30 training samples in
    batches of 12 (whole global batches: 2 steps an epoch, no batch of 6), 10 validation samples (one batch
    of 10) and a grid of 5, over 3 epochs with a validation every 2 steps. Dynamo compiles the network
    once for training and once for evaluation (no_grad, eval mode: validation and sampling share it)."""
    from torch._dynamo.utils import counters

    counters.clear()
    main([
        "--config", str(ROOT / "configs" / "toy2d.yaml"), *TINY_MLP, "--model.compile", "true",
        "--data.init_args.dataset", "gaussian", "--data.init_args.dim", "2", "--data.init_args.num_samples", "40",
        "--data.init_args.val_fraction", "0.25", "--data.init_args.batch_size", "12",
        "--max_steps", "6", "--trainer.val_check_interval", "2", "--model.warmup_steps", "1",
        "--sample_grid.num_samples", "5", "--sample_grid.sampling.steps", "3",
        "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", str(tmp_path),
    ])  # fmt: skip
    assert compile_calls == ["MLP"]
    assert counters["frames"]["ok"] == counters["frames"]["total"] == 2  # no graph break
    assert counters["stats"]["unique_graphs"] == 2


def test_compile_keeps_parameter_names(compile_calls):
    network = UNet(in_channels=1, channels=8, channel_mult=[1, 2], num_res_blocks=1, attention_levels=[1])
    names = list(network.state_dict())
    network.compile()
    assert list(network.state_dict()) == names and not any("_orig_mod" in name for name in names)


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
    module._trainer = SimpleNamespace(precision="32-true")
    module.setup("fit")  # on the CPU
    assert torch.get_float32_matmul_precision() == "highest"
    module._device = torch.device("cuda", 0)  # what Lightning sets before setup on a GPU run
    module.setup("fit")
    assert torch.get_float32_matmul_precision() == "high"


@pytest.mark.slow
def test_speed_benchmark_quick_mode_runs_end_to_end(tmp_path):
    result = subprocess.run(
        [sys.executable, "benchmarks/speed.py", "--quick", "--out", str(tmp_path), "--threads", "1"],
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
    assert "Data loader alone (ImageDataModule(digits): the recipe's training loader, 0 workers" in table
    assert "| ddim-3 | 32 | 64 |" in table and "| dpmpp_2m_sde-3 | 32 | 64 |" in table
    assert json.loads((tmp_path / "speed.json").read_text())["train_py"][0]["timed_steps"] == 3
    try:
        import diffusers  # noqa: F401
    except ImportError:
        return
    assert "| diffusers UNet2DModel, plain loop (UNet2DModel, 44,969 parameters) |" in table
    assert "project / diffusers <= 0.8" in table


@pytest.mark.slow
def test_speed_benchmark_times_the_compiled_network_beside_the_eager_one(
    tmp_path, compile_calls, monkeypatch
):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import speed

    def broken_peer(*args):
        raise ModuleNotFoundError("No module named 'diffusers.models.unets'")

    monkeypatch.setattr(speed, "diffusers_path", broken_peer)  # a peer that fails to import says why
    options = ["--quick", "--compiled", "--no_train_py", "--loader_batches", "0", "--samplers", ""]
    table = speed.main([*options, "--out", str(tmp_path)])
    assert compile_calls == ["UNet"]  # the compiled path's network alone: the others stay eager
    assert "| plain loop, network compiled (torch.compile, default mode) |" in table
    assert "Compiling: the compiled path's first round took" in table
    expected = "diffusers UNet2DModel, plain loop: not run, ModuleNotFoundError: No module named 'diffusers.models.unets'"
    assert f"| {expected} |" in table
