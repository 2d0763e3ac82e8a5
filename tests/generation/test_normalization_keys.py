"""A normalization dict of other keys than shift and scale: refused naming them, never ignored (tester 9b, R7)."""

import pytest
import torch

from diffusion import MLP, DiffusionModule
from diffusion.generation.render import denormalize, to_uint8

X = torch.zeros(2, 1, 4, 4)


@pytest.mark.parametrize("render", [denormalize, to_uint8])
@pytest.mark.parametrize(
    ("normalization", "words"),
    [
        (
            {"scale": [0.5], "shift": [0.5], "offset": [0.2]},
            "normalization has keys other than shift and scale ('offset')",
        ),
        (
            {"scale": [0.5], "shift": [0.5], "shfit": [0.7]},
            "normalization has keys other than shift and scale ('shfit')",
        ),
        (
            {"scale": [0.5], "shfit": [0.5]},
            "normalization has no shift, and keys other than shift and scale ('shfit') — pass module.normalization",
        ),
        ({"scale": [0.5]}, "normalization has no shift — pass module.normalization"),
        ({}, "normalization has no shift and no scale — "),
    ],
    ids=["extra", "typo-beside", "typo-alone", "missing", "empty"],
)
def test_other_or_missing_keys_are_named(render, normalization, words):
    with pytest.raises(ValueError) as refused:
        render(X, normalization)
    assert str(refused.value).startswith(words)


def test_a_module_refuses_an_unknown_key():
    network = MLP(in_channels=2, hidden_dim=8, num_blocks=1, time_embed_dim=8)
    normalization = {"shift": [0.0, 0.0], "scale": [1.0, 1.0], "offset": [0.2, 0.2]}
    with pytest.raises(
        ValueError, match=r"^normalization has keys other than shift and scale \('offset'\) — "
    ):
        DiffusionModule(network, sample_shape=(2,), normalization=normalization)
