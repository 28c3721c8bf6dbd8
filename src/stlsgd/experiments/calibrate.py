"""``stlsgd calibrate CONFIG``: measure the cost model's figures for a config's problem on this hardware.

Every rank of a process group (the torchrun job's, or two local gloo processes over loopback) holds one client
and measures, at the same time as the others, what the torch.distributed executor spends:

- c, seconds per client-step: a round's local steps of its client (k of the config's steps at its per-client
  batch, the mini-batch draw included), the median call while all ranks compute at once, the slowest rank's;
- beta: the average the executor runs every round (:func:`group_mean`: an all-gather of the clients' models for
  the logistic problem, one all-reduce for networks) of a large state (the model's size, at least 16 MiB):
  its bytes over its median time beyond that of an 8-byte state;
- alpha: what a round costs beyond its computation and transfer: the median round (local steps, a 1 ms sleep
  standing in for the wait on the network, then the average of the model, with no barrier, as the executor runs
  them), less the sleep, the median local steps and the model's bytes / beta. It thus holds the per-round costs
  the executor pays and the cost model charges to latency: the collective's round trip, the wait for the slowest
  rank, waking from the wait, and the round's own bookkeeping.

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
from stlsgd.experiments.build import Built, build
from stlsgd.experiments.config import Experiment

BIG_BYTES = 16 * 2**20
IDLE_S = 1e-3


def _group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``group``, or the default group (initialised: every caller runs inside a process group)."""
    chosen = group or dist.group.WORLD
    assert chosen is not None
    return chosen


def _round_figures(
    exp: Experiment, built: Built, group: dist.ProcessGroup | None, reps: int, beta: float, model_bytes: int
) -> dict[str, Any]:
    """c and alpha as the executor's rounds spend them (see the module docstring); every rank calls this."""
    world, rank = _group(group).size(), _group(group).rank()
    batch = getattr(exp.algorithm, "batch", 1)
    k = int(min(getattr(exp.algorithm, "k", None) or 100, 10 if exp.problem.kind == "net" else 2000))
    state = built.problem.init_state(1, exp.run.seed)
    sampler = Sampler(built.partition, exp.run.seed + rank)
    own = slice(rank % exp.data.num_clients, rank % exp.data.num_clients + 1)
    lrs = np.full(k, 1e-3)
    built.problem.warm_up()

    def local_steps() -> None:
        built.problem.local_steps(state, sampler.draw(k, batch)[:, own], lrs, None)

    local_steps()
    compute, rounds = [], []
    for _ in range(reps):
        dist.barrier(group=group)
        started = time.perf_counter()
        local_steps()
        compute.append(time.perf_counter() - started)
    dist.barrier(group=group)
    for _ in range(reps):
        started = time.perf_counter()
        local_steps()
        # A real round waits for the network, and a process that waits is descheduled: it pays to wake up
        # (a cold cache, a slower first step). A short sleep stands in for that wait; its own length is not
        # charged to the round.
        slept = time.perf_counter()
        time.sleep(IDLE_S)
        slept = time.perf_counter() - slept
        group_mean(state, world, group)
        rounds.append(time.perf_counter() - started - slept)
    # Synchronous rounds go at the pace of the slowest rank: keep its figures.
    slowest = torch.tensor([statistics.median(compute), statistics.median(rounds)], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    compute_s, round_s = slowest.tolist()
    return {
        "step_s": compute_s / (k * batch),
        "round_s": round_s,
        "round_compute_s": compute_s,
        "round_overhead_s": round_s - compute_s - model_bytes / beta,
        "steps_per_call": k,
        "batch": batch,
    }


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


def measure(
    exp: Experiment, built: Built, model_bytes: int, group: dist.ProcessGroup | None, reps: int = 50
) -> dict[str, float]:
    """The profile's figures on ``group`` (every rank calls this): latency_s, bandwidth_Bps, step_s, and the
    timings behind them."""
    world = _group(group).size()
    tiny, big, big_bytes = _states(model_bytes, exp.problem.kind == "logistic")
    tiny_s = _average_seconds(tiny, world, group, reps)
    big_s = _average_seconds(big, world, group, max(5, reps // 5))
    beta = big_bytes / max(big_s - tiny_s, 1e-9)
    # The per-round overhead is a small difference of noisy times: many short rounds for the logistic problem,
    # a few for networks, whose steps take milliseconds.
    rounds = _round_figures(exp, built, group, 4 * reps if exp.problem.kind == "logistic" else 5, beta, model_bytes)
    # A round can never cost less than the bare collective's round trip (the difference is timing noise).
    latency = max(rounds["round_overhead_s"], tiny_s)
    return {
        "latency_s": latency,
        "bandwidth_Bps": beta,
        **rounds,
        "tiny_average_s": tiny_s,
        "big_bytes": float(big_bytes),
        "big_s": big_s,
        "world_size": float(world),
    }


def _loopback_rank(rank: int, port: int, exp: Experiment, data_dir: str | None, model_bytes: int, box: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        figures = measure(exp, build(exp, data_dir), model_bytes, None)
        if rank == 0:
            box.update(figures)
    finally:
        dist.destroy_process_group()


def calibrate(exp: Experiment, out: Path, data_dir: str | None = None) -> Network | None:
    """Measure and write the profile (rank 0 writes under torchrun; other ranks return None)."""
    from stlsgd.experiments.build import model_bytes_for

    if out.exists() and out.is_dir():
        raise StlsgdError(f"{out}: is a directory; --out names the profile file to write")
    folder = out.parent
    if not folder.is_dir():  # checked before the measuring (tens of seconds), not after
        what = "is not a directory" if folder.exists() else "does not exist"
        raise StlsgdError(f"{out}: its folder {folder} {what}; create it or choose another --out")
    model_bytes = model_bytes_for(exp) or 8 * 1024
    if distributed.launched() or dist.is_initialized():
        job = distributed.join()
        try:
            built = distributed.collectively(lambda: build(exp, data_dir), job.group)
            figures = measure(exp, built, model_bytes, job.group)
            where = f"{job.backend}, {job.world} ranks of the torchrun job"
            rank = job.rank
        finally:
            job.close()
    else:
        import socket

        build(exp, data_dir)  # a bad config or data file fails here, in one line, before any process starts
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with mp.Manager() as manager:
            box = manager.dict()
            mp.start_processes(
                _loopback_rank, args=(port, exp, data_dir, model_bytes, box), nprocs=2, start_method="spawn"
            )
            figures = dict(box)
        where, rank = "gloo, 2 local processes over loopback (launch under torchrun to measure your network)", 0
    if rank != 0:
        return None
    network = Network(
        figures["latency_s"],
        figures["bandwidth_Bps"],
        figures["step_s"],
        name=str(out),
        source=f"stlsgd calibrate: {where}",
    )
    write_profile(
        out, network, {"dataset": exp.data.dataset}, {**figures, "model_bytes": model_bytes, "communication": where}
    )
    return network
