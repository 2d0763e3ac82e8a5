"""Activation checkpointing per UNet level: the same gradients, fewer activations kept for the backward."""

import pytest
import torch

from diffusion.models import UNet

CONFIG = {"in_channels": 1, "channels": 8, "channel_mult": [1, 2], "num_res_blocks": 1, "attention_levels": [1],
          "dropout": 0.1}  # fmt: skip


def gradients_and_saved_bytes(checkpoint_levels):
    torch.manual_seed(0)
    network = UNet(**CONFIG, checkpoint_levels=checkpoint_levels).train()
    with torch.no_grad():  # away from the zero init, where no gradient but conv_out's depends on the dropout
        for parameter in network.parameters():
            parameter.normal_(0, 0.2)
    torch.manual_seed(1)  # the dropout masks: drawn again in the recomputation, from the replayed state
    x, t = torch.randn(4, 1, 16, 16), torch.randint(0, 1000, (4,))
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = (network(x, t) - x).square().mean()
    loss.backward()
    return {name: p.grad for name, p in network.named_parameters()}, sum(saved)


@pytest.mark.parametrize("levels", [[0], [1], [0, 1]])
def test_checkpointed_levels_give_the_same_gradients_and_keep_less(levels):
    reference, kept = gradients_and_saved_bytes([])
    gradients, kept_checkpointed = gradients_and_saved_bytes(levels)
    for name, grad in reference.items():
        torch.testing.assert_close(gradients[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert kept_checkpointed < 0.8 * kept


def test_evaluation_and_no_grad_do_not_checkpoint(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("checkpointed outside training")

    monkeypatch.setattr("diffusion.models.unet.checkpoint", refuse)
    network = UNet(**CONFIG, checkpoint_levels=[0, 1])
    x, t = torch.randn(2, 1, 16, 16), torch.randint(0, 1000, (2,))
    network.eval()(x, t)  # sampling: eval mode
    with torch.no_grad():
        network.train()(x, t)  # validation's loss under no_grad


def test_a_checkpoint_level_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"checkpoint_levels \[2\]: level 2 is out of range"):
        UNet(**CONFIG, checkpoint_levels=[2])
