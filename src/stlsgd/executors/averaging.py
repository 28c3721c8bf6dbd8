"""How to average: one rule -- every client gets the mean of all clients' parameters and buffers.

*When* to average is the plan's business, never this module's. The rule has one canonical summation order:
the clients' arrays are added one after another in client order, then divided by N -- what NumPy's mean
over the leading axis of a C-contiguous array does. The simulator takes that mean over its stacked clients
(:func:`mean_over_clients`); over a process group, :func:`gather_mean` gathers every client's arrays onto
every rank and takes the same mean, so a run on any number of ranks gives the simulator's numbers bit for
bit. Where the state is large (a network's tensors) :func:`allreduce_mean` instead sums each rank's clients
and all-reduces the sums in one flat buffer: the same average to rounding, at a fraction of the traffic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import numpy as np

from stlsgd.problems.base import State

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

# torch is imported where a tensor or a process group is met, never at import: a NumPy run (the logistic
# problem on the simulator, a sweep worker) starts without paying for it.
Array = Union[np.ndarray, "torch.Tensor"]  # noqa: UP007 - a runtime alias


def rows_mean(rows: np.ndarray) -> np.ndarray:
    """The canonical mean over the leading (client) axis, keeping it: the rows added one after another in client
    order, then divided by N. For float64, ``np.add.reduce`` and the division ``.mean`` makes, without ``.mean``'s
    Python-level wrapper (a round of short periods pays it twice with drift correction); the same bits."""
    rows = np.ascontiguousarray(rows)
    if rows.dtype != np.float64:
        return rows.mean(axis=0, keepdims=True)
    total = np.add.reduce(rows, axis=0, keepdims=True)
    total /= rows.shape[0]
    return total


def mean_over_clients(state: State) -> None:
    """In place: every client's entry becomes the mean over the client axis (integer buffers keep client 0's)."""
    for value in state.values():
        if isinstance(value, np.ndarray):
            value[...] = rows_mean(value)
        elif value.is_floating_point():
            value.copy_(value.mean(dim=0, keepdim=True).expand_as(value))
        else:
            value.copy_(value[:1].expand_as(value))


def gather_mean(state: State, num_clients: int, group: dist.ProcessGroup | None = None) -> None:
    """In place, on every rank: each local client's floating NumPy arrays become the mean over all N clients,
    in the canonical order (see the module docstring), so the result is the simulator's bit for bit.

    The ranks' clients are contiguous slices in rank order (:func:`client_slice`), so the gathered rows, in rank
    order, are the clients in index order. One all-gather per array (the
    logistic model has one); ranks with fewer clients pad their share.
    """
    for value in state.values():
        if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
            value[...] = rows_mean(gather_rows(value, num_clients, group).cpu().numpy())


def client_slice(num_clients: int, world_size: int, rank: int) -> slice:
    """Rank ``rank``'s contiguous share of the client axis; the first N mod P ranks get one client more."""
    base, extra = divmod(num_clients, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def gather_rows(value: np.ndarray | torch.Tensor, num_clients: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Every rank's rows of a client-stacked array, in rank (= client) order, on every rank (CPU tensor).

    One all-gather: every rank knows every share's size from :func:`client_slice`; smaller shares are padded."""
    import torch
    import torch.distributed as dist

    device = comm_device(torch.device("cpu") if isinstance(value, np.ndarray) else value.device, group)
    world = _size(group)
    counts = [len(range(num_clients)[client_slice(num_clients, world, r)]) for r in range(world)]
    tensor = _as_tensor(value)
    mine = torch.zeros((max(counts), *value.shape[1:]), dtype=tensor.dtype, device=device)
    mine[: value.shape[0]] = tensor.to(device)
    rows = [torch.empty_like(mine) for _ in counts]
    dist.all_gather(rows, mine, group=group)
    return torch.cat([r[:c] for r, c in zip(rows, counts)]).cpu()


def gather_clients(state: State, num_clients: int, group: dist.ProcessGroup | None = None) -> State:
    """Every client's arrays, gathered from their ranks (to checkpoint per-client state)."""
    return {
        k: (
            gather_rows(v, num_clients, group).numpy()
            if isinstance(v, np.ndarray)
            else gather_rows(v, num_clients, group).to(v.device)
        )
        for k, v in state.items()
    }


def allreduce_mean(state: State, num_clients: int, group: dist.ProcessGroup | None = None) -> None:
    """In place, on every rank: each local client's floating arrays become the mean over all N clients.

    Each rank sums its own clients into one flat buffer holding every floating array of the state
    (parameters and buffers alike), ONE all-reduce (SUM) adds the ranks' sums, and the result divided by
    ``num_clients`` is written back to every local client. The sums run in another order than the
    simulator's mean, so results agree to rounding. Integer buffers (BatchNorm's ``num_batches_tracked``)
    advance identically on every client and are left as they are.
    """
    import torch
    import torch.distributed as dist

    floats = [_as_tensor(v) for v in state.values() if _is_float(v)]
    if not floats:
        return
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in floats))
    device = comm_device(floats[0].device, group)
    sizes = [int(np.prod(t.shape[1:], dtype=np.int64)) for t in floats]
    flat = torch.empty(sum(sizes), dtype=dtype, device=device)
    for t, piece in zip(floats, flat.split(sizes)):
        torch.sum(t.to(device), dim=0, dtype=dtype, out=piece.view(t.shape[1:]))
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    flat.div_(num_clients)
    for t, piece in zip(floats, flat.split(sizes)):
        t.copy_(piece.view(1, *t.shape[1:]).expand_as(t))


def group_mean(state: State, num_clients: int, group: dist.ProcessGroup | None = None) -> None:
    """The average over a process group: exact (:func:`gather_mean`) for NumPy states such as the logistic
    model, whose gather costs nothing that matters; one all-reduce (:func:`allreduce_mean`) for torch states
    (networks), whose all-clients gather would multiply the traffic by the number of clients."""
    if any(isinstance(v, np.ndarray) for v in state.values()):
        gather_mean(state, num_clients, group)
    tensors = {k: v for k, v in state.items() if not isinstance(v, np.ndarray)}
    if tensors:
        allreduce_mean(tensors, num_clients, group)


def comm_device(device: torch.device, group: dist.ProcessGroup | None) -> torch.device:
    """nccl reduces only CUDA tensors; every other backend here (gloo) is used with CPU tensors."""
    import torch
    import torch.distributed as dist

    # name(), not dist.get_backend(): it also works for groups built directly (ProcessGroupGloo(store, ...)).
    if _group(group).name() == dist.Backend.NCCL:
        return device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``group``, or the default group (which exists whenever a collective is asked for)."""
    import torch.distributed as dist

    chosen = group if group is not None else dist.group.WORLD
    if chosen is None:
        raise RuntimeError("no process group: torch.distributed is not initialised")
    return chosen


def _size(group: dist.ProcessGroup | None) -> int:
    return _group(group).size()


def _is_float(value: np.ndarray | torch.Tensor) -> bool:
    return np.issubdtype(value.dtype, np.floating) if isinstance(value, np.ndarray) else value.is_floating_point()


def _as_tensor(value: np.ndarray | torch.Tensor) -> torch.Tensor:
    import torch

    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value


# --------------------------------------------------------------------------- state utilities


def copy_state(state: State) -> State:
    """A deep copy (the proximal anchor, checkpoints)."""
    return {k: (v.copy() if isinstance(v, np.ndarray) else v.clone()) for k, v in state.items()}


def replicate(state: State, count: int) -> State:
    """``count`` copies of client 0 (clients are equal at the start and after every average)."""
    out: State = {}
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            out[key] = np.repeat(value[:1], count, axis=0)
        else:
            out[key] = value[:1].repeat(count, *([1] * (value.dim() - 1)))
    return out


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
        elif value.is_floating_point() and not bool(value.isfinite().all()):
            return False
    return True


# --------------------------------------------------------------------------- an outer step on the average


@dataclass(frozen=True)
class OuterNesterov:
    """DiLoCo's outer optimizer (Douillard et al., 2023): SGD with Nesterov momentum on the averaged update.

    Instead of replacing the model with the average, the pseudo-gradient Delta = x_start - average (the model
    at the round's start minus the average of the clients' models at its end) takes one step:
    m <- mu m + Delta; x <- x_start - lr_out (Delta + mu m) (Nesterov; without it, x_start - lr_out m).
    lr_out = 1 and mu = 0 give plain averaging back. DiLoCo uses lr_out = 0.7, mu = 0.9. Only the parameters
    take the step; buffers (BatchNorm statistics) are averaged as they are.
    """

    lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True

    def __post_init__(self) -> None:
        if not (0 < self.lr < float("inf")):
            raise ValueError(f"lr: the outer learning rate must be a positive finite number, got {self.lr!r}")
        if not (0 <= self.momentum < 1):
            raise ValueError(f"momentum: the outer momentum must be in [0, 1), got {self.momentum!r}")

    def step(self, start: Array, averaged: Array, momentum: Array) -> None:
        """In place: ``averaged`` becomes the outer step's new model, ``momentum`` its new buffer (NumPy arrays
        or torch tensors alike)."""
        delta = start - averaged
        momentum *= self.momentum
        momentum += delta
        update = delta + self.momentum * momentum if self.nesterov else momentum
        averaged[...] = start - self.lr * update  # type: ignore[assignment]  # ndarray or tensor alike
