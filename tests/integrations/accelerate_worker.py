"""Started by torchrun from test_accelerate.py: an Accelerate loop (MULTI_CPU, DDP, gradient accumulation) under
StlsgdLocalSGD; each rank writes OUT/rank<r>.json with what it saw.

    torchrun --nproc_per_node=2 tests/integrations/accelerate_worker.py OUT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch import nn

from stlsgd.algorithms import STLSGD, LocalSGD
from stlsgd.integrations.accelerate import StlsgdLocalSGD


def snapshot(module: nn.Module) -> dict[str, list[float]]:
    """Every parameter and buffer (BatchNorm statistics included), as lists."""
    return {k: v.detach().double().flatten().tolist() for k, v in module.state_dict().items()}


def main(out: Path) -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    rank = accelerator.process_index
    torch.manual_seed(rank)  # different initial models: the averager starts every rank from rank 0's
    inner = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(inner.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = accelerator.prepare(inner, optimizer)
    grad_allreduces = [0]

    def hook(state, bucket):  # no annotations: DDP checks them
        grad_allreduces[0] += 1
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    model.register_comm_hook(None, hook)
    gen = torch.Generator().manual_seed(100 + rank)  # every rank (client) draws its own data

    def micro_batch() -> None:
        x, y = torch.randn(16, 4, generator=gen), torch.randint(0, 2, (16,), generator=gen)
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

    # Phase 1: STL-SGD's stages (T1 = 4, k1 = 1), 30 micro-batches = 15 optimizer steps; leaves mid-round.
    rounds, steps = [], []
    sync_before = model.require_backward_grad_sync
    plan = STLSGD(T1=4, k1=1.0)
    with StlsgdLocalSGD(
        accelerator,
        model,
        optimizer,
        plan,
        on_round=lambda s: rounds.append(
            {"round": s.round, "stage": s.stage, "period": s.period, "steps": s.steps, "state": snapshot(inner)}
        ),
    ) as local_sgd:
        sync_inside = model.require_backward_grad_sync
        for _ in range(30):
            micro_batch()
            averaged = local_sgd.step()
            steps.append(
                {
                    "iteration": local_sgd.averager.iteration,
                    "averaged": averaged,
                    "boundary": local_sgd.averager.at_boundary,
                    "state": snapshot(inner),
                }
            )
        mid_round_at_exit = not local_sgd.averager.at_boundary
    phase1 = {
        "rounds": rounds,
        "steps": steps,
        "calls": local_sgd.num_steps,
        "iteration": local_sgd.averager.iteration,
        "averages": local_sgd.averager.stats.averages,
        "mid_round_at_exit": mid_round_at_exit,
        "in_sync": local_sgd.averager.models_in_sync(),
        "final": snapshot(inner),
        "sync_before": sync_before,
        "sync_inside": sync_inside,
        "sync_after": model.require_backward_grad_sync,
    }

    # Phase 2: Local SGD (k = 3), a fresh optimizer, 12 optimizer steps: ends on a boundary, no extra average.
    optimizer2 = accelerator.prepare(torch.optim.SGD(inner.parameters(), lr=0.05))
    optimizer = optimizer2
    with StlsgdLocalSGD(accelerator, model, optimizer2, LocalSGD(k=3)) as local_sgd2:
        for _ in range(24):
            micro_batch()
            local_sgd2.step()
    phase2 = {
        "iteration": local_sgd2.averager.iteration,
        "averages": local_sgd2.averager.stats.averages,
        "rounds": local_sgd2.averager.stats.round,
        "final": snapshot(inner),
        "in_sync": local_sgd2.averager.models_in_sync(),
    }

    result = {
        "type": str(accelerator.distributed_type.value),
        "world": accelerator.num_processes,
        "ddp_grad_allreduces": grad_allreduces[0],
        "phase1": phase1,
        "phase2": phase2,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # The results are written: leave without interpreter finalisation, during which torch's gloo thread can
    # still release a finished collective and abort the process (a known torch teardown race, docs/distributed.md).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
