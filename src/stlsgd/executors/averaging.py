"""How to average: one rule -- every client gets the mean of all clients' parameters and buffers.

The simulator takes a mean over the client axis of each stacked array; the torch.distributed executor
all-reduces one flat buffer (see :mod:`stlsgd.executors.distributed`). *When* to average is the plan's
business, never this module's.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.distributed as dist

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


def allreduce_mean(state: State, num_clients_total: int, group: dist.ProcessGroup | None = None) -> None:
    """In place, on every rank: each local client's floating arrays become the mean over all N clients.

    The torch.distributed form of :func:`mean_over_clients` (the averaging step of Algorithm 1): each rank
    sums its own clients into one flat buffer holding every floating array of the state (parameters and
    buffers alike), ONE all-reduce (SUM) adds the ranks' sums, and the result divided by
    ``num_clients_total`` is written back to every local client. Ranks may hold different numbers of
    clients. NumPy arrays are wrapped with ``torch.from_numpy`` (no copy). Integer buffers (BatchNorm's
    ``num_batches_tracked``) advance identically on every client and are left as they are. The buffer lives
    where the backend needs it: on the current CUDA device for ``nccl``, on the CPU otherwise.
    """
    tensors = [torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in state.values()]
    floats = [t for t in tensors if torch.is_floating_point(t)]
    if not floats:
        return
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in floats))
    device = comm_device(floats[0].device, group)
    sizes = [int(np.prod(t.shape[1:], dtype=np.int64)) for t in floats]
    flat = torch.empty(sum(sizes), dtype=dtype, device=device)
    for t, piece in zip(floats, flat.split(sizes)):
        torch.sum(t.to(device), dim=0, dtype=dtype, out=piece.view(t.shape[1:]))
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    flat.div_(num_clients_total)
    for t, piece in zip(floats, flat.split(sizes)):
        t.copy_(piece.view(1, *t.shape[1:]).expand_as(t))


def comm_device(device: torch.device, group: dist.ProcessGroup | None) -> torch.device:
    """nccl reduces only CUDA tensors; every other backend here (gloo) is used with CPU tensors."""
    # name(), not dist.get_backend(): it also works for groups built directly (ProcessGroupGloo(store, ...)).
    if (group if group is not None else dist.group.WORLD).name() == dist.Backend.NCCL:
        return device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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
