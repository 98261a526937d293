"""A small MLP for 8x8 digit images; big enough that DDP's gradient all-reduce does real work."""

from __future__ import annotations

from torch import nn


def build_model(hidden: int = 128) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )
