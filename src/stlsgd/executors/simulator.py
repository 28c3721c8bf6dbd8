"""The round loop: N clients stacked on one axis, stepped together, averaged, evaluated, stopped.

Runs a :class:`~stlsgd.algorithms.plan.Plan` round by round (Algorithm 1 inside each stage of Algorithms 2
and 3): local steps of every client in one batched call, one average, an evaluation of the averaged model
when due, and a stop on target, budget or divergence. Everything a checkpoint needs is in :class:`RunState`.

Where the clients live is a :class:`Topology`: the simulator holds them all and averages with a mean over
the client axis; the torch.distributed executor (:mod:`stlsgd.executors.distributed`) gives each rank a slice
and averages over the process group. The loop is the same for both.

Rounds of one step (k = 1: SyncSGD, LB-SGD, CR-PSGD) keep every client equal; when the problem can take
many such rounds in one call (:class:`FusedSyncSteps`) and one process holds every client, the simulator
takes runs of them at once, with no per-round work in Python.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from tqdm import tqdm

from stlsgd.algorithms.driver import DriverState, PlanDriver
from stlsgd.algorithms.plan import NO_FEEDBACK, Cursor, Feedback, Plan, Round
from stlsgd.executors.averaging import copy_state, is_finite, mean_over_clients, model_bytes
from stlsgd.executors.rules import (
    PLAIN,
    RoundRule,
    copy_of,
    drift_correction,
    outer_step,
    update_control,
    zeros_like,
)
from stlsgd.executors.sampling import Sampler
from stlsgd.problems.base import FusedSyncSteps, Problem, State

STATUSES = ("running", "reached", "budget", "diverged", "pruned")


@dataclass(frozen=True)
class StopRule:
    """When a run ends: target reached (gap <= target_gap or accuracy >= target_accuracy) or budget spent.

    ``max_iterations`` is a hard cap: a round that would cross it is cut at it (:mod:`stlsgd.algorithms.budget`).
    """

    target_gap: float | None = None
    target_accuracy: float | None = None
    max_iterations: int | None = None
    max_rounds: int | None = None
    eval_every: int = 1
    eval_every_iterations: int | None = None

    def spent(self, rounds: int, iterations: int) -> bool:
        return (self.max_iterations is not None and iterations >= self.max_iterations) or (
            self.max_rounds is not None and rounds >= self.max_rounds
        )

    def due(self, rounds: int, iterations: int, last_eval_iteration: int) -> bool:
        """Whether the averaged model is evaluated after this many rounds and iterations."""
        if rounds % self.eval_every == 0:
            return True
        every = self.eval_every_iterations
        if not every:
            return False
        return iterations // every > last_eval_iteration // every


@dataclass
class Sparse:
    """Opt-in (sweeps): skip a due evaluation when it provably cannot end the run, without changing any outcome.

    ``excludes(clients)`` must prove that evaluating the averaged model (row 0 of ``clients``) would find the
    stop rule unmet and the objective finite (e.g. :class:`stlsgd.problems.bounds.GapFloor`: gap proved above
    the target). Steps never read an evaluation (non-adaptive plans only), so every round, the round and
    iteration a run stops at, its status and its final model stay what evaluating at every due point gives; only
    ``metrics.jsonl`` has fewer lines. A due point at a multiple of ``keep_every`` rounds is evaluated anyway
    (a coarse curve; 0: none). The last skipped point is evaluated at the end of a run that ended without an
    evaluation after it (pruned, or diverged), so the run's last metrics are today's too.
    """

    excludes: Callable[[State], bool]
    keep_every: int = 0
    #: Evaluations skipped so far (the run's count once it has returned).
    skipped: int = 0


@dataclass
class RunState:
    """Everything needed to continue a run exactly: a checkpoint saves this and nothing else.

    ``cursor`` is the plan's position between rounds (a dict, as a checkpoint's JSON holds it, is taken too);
    ``objective`` the averaged model's objective at the last evaluation, which adaptive plans read as feedback.
    """

    clients: State
    sampler_state: dict[str, Any]
    cursor: Cursor = field(default_factory=Cursor)
    anchor: State | None = None
    #: Drift correction: each client's control variate c_i (stacked like the parameters) and their mean c.
    control: State | None = None
    control_mean: State | None = None
    #: The outer optimizer's momentum (one row), when the average takes an outer step.
    outer_momentum: State | None = None
    bytes: int = 0
    wall_s: float = 0.0
    #: Measured seconds in local steps and in averaging (communication on torch.distributed), cumulative.
    compute_s: float = 0.0
    comm_s: float = 0.0
    last_eval_iteration: int = 0
    status: str = "running"
    rounds_to_target: int | None = None
    iterations_to_target: int | None = None
    objective: float | None = None
    last: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.cursor, dict):
            self.cursor = Cursor.from_dict(self.cursor)

    @property
    def round(self) -> int:
        return self.cursor.index

    @property
    def iteration(self) -> int:
        return self.cursor.iteration

    @property
    def stage(self) -> int:
        return self.cursor.stage

    @property
    def client_steps(self) -> int:
        """Samples processed by each client so far (local steps times their mini-batch sizes)."""
        return self.cursor.samples


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
    gives each rank a contiguous slice of the client axis, averages over the process group, lets rank 0
    alone evaluate and record, and ``agree`` hands rank 0's stop verdict (status, counters, objective) to
    every rank, so all ranks leave the loop after the same round and see the same feedback.
    """

    clients: slice = field(default_factory=lambda: slice(None))
    is_root: bool = True
    average: Callable[[State], None] = mean_over_clients
    agree: Callable[[RunState, bool], bool] = _keep_verdict
    #: Every client's rows of a per-client state (for checkpoints); the simulator already holds them.
    gather: Callable[[State], State] = lambda state: state

    @property
    def holds_all(self) -> bool:
        """One process holds every client (the simulator): k = 1 rounds may then be fused."""
        return self.clients == slice(None)


LOCAL = Topology()


def init_run_state(problem: Problem, sampler: Sampler, num_clients: int, seed: int) -> RunState:
    return RunState(clients=problem.init_state(num_clients, seed), sampler_state=sampler.get_state())


@dataclass
class _Loop:
    """What every round of one run shares: the pieces passed in and the clock."""

    plan: Plan
    problem: Problem
    sampler: Sampler
    stop: StopRule
    topology: Topology
    fstar: float | None
    on_metrics: Callable[[dict[str, Any]], None] | None
    started: float
    num_clients: int
    rule: RoundRule
    sparse: Sparse | None = None
    #: The last evaluation skipped by ``sparse``: its metrics line (no evaluation yet) and its averaged model.
    pending: tuple[dict[str, Any], State] | None = None
    clock: Callable[[], float] = time.perf_counter

    def feedback(self, state: RunState) -> Feedback:
        return Feedback(objective=state.objective) if self.plan.adaptive else NO_FEEDBACK


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
    rule: RoundRule = PLAIN,
    sparse: Sparse | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> RunState:
    """Run ``plan`` from ``state`` until a stop rule fires; returns the final state (status set).

    ``state.clients`` holds the clients of ``topology.clients`` (all of them by default). ``on_round`` is
    called after every round, except inside a group of fused k = 1 rounds (see :func:`_groups`), where it sees
    the group's last round; groups end at every multiple of ``align`` rounds, so a caller that checkpoints
    every ``align`` rounds sees each of those rounds. ``sparse`` skips the evaluations it proves useless
    (:class:`Sparse`); it is ignored (every due point evaluated) for adaptive plans, which read the
    objective, for an accuracy target, and where this process does not hold every client. ``clock`` gives the
    run's wall time (``state.wall_s``, the metrics' ``wall_s``): a sweep's runs that take turns in one process
    count only their own turns."""
    if plan.adaptive or stop.target_accuracy is not None or not topology.holds_all:
        sparse = None
    sampler.set_state(state.sampler_state)
    loop = _Loop(
        plan,
        problem,
        sampler,
        stop,
        topology,
        fstar,
        on_metrics,
        clock() - state.wall_s,
        sampler.partition.num_clients,
        rule,
        sparse,
        clock=clock,
    )
    if rule.drift and state.control is None:
        zeros = {k: zeros_like(state.clients[k]) for k in problem.param_names}
        state.control, state.control_mean = zeros, {k: zeros_like(v[:1]) for k, v in zeros.items()}
    sent = model_bytes(state.clients) + (model_bytes(state.control) if state.control is not None else 0)
    per_round_bytes = 2 * loop.num_clients * sent
    # The fused kernel takes plain steps only; drift correction and outer steps act at every round's end.
    fuse = topology.holds_all and isinstance(problem, FusedSyncSteps) and rule == PLAIN
    bar = tqdm(
        total=stop.max_iterations,
        initial=state.iteration,
        unit="it",
        disable=None if progress else True,
        leave=False,
        dynamic_ncols=True,
    )
    rnd: Round | None = None
    try:
        for group, cursor in _groups(loop, state, fuse, align):
            if stop.spent(state.round, state.iteration):  # resumed, or started, with nothing left to do
                state.status = "budget"
                break
            rnd = group[-1]
            first = group[0]
            if first.new_anchor or (first.prox_gamma is not None and state.anchor is None):
                state.anchor = copy_state({k: v[:1] for k, v in state.clients.items()})
            prox = None if first.prox_gamma is None or state.anchor is None else (1.0 / first.prox_gamma, state.anchor)
            if len(group) > 1:
                lrs = np.concatenate([g.learning_rates() for g in group])
                started = time.perf_counter()
                fused = cast(FusedSyncSteps, problem)  # fuse is only on for such problems
                fused.sync_steps(state.clients, sampler.draw(len(group), rnd.batch), lrs, prox)
                state.compute_s += time.perf_counter() - started
            else:
                lrs = rnd.learning_rates()
                _local_round(loop, rnd, lrs, state, prox)
            state.cursor = cursor
            state.bytes += per_round_bytes * len(group)
            state.sampler_state = sampler.get_state()
            bar.update(rnd.end_iteration - first.start_iteration)
            finished = _evaluate_if_due(loop, rnd, float(lrs[-1]), state)
            if on_round is not None:
                verdict = on_round(state, rnd)
                if verdict and not finished:
                    state.status, finished = verdict, True
            if finished:
                break
    finally:
        bar.close()
    if loop.pending is not None and loop.pending[0]["round"] > state.last.get("round", -1):
        # The run ended (pruned, diverged) after a skipped evaluation and before another: evaluating every
        # due point would have made that one its last metrics line.
        _evaluate(loop, state, *loop.pending)
        if loop.sparse is not None:
            loop.sparse.skipped -= 1
    if topology.is_root and state.status == "budget" and state.last.get("round") != state.round:
        # The budget ended the run between evaluations: record the final model once more.
        last = rnd or plan.next_round(state.cursor, loop.feedback(state))
        _record(loop, last, float(last.learning_rates()[-1]), state)
    state.wall_s = loop.clock() - loop.started
    return state


def _local_round(loop: _Loop, rnd: Round, lrs: np.ndarray, state: RunState, prox: tuple[float, State] | None) -> None:
    rule, params = loop.rule, loop.problem.param_names
    # Clients are equal at a round's start: one row is the model x_start the round started from.
    start = copy_state({k: state.clients[k][:1] for k in params}) if rule.drift or rule.outer else None
    drift = None
    if state.control is not None and state.control_mean is not None:
        drift = dict(
            zip(params, drift_correction([state.control[k] for k in params], [state.control_mean[k] for k in params]))
        )
    # Late STL-SGD stages have rounds of 10^5-10^7 local steps: draw and step them in slices so the sample
    # matrix stays small. The generator fills draws in order, so slicing changes no sample. With a drift window
    # a slice also ends where the window does, for the clients' models there (the control variates' y_i).
    chunk = max(1, SAMPLES_PER_CHUNK // (loop.num_clients * rnd.batch))
    window = rule.control_steps(rnd.steps)
    ends = sorted({*range(chunk, rnd.steps, chunk), window, rnd.steps} - {0})
    at_window: State | None = None
    started = time.perf_counter()
    first = 0
    for end in ends:
        rows = loop.sampler.draw(end - first, rnd.batch)[:, loop.topology.clients]
        if drift is None:
            loop.problem.local_steps(state.clients, rows, lrs[first:end], prox)
        else:
            loop.problem.local_steps(state.clients, rows, lrs[first:end], prox, drift)
        if end == window < rnd.steps and drift is not None:
            at_window = copy_state({k: state.clients[k] for k in params})
        first = end
    averaging = time.perf_counter()
    state.compute_s += averaging - started
    if state.control is not None and start is not None and drift is not None:
        ended = state.clients if at_window is None else at_window
        update_control(
            [state.control[k] for k in params],
            [start[k] for k in params],
            [ended[k] for k in params],
            [drift[k] for k in params],
            float(np.add.reduce(lrs[:window])),
        )
        mean = copy_state(state.control)
        loop.topology.average(mean)  # the control variates travel with the model
        state.control_mean = {k: v[:1] for k, v in mean.items()}
    loop.topology.average(state.clients)
    if rule.outer is not None and start is not None:
        new = [copy_of(state.clients[k][:1]) for k in params]
        momentum = None if state.outer_momentum is None else [state.outer_momentum[k] for k in params]
        state.outer_momentum = dict(zip(params, outer_step(rule.outer, [start[k] for k in params], new, momentum)))
        for k, value in zip(params, new):
            state.clients[k][...] = value
    state.comm_s += time.perf_counter() - averaging


def _groups(loop: _Loop, state: RunState, fuse: bool, align: int | None) -> Iterator[tuple[list[Round], Cursor]]:
    """The rounds, one by one, each with the plan's cursor after it -- or, when ``fuse``, runs of one-step
    rounds (k = 1: SyncSGD, LB-SGD, CR-PSGD) that one ``problem.sync_steps`` call can take at once, since an
    average after every step keeps all clients equal. A group ends where the loop must look at the state:
    an evaluation, the budget, a multiple of ``align`` (checkpoints), a change of batch or proximal term, or
    SAMPLES_PER_CHUNK samples. Each round is settled by the plan driver with the feedback of the moment.
    """
    stop = loop.stop
    driver = PlanDriver(loop.plan, DriverState(cursor=state.cursor), max_iterations=stop.max_iterations)
    while True:
        feedback = loop.feedback(state)
        rnd = driver.take(feedback)
        group = [rnd]
        if fuse and rnd.steps == 1:
            limit = max(1, SAMPLES_PER_CHUNK // (loop.num_clients * rnd.batch))
            while len(group) < limit and not _boundary(stop, group[-1], state.last_eval_iteration, align):
                nxt = driver.peek(feedback)
                if nxt.steps != 1 or nxt.batch != rnd.batch or nxt.prox_gamma != rnd.prox_gamma or nxt.new_anchor:
                    break
                group.append(driver.take(feedback))
        yield group, driver.cursor


def _boundary(stop: StopRule, rnd: Round, last_eval_iteration: int, align: int | None) -> bool:
    """Whether the state after ``rnd`` must be seen: it may be evaluated, end the run or be checkpointed."""
    rounds, iterations = rnd.index + 1, rnd.end_iteration
    return (
        stop.due(rounds, iterations, last_eval_iteration)
        or stop.spent(rounds, iterations)
        or bool(align and rounds % align == 0)
    )


def _evaluate_if_due(loop: _Loop, rnd: Round, lr: float, state: RunState) -> bool:
    stop = loop.stop
    budget_next = stop.spent(state.round, state.iteration)
    # Averaged models are identical on every rank, so every rank reaches this test in the same rounds.
    diverged = not is_finite(state.clients)
    if not (diverged or budget_next or stop.due(state.round, state.iteration, state.last_eval_iteration)):
        return False
    if not (diverged or budget_next) and _skip(loop, rnd, lr, state):
        return False
    finished = _verdict(loop, rnd, lr, state, diverged, budget_next) if loop.topology.is_root else False
    return loop.topology.agree(state, finished)


def _verdict(loop: _Loop, rnd: Round, lr: float, state: RunState, diverged: bool, budget_next: bool) -> bool:
    stop = loop.stop
    if diverged:
        state.status = "diverged"  # the last finite metrics stay in state.last
        return True
    metrics = _record(loop, rnd, lr, state)
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


def _skip(loop: _Loop, rnd: Round, lr: float, state: RunState) -> bool:
    """Whether this due evaluation is skipped (:class:`Sparse`); if so it counts as done for the schedule."""
    sparse = loop.sparse
    if sparse is None or (sparse.keep_every and state.round % sparse.keep_every == 0):
        return False
    if not sparse.excludes(state.clients):
        return False
    # Due points by iteration count from the last evaluation: a skipped one moves that mark as an evaluation would.
    state.last_eval_iteration = state.iteration
    sparse.skipped += 1
    loop.pending = (_line(loop, rnd, lr, state), copy_state({k: v[:1] for k, v in state.clients.items()}))
    return True


def _line(loop: _Loop, rnd: Round, lr: float, state: RunState) -> dict[str, Any]:
    """The metrics line of the state as it is now, its evaluation (objective, gap, accuracy) left to fill."""
    return {
        "round": state.round,
        "iteration": state.iteration,
        "stage": rnd.stage,
        "lr": lr,
        "period": rnd.steps,  # the round's actual length (a stage's last round, or one cut at the budget)
        "batch": rnd.batch,
        "objective": None,
        "gap": None,
        "accuracy": None,
        "client_steps": state.client_steps,
        "epochs": state.client_steps * loop.num_clients / loop.problem.num_samples,
        "bytes": state.bytes,
        "bytes_per_client": state.bytes // (2 * loop.num_clients),
        "compute_s": round(state.compute_s, 6),
        "comm_s": round(state.comm_s, 6),
        "wall_s": round(loop.clock() - loop.started, 6),
    }


def _record(loop: _Loop, rnd: Round, lr: float, state: RunState) -> dict[str, Any]:
    """Evaluate the averaged model and pass one metrics line on (finite ones only)."""
    state.last_eval_iteration = state.iteration
    return _evaluate(loop, state, _line(loop, rnd, lr, state), state.clients)


def _evaluate(loop: _Loop, state: RunState, metrics: dict[str, Any], params: State) -> dict[str, Any]:
    """Fill ``metrics`` with the evaluation of ``params`` (row 0) and pass it on if finite."""
    ev = loop.problem.evaluate(params)
    metrics["objective"] = ev.objective
    metrics["gap"] = None if loop.fstar is None else ev.objective - loop.fstar
    metrics["accuracy"] = ev.accuracy
    if math.isfinite(ev.objective):
        state.last = metrics
        state.objective = ev.objective
        if loop.on_metrics is not None:
            loop.on_metrics(metrics)
    return metrics
