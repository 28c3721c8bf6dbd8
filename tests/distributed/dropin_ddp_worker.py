"""Started by torchrun from the drop-in tests: a DDP-wrapped model with gradient accumulation, autocast and a
GradScaler, under PlanAverager; each rank writes OUT/rank<r>.json with what it saw.

    torchrun --nproc_per_node=2 tests/distributed/dropin_ddp_worker.py OUT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from stlsgd.algorithms import LocalSGD
from stlsgd.dropin import PlanAverager
from stlsgd.errors import StlsgdError


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    inner = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    ddp = nn.parallel.DistributedDataParallel(inner)
    grad_allreduces = [0]

    def hook(state, bucket):  # no annotations: DDP checks them, and they are strings here
        grad_allreduces[0] += 1
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    try:  # the trap: the inner module while DDP's all-reduce is live
        PlanAverager(inner, opt, LocalSGD(k=5))
        inner_refused = None
    except StlsgdError as exc:
        inner_refused = str(exc)
    averager = PlanAverager(ddp, opt, LocalSGD(k=5))  # stlsgd (2 of 2)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(21):
        opt.zero_grad()
        for micro in range(2):  # gradient accumulation: the first micro-batch without DDP's sync, as usual
            x, y = torch.randn(16, 4, generator=gen), torch.randint(0, 2, (16,), generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(ddp(x), y) / 2
            if micro == 0:
                with ddp.no_sync():
                    scaler.scale(loss).backward()
            else:
                scaler.scale(loss).backward()
        if step == 7:  # an overflow: the scaler skips this optimizer step, the averager must not count it
            next(inner.parameters()).grad.fill_(float("inf"))
        scaler.step(opt)
        scaler.update()
    in_sync = averager.models_in_sync()  # 20 counted steps: the run ends right after the 4th average
    result = {
        "ddp_grad_allreduces": grad_allreduces[0],
        "counted_steps": averager.iteration,
        "skipped": 21 - averager.iteration,
        "averages": averager.stats.averages,
        "in_sync": in_sync,
        "inner_refused": inner_refused,
        "weights": inner[0].weight.detach().flatten().tolist(),
        "bn_mean": inner[1].running_mean.tolist(),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # The results are written: leave without interpreter finalisation, during which torch's gloo thread can
    # still release a finished collective and abort the process (a known torch teardown race, docs/distributed.md).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
