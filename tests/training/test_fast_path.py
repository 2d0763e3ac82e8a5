"""The fast path of a training step: one device pays nothing for DDP, the compiled network is one graph per
training step, and the training graph takes the eager network's step.

On a CPU the compiled path uses Dynamo and AOTAutograd with the aot_eager backend (Inductor's C++ code
generation takes minutes on two cores); on CUDA the same comparison runs with Inductor and CUDA graphs, the
recipes' backend and mode, in bf16 and fp16, and laid out NHWC (the GPU suite's check).
"""

import copy

import einops
import lightning as L
import pytest
import torch
from helpers import QUICK, TINY_UNET
from torch._functorch._aot_autograd.autograd_cache import check_cacheable

from diffusion.cli.train import main
from diffusion.core.compiling import compiling_with
from diffusion.models import UNet
from diffusion.training.module import DiffusionModule

CUDA = torch.cuda.is_available()


def train_compiled(tmp_path, *flags: str) -> None:
    main([*TINY_UNET, *QUICK, "--model.compile_training", "true", "--accelerator", "cpu", "--trainer.logger", "false",
          "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "0", *flags])  # fmt: skip


def test_one_device_compiles_one_graph_per_training_step(tmp_path, graphs_handed_to_the_backend):
    # What the GPU recipe asked for: DDP on one device.
    train_compiled(tmp_path, "--strategy", "ddp", "--devices", "1")
    assert len(graphs_handed_to_the_backend) == 1
    (graph,) = graphs_handed_to_the_backend
    # einops' calls reach the graph as operations, not traced through by Dynamo at every call (diffusion.models.unet):
    # the tiny UNet's 8 residual blocks take one each, its 4 attention blocks three.
    assert len([node for node in graph.graph.nodes if node.target is einops.rearrange]) == 8 + 4 * 3
    # ... and AOTAutograd's compile cache takes the graph, so a warm compile skips tracing the joint graph again
    # (it raises BypassAOTAutogradCache for an operation it does not know, such as a wrapper of ours).
    check_cacheable(graph)


def test_the_ddp_wrapper_would_cut_the_compiled_network_into_pieces(tmp_path, graphs_handed_to_the_backend):
    # Why one device runs without it: Dynamo's DDPOptimizer splits the graph at DDP's gradient buckets (1 MB
    # buckets and a 2.6 MB network here, as a 35.7M network's 143 MB fill several of DDP's default 25 MB).
    ddp = ["--trainer.strategy.class_path", "DDPStrategy", "--trainer.strategy.init_args.bucket_cap_mb", "1"]
    train_compiled(tmp_path, *ddp, "--devices", "1", "--model.network.init_args.channels", "32")
    assert len(graphs_handed_to_the_backend) > 1


def tiny_module() -> DiffusionModule:
    torch.manual_seed(0)
    network = UNet(in_channels=1, channels=8, channel_mult=[1, 2], num_res_blocks=1, attention_levels=[1])
    return DiffusionModule(network, sample_shape=(1, 16, 16))


def loss_and_gradients(module: DiffusionModule, device: str, dtype: torch.dtype | None):
    module = module.to(device).train()
    generator = torch.Generator().manual_seed(1)
    x0 = (torch.rand((8, 1, 16, 16), generator=generator) * 2 - 1).to(device)
    noise, t = module.draw_noise_and_timesteps(x0, torch.arange(8, device=device), step=0, per_sample=True)
    with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = module.per_sample_loss(x0, noise, t).mean()
    loss.backward()
    return loss.detach().float(), {name: p.grad.float() for name, p in module.named_parameters()}


FAST_PATHS = [("cpu", "aot_eager", None, False), ("cpu", "aot_eager", torch.bfloat16, False)]
if CUDA:
    FAST_PATHS += [
        ("cuda", "inductor", torch.bfloat16, False),
        ("cuda", "inductor", torch.float16, False),
        ("cuda", "inductor", torch.bfloat16, True),  # the graph laid out NHWC (--model.compile_channels_last)
    ]  # the recipes' two, with CUDA graphs (the mode on CUDA)


@pytest.mark.parametrize("device, backend, dtype, channels_last", FAST_PATHS)
def test_the_compiled_network_takes_the_eager_step(device, backend, dtype, channels_last):
    eager = tiny_module()
    fast = copy.deepcopy(eager).to(device)
    fast.hparams.compile_training, fast.hparams.compile_channels_last = True, channels_last
    torch._dynamo.reset()
    fast.trainer = L.Trainer(accelerator=device, devices=1, logger=False, enable_checkpointing=False)
    with compiling_with(backend):
        fast.setup("fit")  # what fitting does: the training graph
    fast.trainer = None
    assert fast._training_graph is not None
    eager_loss, eager_grads = loss_and_gradients(eager, device, dtype)
    fast_loss, fast_grads = loss_and_gradients(fast, device, dtype)
    torch._dynamo.reset()
    # float32: rounding only (another summation order); half precision: its own rounding, per element
    atol, rtol = (1e-5, 1e-4) if dtype is None else (2e-2, 5e-2)
    torch.testing.assert_close(fast_loss, eager_loss, atol=atol, rtol=rtol)
    for name, grad in eager_grads.items():
        scale = grad.abs().max().clamp_min(1e-8)  # relative to the tensor's scale: tiny entries round freely
        torch.testing.assert_close(fast_grads[name] / scale, grad / scale, atol=atol, rtol=rtol, msg=name)


def test_compile_cuda_compiles_on_a_gpu_only():
    module = tiny_module()
    module.hparams.compile_training = "cuda"
    assert not module._compile_when_fitting()  # on the CPU
    module._device = torch.device("cuda", 0)  # where Lightning points it when fitting on a GPU
    assert module._compile_when_fitting()
    with pytest.raises(ValueError, match="compile"):
        DiffusionModule(tiny_module().network, compile="gpu")
