"""The compiled sampling path (`--compile true`, a sampler option): the tiny UNet's evaluation compiled once for the
whole loop draws the eager path's samples, in 32-bit and under bf16 autocast (`--precision bf16-mixed`), and on a
model whose network fitting compiled already (the FID callback's case); one graph serves every step of every batch.

On a CPU it compiles with aot_eager (Dynamo and AOTAutograd, the graphs Inductor would get, without minutes of C++),
which runs the traced operations themselves, so the samples are equal; on CUDA the recipe's Inductor with CUDA graphs
is what the GPU benchmark times (benchmarks/speed/speed.py --sampling_compile).
"""

import pytest
import torch

from diffusion.core.sampling import SamplingOptions
from diffusion.generation.precision import network_precision
from diffusion.generation.ranks import generate
from diffusion.models import MLP
from diffusion.training.loading import load_checkpoint
from diffusion.training.module import DiffusionModule

DDIM_3 = {"sampler": "ddim", "steps": 3}


def draw(module, compile: bool) -> torch.Tensor:
    """8 samples in two batches of 4: DDIM-3, per-sample seeds."""
    return generate(
        module, 8, sampler=module.sampler(SamplingOptions(**DDIM_3, compile=compile)), seed=0, batch_size=4
    )


@pytest.mark.slow
def test_the_compiled_loop_draws_the_eager_samples_from_one_graph(
    digits_checkpoint, graphs_handed_to_the_backend
):
    module = load_checkpoint(digits_checkpoint)
    graphs = graphs_handed_to_the_backend
    eager = draw(module, compile=False)
    assert graphs == []
    torch.testing.assert_close(draw(module, compile=True), eager, rtol=0, atol=1e-6)
    assert len(graphs) == 1  # 3 steps x 2 batches, one graph
    with network_precision(module, "bf16-mixed"):
        eager_bf16 = draw(module, compile=False)
        torch.testing.assert_close(draw(module, compile=True), eager_bf16, rtol=0, atol=1e-6)
    assert len(graphs) == 2 and (eager_bf16 - eager).abs().max() > 1e-4  # autocast inside the graph


def test_a_network_compiled_for_fitting_is_taken_into_the_samplers_graph(graphs_handed_to_the_backend):
    # `--model.compile_training true` compiles the network in place and marks its batch dynamic from the module's forward;
    # the FID callback's sampling then traces that forward into its own graph of fixed shapes.
    torch.manual_seed(0)
    module = DiffusionModule(MLP(hidden_dim=16, num_blocks=1, time_embed_dim=16), sample_shape=(2,))
    eager = draw(module, compile=False)
    module.network.compile(backend="aot_eager")
    module._compiled = True
    torch.testing.assert_close(draw(module, compile=True), eager, rtol=0, atol=1e-6)
    assert len(graphs_handed_to_the_backend) == 1
