"""The research executor: N clients stacked on one axis, stepped together, averaged by a mean.

Runs a :class:`~stlsgd.algorithms.plan.Plan` round by round (Algorithm 1 inside each stage of Algorithms 2
and 3): local steps of every client in one batched call, one average, an evaluation of the averaged model
when due, and a stop on target, budget or divergence. Everything a checkpoint needs is in :class:`RunState`.
Rounds of one step (k = 1: SyncSGD, LB-SGD, CR-PSGD) keep every client equal, so when the problem offers
``sync_steps`` the simulator takes runs of them in one call, with no per-round work in Python.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from stlsgd.algorithms.plan import Plan, Round
from stlsgd.executors.averaging import copy_state, is_finite, mean_over_clients, model_bytes
from stlsgd.executors.sampling import Sampler
from stlsgd.problems.base import Problem, State


@dataclass(frozen=True)
class StopRule:
    """When a run ends: target reached (gap <= target_gap or accuracy >= target_accuracy) or budget spent."""

    target_gap: float | None = None
    target_accuracy: float | None = None
    max_iterations: int | None = None
    max_rounds: int | None = None
    eval_every: int = 1
    eval_every_iterations: int | None = None


@dataclass
class RunState:
    """Everything needed to continue a run exactly: a checkpoint saves this and nothing else."""

    clients: State
    sampler_state: dict[str, Any]
    round: int = 0
    iteration: int = 0
    stage: int = 1
    anchor: State | None = None
    bytes: int = 0
    wall_s: float = 0.0
    last_eval_iteration: int = 0
    status: str = "running"
    rounds_to_target: int | None = None
    iterations_to_target: int | None = None
    last: dict[str, Any] = field(default_factory=dict)


# Sample ids drawn at once (8 MiB of int64): bounds memory whatever a round's length.
SAMPLES_PER_CHUNK = 1 << 20

# An on_round callback may return a status string (e.g. "pruned") to end the run there; None goes on.
Callback = Callable[[RunState, Round], "str | None"]


def _keep_verdict(state: RunState, finished: bool) -> bool:
    return finished


@dataclass(frozen=True)
class Topology:
    """Where the clients live: which of them this process steps, how they are averaged, who evaluates.

    The simulator's default holds every client and averages with a mean; the torch.distributed executor
    (:mod:`stlsgd.executors.distributed`) gives each rank a contiguous slice of the client axis, averages
    with one all-reduce, lets rank 0 alone evaluate and record, and ``agree`` hands rank 0's stop verdict
    (and status) to every rank, so all ranks leave the loop after the same round.
    """

    clients: slice = field(default_factory=lambda: slice(None))
    is_root: bool = True
    average: Callable[[State], None] = mean_over_clients
    agree: Callable[[RunState, bool], bool] = _keep_verdict


LOCAL = Topology()


def init_run_state(problem: Problem, sampler: Sampler, num_clients: int, seed: int) -> RunState:
    return RunState(clients=problem.init_state(num_clients, seed), sampler_state=sampler.get_state())


def _budget_spent(stop: StopRule, rounds: int, iterations: int) -> bool:
    return (stop.max_iterations is not None and iterations >= stop.max_iterations) or (
        stop.max_rounds is not None and rounds >= stop.max_rounds)


def _due(stop: StopRule, rounds: int, iterations: int, last_eval_iteration: int) -> bool:
    if rounds % stop.eval_every == 0:
        return True
    every = stop.eval_every_iterations
    return bool(every) and iterations // every > last_eval_iteration // every


def run(
    plan: Plan,
    problem: Problem,
    sampler: Sampler,
    stop: StopRule,
    state: RunState,
    *,
    fstar: float | None = None,
    on_metrics: Callable[[dict[str, Any]], None] | None = None,
    on_round: Callback | None = None,
    progress: bool = True,
    topology: Topology = LOCAL,
    align: int | None = None,
) -> RunState:
    """Run ``plan`` from ``state`` until a stop rule fires; returns the final state (status set).

    ``state.clients`` holds the clients of ``topology.clients`` (all of them by default). ``on_round`` is
    called after every round, except inside a group of fused k = 1 rounds (see :func:`_groups`), where it sees
    the group's last round; groups end at every multiple of ``align`` rounds, so a caller that checkpoints
    every ``align`` rounds sees each of those rounds."""
    sampler.set_state(state.sampler_state)
    n_clients = sampler.partition.num_clients
    per_round_bytes = 2 * n_clients * model_bytes(state.clients)
    bar = tqdm(total=stop.max_iterations, initial=state.iteration, unit="it", disable=None if progress else True,
               leave=False, dynamic_ncols=True)
    started = time.perf_counter() - state.wall_s
    fuse = topology is LOCAL and hasattr(problem, "sync_steps")
    try:
        for group in _groups(plan.rounds(start=state.round), stop, state, n_clients if fuse else 0, align):
            rnd = group[-1]
            if _budget_spent(stop, state.round, state.iteration):  # resumed, or started, with nothing left to do
                state.status = "budget"
                break
            first = group[0]
            if first.new_anchor or (first.prox_gamma is not None and state.anchor is None):
                state.anchor = copy_state({k: v[:1] for k, v in state.clients.items()})
            prox = None if first.prox_gamma is None else (1.0 / first.prox_gamma, state.anchor)
            if len(group) > 1:
                lrs = np.concatenate([g.learning_rates() for g in group])
                problem.sync_steps(state.clients, sampler.draw(len(group), rnd.batch), lrs, prox)
            else:
                lrs = rnd.learning_rates()
                _local_round(rnd, lrs, problem, sampler, state, prox, n_clients, topology)
            state.round = rnd.index + 1
            state.iteration = rnd.end_iteration
            state.stage = rnd.stage
            state.bytes += per_round_bytes * len(group)
            state.sampler_state = sampler.get_state()
            bar.update(rnd.end_iteration - first.start_iteration)
            finished = _evaluate_if_due(rnd, lrs, problem, stop, state, fstar, started, on_metrics, topology)
            if on_round is not None:
                verdict = on_round(state, rnd)
                if verdict and not finished:
                    state.status, finished = verdict, True
            if finished:
                break
        else:  # pragma: no cover - plans are endless
            state.status = "budget"
    finally:
        bar.close()
    if topology.is_root and state.status == "budget" and state.last.get("round") != state.round:
        _record(rnd, rnd.learning_rates(), problem, state, fstar, started, on_metrics)
    state.wall_s = time.perf_counter() - started
    return state


def _local_round(rnd, lrs, problem, sampler, state, prox, n_clients, topology) -> None:
    # Late STL-SGD stages have rounds of 10^5-10^7 local steps: draw and step them in slices so the sample
    # matrix stays small. The generator fills draws in order, so slicing changes no sample.
    chunk = max(1, SAMPLES_PER_CHUNK // (n_clients * rnd.batch))
    for first in range(0, rnd.steps, chunk):
        steps = min(chunk, rnd.steps - first)
        rows = sampler.draw(steps, rnd.batch)[:, topology.clients]
        problem.local_steps(state.clients, rows, lrs[first : first + steps], prox)
    topology.average(state.clients)


def _groups(rounds: Iterator[Round], stop: StopRule, state: RunState, fuse_clients: int, align: int | None
            ) -> Iterator[list[Round]]:
    """The rounds, one by one -- or, when ``fuse_clients`` (the number of clients) is not 0, runs of one-step
    rounds (k = 1: SyncSGD, LB-SGD, CR-PSGD) that one ``problem.sync_steps`` call can take at once, since an
    average after every step keeps all clients equal. A group ends where the executor must look at the state:
    an evaluation, the budget, a multiple of ``align`` (checkpoints), a change of batch or proximal term, or
    SAMPLES_PER_CHUNK samples.
    """
    pending: Round | None = None
    while True:
        rnd = pending if pending is not None else next(rounds)
        pending = None
        group = [rnd]
        if fuse_clients and rnd.steps == 1:
            limit = max(1, SAMPLES_PER_CHUNK // (fuse_clients * rnd.batch))
            while len(group) < limit and not _boundary(stop, group[-1], state.last_eval_iteration, align):
                nxt = next(rounds)
                if nxt.steps != 1 or nxt.batch != rnd.batch or nxt.prox_gamma != rnd.prox_gamma or nxt.new_anchor:
                    pending = nxt
                    break
                group.append(nxt)
        yield group


def _boundary(stop: StopRule, rnd: Round, last_eval_iteration: int, align: int | None) -> bool:
    """Whether the state after ``rnd`` must be seen: it may be evaluated, end the run or be checkpointed."""
    rounds, iterations = rnd.index + 1, rnd.end_iteration
    return (_due(stop, rounds, iterations, last_eval_iteration) or _budget_spent(stop, rounds, iterations)
            or bool(align and rounds % align == 0))


def _evaluate_if_due(rnd, lrs, problem, stop, state, fstar, started, on_metrics, topology=LOCAL) -> bool:
    budget_next = _budget_spent(stop, state.round, state.iteration)
    # Averaged models are identical on every rank, so every rank reaches this test in the same rounds.
    diverged = not is_finite(state.clients)
    if not (diverged or budget_next or _due(stop, state.round, state.iteration, state.last_eval_iteration)):
        return False
    finished = _verdict(rnd, lrs, problem, stop, state, fstar, started, on_metrics, diverged, budget_next) \
        if topology.is_root else False
    return topology.agree(state, finished)


def _verdict(rnd, lrs, problem, stop, state, fstar, started, on_metrics, diverged, budget_next) -> bool:
    if diverged:
        state.status = "diverged"  # the last finite metrics stay in state.last
        return True
    metrics = _record(rnd, lrs, problem, state, fstar, started, on_metrics)
    if not math.isfinite(metrics["objective"]):
        state.status = "diverged"
        return True
    gap = metrics["gap"]
    if (stop.target_gap is not None and gap is not None and gap <= stop.target_gap) or (
        stop.target_accuracy is not None and metrics["accuracy"] >= stop.target_accuracy
    ):
        state.status = "reached"
        state.rounds_to_target, state.iterations_to_target = state.round, state.iteration
        return True
    if budget_next:
        state.status = "budget"
        return True
    return False


def _record(rnd, lrs, problem, state, fstar, started, on_metrics) -> dict[str, Any]:
    ev = problem.evaluate(state.clients)
    metrics = {
        "round": state.round,
        "iteration": state.iteration,
        "stage": rnd.stage,
        "lr": float(lrs[-1]),
        "period": rnd.period,
        "batch": rnd.batch,
        "objective": ev.objective,
        "gap": None if fstar is None else ev.objective - fstar,
        "accuracy": ev.accuracy,
        "bytes": state.bytes,
        "wall_s": round(time.perf_counter() - started, 6),
    }
    state.last_eval_iteration = state.iteration
    if math.isfinite(ev.objective):
        state.last = metrics
        if on_metrics is not None:
            on_metrics(metrics)
    return metrics
