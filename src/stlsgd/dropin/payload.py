"""What one average sends: each flat model buffer with the riders of its dtype and device (optimizer state,
control variates), in ONE all-reduce per (dtype, device), divided by the group's size."""

from __future__ import annotations

import torch
import torch.distributed as dist


def payloads(flats: list[torch.Tensor], riders: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The tensors of each all-reduce: a flat model buffer and the riders of its dtype and device."""
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {(f.dtype, f.device): [f] for f in flats}
    for t in riders:
        groups.setdefault((t.dtype, t.device), []).append(t)
    return list(groups.values())


def all_reduce_mean(
    flats: list[torch.Tensor], riders: list[torch.Tensor], group: dist.ProcessGroup | None, world: int
) -> int:
    """In place, on every rank: the flat buffers and the riders become their mean over the group; returns the
    bytes this rank sent. Riders are copied in and out (optimizers may re-create their state tensors at any
    step); a model buffer alone is reduced in place."""
    sent = 0
    for tensors in payloads(flats, riders):
        buffer = torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) > 1 else tensors[0]
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group)
        buffer.div_(world)
        if len(tensors) > 1:
            for t, piece in zip(tensors, buffer.split([t.numel() for t in tensors])):
                t.copy_(piece.view_as(t))
        sent += buffer.numel() * buffer.element_size()
    if flats and flats[0].is_cuda:
        torch.cuda.synchronize(flats[0].device)
    return sent


def broadcast_from_root(flats: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    for flat in flats:
        dist.broadcast(flat, group_src=0, group=group)


def max_gap_to_root(flats: list[torch.Tensor], group: dist.ProcessGroup | None) -> float:
    """The largest difference between this group's flat buffers and rank 0's, over every rank."""
    gap = torch.zeros((), dtype=torch.float64, device=flats[0].device)
    for flat in flats:
        ref = flat.clone()
        dist.broadcast(ref, group_src=0, group=group)
        gap = torch.maximum(gap, (flat - ref).abs().max().double())
    dist.all_reduce(gap, op=dist.ReduceOp.MAX, group=group)
    return float(gap)
