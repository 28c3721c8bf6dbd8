"""Averaging cost per round on a ResNet18 (11.2M floats) with 4 gloo ranks: ours vs PyTorch's averager.

* ours: :class:`stlsgd.dropin.PlanAverager` -- the model's parameters AND buffers live in one flat buffer,
  and an average is one in-place all-reduce (SUM) of it plus one division;
* PyTorch: ``torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager`` with period 1
  and no warm-up (parameters only: it concatenates them into a new flat tensor, divides, all-reduces and
  re-points the parameters at it every round).

Both run in the same processes on separate copies of the model, interleaved in repetitions; a round's time
is the slowest rank's. Prints both (median ms per round) and the ratio.

    python benchmarks/bench_averaging.py [--ranks 4] [--rounds 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from stlsgd.algorithms import SyncSGD
from stlsgd.dropin import PlanAverager
from stlsgd.problems.nets import ResNet18


def _timed(fn, rounds: int) -> float:
    """Seconds per round on the slowest rank."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    elapsed = torch.tensor([(time.perf_counter() - start) / rounds], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def _worker(rank: int, world: int, port: int, rounds: int, repeats: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    ours_model, theirs_model = ResNet18(), ResNet18()
    ours = PlanAverager(ours_model, torch.optim.SGD(ours_model.parameters(), lr=0.1), SyncSGD(lr=0.1))
    with warnings.catch_warnings():  # its advice to prefer DDP at period 1 is beside the point of a cost test
        warnings.simplefilter("ignore", UserWarning)
        theirs = PeriodicModelAverager(period=1, warmup_steps=0)
    for p in theirs_model.parameters():  # it averages only parameters that have a gradient
        p.grad = torch.zeros_like(p)
    params = sum(p.numel() for p in ours_model.parameters())
    buffers = sum(b.numel() for b in ours_model.buffers() if torch.is_floating_point(b))

    def ours_round() -> None:
        ours.average()

    def theirs_round() -> None:
        theirs.average_parameters(theirs_model.parameters())

    ours_round(), theirs_round()  # warm-up: connections, allocator
    t_ours, t_theirs = [], []
    for _ in range(repeats):
        t_ours.append(_timed(ours_round, rounds))
        t_theirs.append(_timed(theirs_round, rounds))
    if rank == 0:
        a, b = statistics.median(t_ours) * 1e3, statistics.median(t_theirs) * 1e3
        print(
            f"ResNet18: {params / 1e6:.2f}M parameters + {buffers / 1e3:.1f}k float buffers, {world} gloo ranks, "
            f"{rounds} rounds x {repeats} repeats"
        )
        print(f"ours (flat buffer, params + buffers): {a:8.2f} ms/round")
        print(f"PeriodicModelAverager (params only):  {b:8.2f} ms/round")
        print(f"ratio PeriodicModelAverager / ours:   {b / a:8.2f}x")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(args.ranks, port, args.rounds, args.repeats), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
