"""How to average: one rule -- every client gets the mean of all clients' parameters and buffers.

The simulator takes a mean over the client axis of each stacked array; the torch.distributed executor
all-reduces one flat buffer (see :mod:`stlsgd.executors.distributed`). *When* to average is the plan's
business, never this module's.
"""

from __future__ import annotations

import numpy as np
import torch

from stlsgd.problems.base import State


def mean_over_clients(state: State) -> None:
    """In place: every client's entry becomes the mean over the client axis (integer buffers keep client 0's)."""
    for value in state.values():
        if isinstance(value, np.ndarray):
            value[...] = value.mean(axis=0, keepdims=True)
        elif torch.is_floating_point(value):
            value.copy_(value.mean(dim=0, keepdim=True).expand_as(value))
        else:
            value.copy_(value[:1].expand_as(value))


def copy_state(state: State) -> State:
    """A deep copy (the proximal anchor, checkpoints)."""
    return {k: (v.copy() if isinstance(v, np.ndarray) else v.clone()) for k, v in state.items()}


def model_bytes(state: State) -> int:
    """Bytes of one client's model (what it sends, and receives, per round)."""
    total = 0
    for value in state.values():
        n_clients = value.shape[0]
        total += (value.nbytes if isinstance(value, np.ndarray) else value.element_size() * value.numel()) // n_clients
    return total


def is_finite(state: State) -> bool:
    for value in state.values():
        if isinstance(value, np.ndarray):
            if not np.isfinite(value).all():
                return False
        elif torch.is_floating_point(value) and not bool(torch.isfinite(value).all()):
            return False
    return True
