"""Started by torchrun from the drift test: each rank is one client of the logistic problem (digits49, Non-IID
over 2 clients), trained with plain SGD under ``PlanAverager(..., drift=True)``; the mini-batches are the ones
the simulator's sampler draws. Trains 6 rounds uninterrupted, then again with a per-rank checkpoint in the
middle of round 3 restored into a fresh model, optimizer and averager, then 6 rounds with the control variates
from each round's first WINDOW steps, and with them from the first SHARE of each round (the same steps here, by
another path); writes OUT/rank<r>.json.

    torchrun --nproc_per_node=2 tests/distributed/dropin_drift_worker.py OUT
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from stlsgd.algorithms import LocalSGD
from stlsgd.data import load_dataset, make_partition
from stlsgd.dropin import PlanAverager
from stlsgd.executors.sampling import Sampler

PLAN = LocalSGD(lr=0.5, k=5, lr_decay=0.05)  # the lr changes within every round
ROUNDS, SEED, STOP = 6, 7, 13  # step 13: the middle of round 3
WINDOW = 3  # of every round's 5 steps
SHARE = 0.6  # floor(0.6 x 5) = 3 of them


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = load_dataset("digits49")
    X, y = torch.from_numpy(ds.X.toarray()), torch.from_numpy(np.asarray(ds.y, dtype=np.float64))
    lam = 1.0 / X.shape[0]  # the problem's default lambda
    sampler = Sampler(make_partition(ds.y, 2, "noniid", seed=0, s=0), SEED)
    rows = np.concatenate([sampler.draw(PLAN.k, 1) for _ in range(ROUNDS)])[:, rank, 0]  # as the simulator draws

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = nn.Linear(X.shape[1], 1, bias=False, dtype=torch.float64)
        nn.init.zeros_(model.weight)
        return model, torch.optim.SGD(model.parameters(), lr=1.0)

    def train(model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
        for t in steps:
            r = int(rows[t])
            w = model.weight[0]
            loss = F.softplus(-y[r] * (X[r] @ w)) + 0.5 * lam * (w @ w)
            opt.zero_grad()
            loss.backward()
            opt.step()

    model, opt = make()
    avg = PlanAverager(model, opt, PLAN, plan_lr=True, drift=True)
    train(model, opt, range(ROUNDS * PLAN.k))
    whole = model.weight.detach()[0].tolist()
    control = [float(c.abs().max()) for c in avg._control or []]
    avg.close()

    model, opt = make()
    avg = PlanAverager(model, opt, PLAN, plan_lr=True, drift=True)
    train(model, opt, range(STOP))
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "avg": avg.state_dict()})
    avg.close()
    model, opt = make()
    avg = PlanAverager(model, opt, PLAN, plan_lr=True, drift=True)
    avg.load_state_dict(saved["avg"])
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    train(model, opt, range(STOP, ROUNDS * PLAN.k))
    resumed = model.weight.detach()[0].tolist()
    bytes_sent = avg.stats.bytes_sent
    avg.close()

    model, opt = make()
    avg = PlanAverager(model, opt, PLAN, plan_lr=True, drift=True, drift_window=WINDOW)
    train(model, opt, range(ROUNDS * PLAN.k))
    windowed = model.weight.detach()[0].tolist()
    avg.close()

    model, opt = make()
    avg = PlanAverager(model, opt, PLAN, plan_lr=True, drift=True, drift_share=SHARE)
    train(model, opt, range(ROUNDS * PLAN.k))
    shared = model.weight.detach()[0].tolist()
    avg.close()
    result = {
        "whole": whole,
        "resumed": resumed,
        "windowed": windowed,
        "shared": shared,
        "control_max": control,
        "bytes": bytes_sent,
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
