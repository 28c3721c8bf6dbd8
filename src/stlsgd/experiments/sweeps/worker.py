"""The worker side of a sweep: one process runs many settings; data, partition, problem and f* are built once.

Each run goes through :func:`stlsgd.experiments.runner.run_experiment` into its own directory like any
other run. Pruning: a run that has used as many rounds as the best rounds-to-target already finished for its
row, and goes on, can no longer win; it is stopped and recorded as ``pruned``. Where the bounds come from is the pool's
business: a shared-memory array that the main process and the workers lower as runs reach the target (the local
process pool, :func:`init_worker`), or a snapshot sent with the task and refreshed from the cluster (Dask,
:mod:`.cluster`).

A task is a *bundle* of settings of one row (:func:`run_bundle`): its runs take turns a round at a time, the one
with the fewest rounds going next, so when one reaches the target at round t every other is at round t at most
and stops there (or at its own end) -- the least any order of runs could spend -- where runs one after another
go on to the best round finished before them. Turns change no run: each draws from its own generator and steps
its own state; only the order in which the rounds of different runs are computed changes.
"""

from __future__ import annotations

import ctypes
import heapq
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stlsgd import faults
from stlsgd.errors import StlsgdError
from stlsgd.experiments.build import Built, build, with_plan
from stlsgd.experiments.config import Experiment
from stlsgd.threads import share_cores

NO_BOUND = 2**62  # "no finished run yet" in the pruning bounds

# Sweep runs skip the evaluations proved unable to end them (same outcomes, docs/sweeps.md) and keep every
# KEEP_EVERY-th evaluation point in metrics.jsonl, a coarse curve for the report's figures.
KEEP_EVERY = 20

_BOUND: Any = None  # shared RawArray: best finished rounds-to-target per label index
_DATA_DIR: str | None = None
_BUILT: dict[tuple[str, str | None], Built] = {}

Bounds = Callable[[list[int]], int]  # the largest pruning bound among a run's label slots
Lower = Callable[[list[int], int], None]  # a run of these label slots reached the target at this round


def init_worker(bound: Any, data_dir: str | None, jobs: int = 1, parent: int | None = None) -> None:
    global _BOUND, _DATA_DIR
    _BOUND, _DATA_DIR = bound, data_dir
    fault = faults.from_env()
    if fault is not None:  # $STLSGD_FAULT=die-at=worker-start: a test's kill at this instant
        fault.worker_started()
    _die_with_parent(parent)
    share_cores(jobs)


def _die_with_parent(parent: int | None) -> None:
    """Linux: the kernel ends this worker when the sweep's process dies (killed, not only interrupted), so no
    orphan goes on computing -- or waits forever for a run -- whose result nobody will record.

    The request only covers a parent alive when it is made: a sweep killed while this worker was still
    starting (spawn imports take seconds) has already handed it to init. So after asking, the worker checks
    that ``parent`` is still its parent, and a watchdog thread keeps checking (other systems, and the rare
    case where the kernel's signal does not come)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent is None:
        return
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while not _STOP_WATCH.wait(1.0):
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="stlsgd-parent-watchdog", daemon=True).start()


_STOP_WATCH = threading.Event()


def _built_for(exp: Experiment, data_dir: str | None) -> Built:
    """The run's data, partition, problem and plan; the first three are cached per (data, problem) sections."""
    ident = json.dumps([exp.data.model_dump(mode="json"), exp.problem.model_dump(mode="json")], sort_keys=True)
    if (ident, data_dir) not in _BUILT:
        _BUILT[ident, data_dir] = build(exp, data_dir)
    return with_plan(exp, _BUILT[ident, data_dir])


def run_task(
    task: dict[str, Any],
    out: Path,
    data_dir: str | None,
    bound: Bounds,
    *,
    reached: Lower | None = None,
    turn: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Run one setting into ``out``; returns its summary plus the number of samples.

    ``bound(slots)`` gives the pruning bound of the run's label slots (called after every round). A sweep's run
    skips the evaluations proved unable to end it (sparse ``metrics.jsonl``); ``task["every_evaluation"]`` (a
    replay, for the report's curves) evaluates every due point. In a bundle, ``reached(slots, rounds)`` hears of
    the run reaching the target, ``turn(round)`` is called after every round the run goes on from (it returns at
    the run's next turn) and ``clock`` counts the run's own turns only."""
    from stlsgd.experiments.runner import run_experiment

    exp = Experiment.model_validate(task["config"])
    built = _built_for(exp, data_dir)
    slots: list[int] = task["slots"]

    def on_round(st: Any, rnd: Any) -> str | None:
        # Called after the round's due evaluation and stopping test: a run still going at the bound's round did
        # not reach the target by then (a skipped evaluation is proved above it), so it can no longer even tie.
        if st.status == "reached":
            if slots and reached is not None:
                reached(slots, st.rounds_to_target)
            return None
        if slots and st.round >= bound(slots):
            return "pruned"
        if turn is not None and st.status == "running":
            turn(st.round)
            # While the others took their turns, one of them may have reached the target at this round.
            if slots and st.round >= bound(slots):
                return "pruned"
        return None

    sparse = None if task.get("every_evaluation") else KEEP_EVERY
    summary = run_experiment(
        exp, out, built=built, overwrite=True, progress=False, on_round=on_round, sparse_eval=sparse, clock=clock
    )
    assert summary is not None
    return {**summary, "num_samples": built.dataset.n}


class _Turns:
    """Whose turn it is among a bundle's runs: the one with the fewest rounds (then the first in the bundle).

    Each run waits on its own event, so a turn wakes one thread, not all of them. ``waited[i]`` is the time run
    i spent waiting, which its clock leaves out."""

    def __init__(self, n: int) -> None:
        self.events = [threading.Event() for _ in range(n)]
        self.queue = [(0, i) for i in range(n)]  # (rounds done, index) of the runs waiting for a turn
        self.lock = threading.Lock()
        self.waited = [0.0] * n

    def _next(self) -> None:
        if self.queue:
            self.events[heapq.heappop(self.queue)[1]].set()

    def start(self) -> None:
        with self.lock:
            self._next()

    def wait(self, i: int) -> None:
        began = time.perf_counter()
        self.events[i].wait()
        self.events[i].clear()
        self.waited[i] += time.perf_counter() - began

    def pass_on(self, i: int, rounds: int) -> None:
        with self.lock:
            heapq.heappush(self.queue, (rounds, i))
            self._next()
        self.wait(i)

    def leave(self) -> None:
        with self.lock:
            self._next()

    def clock(self, i: int) -> Callable[[], float]:
        return lambda: time.perf_counter() - self.waited[i]


def run_bundle(
    tasks: list[dict[str, Any]], outs: list[Path], data_dir: str | None, bound: Bounds, lower: Lower | None = None
) -> list[dict[str, Any]]:
    """Run a bundle of settings in turns (module docstring); returns, per task, ``{"summary": ...}`` or
    ``{"error": message, "input_error": bool}`` (a run's own bad input, or anything else it raised).

    ``bound([slot])`` is a label slot's pruning bound as the pool knows it; the bundle's own runs that reach the
    target lower it here at once, and through ``lower`` for the pool's other workers."""
    n = len(tasks)
    own: dict[int, int] = {}  # label slot -> fewest rounds to target of this bundle's runs

    def bound_of(slots: list[int]) -> int:
        return max(min(bound([i]), own.get(i, NO_BOUND)) for i in slots)

    def reached(slots: list[int], rounds: int) -> None:
        for i in slots:
            own[i] = min(own.get(i, NO_BOUND), rounds)
        if lower is not None:
            lower(slots, rounds)

    # What a run that ends without either (a BaseException in its thread) leaves in its place.
    results: list[dict[str, Any]] = [{"error": "the run ended without a result", "input_error": False}] * n
    turns = _Turns(n)

    def one(i: int) -> None:
        turns.wait(i)
        try:
            summary = run_task(
                tasks[i],
                outs[i],
                data_dir,
                bound_of,
                reached=reached,
                turn=None if n == 1 else lambda rounds: turns.pass_on(i, rounds),
                clock=turns.clock(i),
            )
            results[i] = {"summary": summary}
        except StlsgdError as exc:  # the run's own input error: one line, recorded
            results[i] = {"error": str(exc), "input_error": True}
        except Exception as exc:  # noqa: BLE001 -- recorded; the bundle's other runs go on
            results[i] = {"error": "".join(traceback.format_exception(exc))[-2000:], "input_error": False}
        finally:
            turns.leave()

    threads = [threading.Thread(target=one, args=(i,), name=f"stlsgd-run-{i}", daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    turns.start()
    for thread in threads:
        thread.join()
    return results


def execute(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run a bundle in a process-pool worker, each run into its ``task['out']`` (bounds in the shared array)."""
    return run_bundle(
        tasks, [Path(t["out"]) for t in tasks], _DATA_DIR, lambda slots: max(_BOUND[i] for i in slots), _lower
    )


def _lower(slots: list[int], rounds: int) -> None:
    # Unlocked: a write lost to a race leaves a bound higher than it could be, which only prunes later.
    for i in slots:
        if rounds < _BOUND[i]:
            _BOUND[i] = rounds
