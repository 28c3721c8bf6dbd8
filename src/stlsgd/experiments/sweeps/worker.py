"""The worker side of a sweep: one process runs many settings; data, partition, problem and f* are built once.

Each run goes through :func:`stlsgd.experiments.runner.run_experiment` into its own directory like any
other run. Pruning: a run that has used as many rounds as the best rounds-to-target already finished for its
row, and goes on, can no longer win; it is stopped and recorded as ``pruned``. Where the bounds come from is the pool's
business: a shared-memory array that the main process lowers as results arrive (the local process pool,
:func:`init_worker`), or a snapshot sent with the task and refreshed from the cluster (Dask,
:mod:`.cluster`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stlsgd import faults
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


def run_task(task: dict[str, Any], out: Path, data_dir: str | None, bound: Bounds) -> dict[str, Any]:
    """Run one setting into ``out``; returns its summary plus the number of samples.

    ``bound(slots)`` gives the pruning bound of the run's label slots (called after every round). A sweep's run
    skips the evaluations proved unable to end it (sparse ``metrics.jsonl``); ``task["every_evaluation"]`` (a
    replay, for the report's curves) evaluates every due point."""
    from stlsgd.experiments.runner import run_experiment

    exp = Experiment.model_validate(task["config"])
    built = _built_for(exp, data_dir)
    slots: list[int] = task["slots"]

    def on_round(st: Any, rnd: Any) -> str | None:
        # Called after the round's due evaluation and stopping test: a run still going at the bound's round did
        # not reach the target by then (a skipped evaluation is proved above it), so it can no longer even tie.
        if slots and st.round >= bound(slots):
            return "pruned"
        return None

    sparse = None if task.get("every_evaluation") else KEEP_EVERY
    summary = run_experiment(
        exp, out, built=built, overwrite=True, progress=False, on_round=on_round, sparse_eval=sparse
    )
    assert summary is not None
    return {**summary, "num_samples": built.dataset.n}


def execute(task: dict[str, Any]) -> dict[str, Any]:
    """Run one setting in a process-pool worker into ``task['out']`` (bounds from the shared array)."""
    return run_task(task, Path(task["out"]), _DATA_DIR, lambda slots: max(_BOUND[i] for i in slots))
