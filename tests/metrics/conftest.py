"""What the metrics tests share: an InceptionV3 weights file with random weights, so that nothing downloads."""

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def inception_weights(tmp_path_factory) -> Path:
    """A weights file for torch-fidelity's InceptionV3 with random (seeded) weights and batch-norm statistics,
    so both extractors can be built offline from the same file. He-normal convolutions and unit-scale
    normalization keep the activations of order 1 through all 94 layers, so every stage shapes the output.

    The 1008-class head gets random weights orthogonal to the pool features' common direction (random weights
    give every image a 2048-d pool vector of length ~39 that differs between images by ~1: unprojected, that
    shared part would pick the same class for every image and leave an Inception Score of 1), scaled to spread
    an image's logits over a few units; and a large bias, so that logits with and without it differ."""
    import torch_fidelity.feature_extractor_inceptionv3 as fidelity

    with pytest.MonkeyPatch.context() as patch:  # build the architecture without fetching the real weights
        patch.setattr(fidelity, "load_state_dict_from_url", lambda *args, **kwargs: None)
        patch.setattr(fidelity.FeatureExtractorInceptionV3, "load_state_dict", lambda self, state: None)
        network = fidelity.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    generator = torch.Generator().manual_seed(0)
    for module in network.modules():
        if isinstance(module, torch.nn.Conv2d):
            fan_in = module.weight[0].numel()
            module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * (2 / fan_in) ** 0.5)
        elif isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.copy_(0.1 * torch.randn(module.num_features, generator=generator))
            module.running_var.copy_(0.5 + torch.rand(module.num_features, generator=generator))
    image = torch.randint(0, 256, (1, 3, 8, 8), generator=generator, dtype=torch.uint8)
    common = torch.nn.functional.normalize(network(image)[0][0], dim=0)  # (2048,)
    weight = torch.randn(network.fc.weight.shape, generator=generator)  # (1008, 2048)
    weight -= torch.outer(weight @ common, common)
    network.fc.weight.copy_(3 * weight)
    network.fc.bias.copy_(5 * torch.randn(network.fc.bias.shape, generator=generator))
    path = tmp_path_factory.mktemp("inception") / "random_inception.pth"
    torch.save(network.state_dict(), path)
    return path
