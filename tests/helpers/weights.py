"""What the resume tests compare: a checkpoint's raw and EMA network weights, and their largest difference."""

import torch


def network_weights(checkpoint: dict) -> dict[str, dict[str, torch.Tensor]]:
    """{"raw": ..., "ema": ...}: EMA keeps the average under state_dict and the raw weights beside it."""
    pick = lambda state: {k: v for k, v in state.items() if k.startswith("network.")}  # noqa: E731
    return {"raw": pick(checkpoint["current_model_state"]), "ema": pick(checkpoint["state_dict"])}


def max_abs_diff(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> float:
    assert x.keys() == y.keys() and x
    return max((x[k] - y[k]).abs().max().item() for k in x)
