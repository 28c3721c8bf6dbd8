"""``stlsgd calibrate CONFIG``: measure the cost model's figures for a config's problem on this hardware.

- c, seconds per client-step: the local steps of ONE client of the config's problem at its per-client batch
  (the cost model's clients compute in parallel, one each), best of several timed calls;
- alpha and beta: the average the torch.distributed executor runs every round (:func:`group_mean`: an all-gather
  of the clients' models for the logistic problem, one all-reduce for networks), timed on the current process
  group when launched by torchrun (across the real machines), else on two local gloo processes over loopback;
  alpha is the median time of averaging an 8-byte state, beta the bytes of a large one (the model's size, at
  least 16 MiB) over its median time beyond alpha.

The profile (JSON, :func:`stlsgd.costmodel.write_profile`) is what ``--network PROFILE`` reads; it records the
dataset it was measured on, and a report on another dataset refuses it.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stlsgd.costmodel import Network, write_profile
from stlsgd.errors import StlsgdError
from stlsgd.executors import distributed
from stlsgd.executors.averaging import group_mean
from stlsgd.executors.sampling import Sampler
from stlsgd.experiments.build import build
from stlsgd.experiments.config import Experiment

BIG_BYTES = 16 * 2**20


def step_seconds(exp: Experiment, data_dir: str | None) -> tuple[float, dict[str, Any]]:
    """Seconds per client-step of one client's local steps (best of 5 timed calls of a fixed number of steps)."""
    built = build(exp, data_dir)
    batch = getattr(exp.algorithm, "batch", 1)
    steps = 10 if exp.problem.kind == "net" else 2000
    state = built.problem.init_state(1, exp.run.seed)
    sampler = Sampler(built.partition, exp.run.seed)
    lrs = np.full(steps, 1e-3)
    built.problem.local_steps(state, sampler.draw(steps, batch)[:, :1], lrs, None)  # compile, warm caches
    times = []
    for _ in range(5):
        rows = sampler.draw(steps, batch)[:, :1]
        started = time.perf_counter()
        built.problem.local_steps(state, rows, lrs, None)
        times.append(time.perf_counter() - started)
    best = min(times)
    return best / (steps * batch), {"steps_per_call": steps, "batch": batch, "call_s": times}


def _average_seconds(state: dict[str, Any], world: int, group: dist.ProcessGroup | None, reps: int) -> float:
    for _ in range(3):
        group_mean(state, world, group)
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        started = time.perf_counter()
        group_mean(state, world, group)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _states(model_bytes: int, numpy_state: bool) -> tuple[dict[str, Any], dict[str, Any], int]:
    size = max(model_bytes, BIG_BYTES) // 8 if numpy_state else max(model_bytes, BIG_BYTES) // 4
    if numpy_state:
        return {"w": np.zeros((1, 1))}, {"w": np.zeros((1, size))}, size * 8
    return {"w": torch.zeros(1, 2)}, {"w": torch.zeros(1, size)}, size * 4


def comm_figures(model_bytes: int, numpy_state: bool, group: dist.ProcessGroup | None, reps: int = 50
                 ) -> dict[str, float]:
    """alpha (s a round) and beta (B/s) of the executor's average on ``group`` (every rank calls this)."""
    world = (group or dist.group.WORLD).size()
    tiny, big, big_bytes = _states(model_bytes, numpy_state)
    alpha = _average_seconds(tiny, world, group, reps)
    big_s = _average_seconds(big, world, group, max(5, reps // 5))
    beta = big_bytes / max(big_s - alpha, 1e-9)
    return {"latency_s": alpha, "bandwidth_Bps": beta, "big_bytes": float(big_bytes), "big_s": big_s,
            "world_size": float(world)}


def _loopback_rank(rank: int, port: int, model_bytes: int, numpy_state: bool, box: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        figures = comm_figures(model_bytes, numpy_state, None)
        if rank == 0:
            box.update(figures)
    finally:
        dist.destroy_process_group()


def calibrate(exp: Experiment, out: Path, data_dir: str | None = None) -> Network | None:
    """Measure and write the profile (rank 0 writes under torchrun; other ranks return None)."""
    from stlsgd.experiments.build import model_bytes_for

    if out.exists() and out.is_dir():
        raise StlsgdError(f"{out}: is a directory; --out names the profile file to write")
    step_s, step_detail = step_seconds(exp, data_dir)
    model_bytes = model_bytes_for(exp) or 8 * 1024
    numpy_state = exp.problem.kind == "logistic"
    if distributed.launched() or dist.is_initialized():
        job = distributed.join()
        try:
            figures = comm_figures(model_bytes, numpy_state, job.group)
            where = f"{job.backend}, {job.world} ranks of the torchrun job"
            rank = job.rank
        finally:
            job.close()
    else:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with mp.Manager() as manager:
            box = manager.dict()
            mp.start_processes(_loopback_rank, args=(port, model_bytes, numpy_state, box), nprocs=2,
                               start_method="spawn")
            figures = dict(box)
        where, rank = "gloo, 2 local processes over loopback (launch under torchrun to measure your network)", 0
    if rank != 0:
        return None
    network = Network(figures["latency_s"], figures["bandwidth_Bps"], step_s, name=str(out),
                      source=f"stlsgd calibrate: {where}")
    write_profile(out, network, {"dataset": exp.data.dataset},
                  {**step_detail, **figures, "model_bytes": model_bytes, "communication": where})
    return network
