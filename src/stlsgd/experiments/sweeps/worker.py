"""The worker side of a sweep: one process runs many settings; data, partition, problem and f* are built once.

Each run goes through :func:`stlsgd.experiments.runner.run_experiment` into ``OUT/runs/<key>/`` like any
other run. Pruning: a run whose round count passes the best rounds-to-target already finished for its row
can no longer win; it is stopped and recorded as ``pruned``. The bounds are a shared-memory array that the
main process lowers as results arrive and that the worker reads after every round.
"""

from __future__ import annotations

import ctypes
import json
import signal
import sys
from pathlib import Path
from typing import Any

from stlsgd.experiments.build import Built, build, with_plan
from stlsgd.experiments.config import Experiment
from stlsgd.threads import share_cores

NO_BOUND = 2**62  # "no finished run yet" in the shared pruning array

_BOUND: Any = None  # shared RawArray: best finished rounds-to-target per label index
_DATA_DIR: str | None = None
_BUILT: dict[str, Built] = {}


def init_worker(bound: Any, data_dir: str | None, jobs: int = 1) -> None:
    global _BOUND, _DATA_DIR
    _BOUND, _DATA_DIR = bound, data_dir
    share_cores(jobs)
    _die_with_parent()


def _die_with_parent() -> None:
    """Linux: the kernel ends this worker when the sweep's process dies (killed, not only interrupted), so no
    orphan goes on computing a run whose result nobody will record."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _built_for(exp: Experiment) -> Built:
    """The run's data, partition, problem and plan; the first three are cached per (data, problem) sections."""
    ident = json.dumps([exp.data.model_dump(mode="json"), exp.problem.model_dump(mode="json")], sort_keys=True)
    if ident not in _BUILT:
        _BUILT[ident] = build(exp, _DATA_DIR)
    return with_plan(exp, _BUILT[ident])


def execute(task: dict[str, Any]) -> dict[str, Any]:
    """Run one setting (in a worker) into ``task['out']``; returns its summary plus the number of samples."""
    from stlsgd.experiments.runner import run_experiment

    exp = Experiment.model_validate(task["config"])
    built = _built_for(exp)
    slots: list[int] = task["slots"]

    def on_round(st: Any, rnd: Any) -> str | None:
        # Only a strictly larger round count is hopeless: at the bound itself the run could still tie.
        if slots and st.round > max(_BOUND[i] for i in slots):
            return "pruned"
        return None

    summary = run_experiment(
        exp, Path(task["out"]), built=built, overwrite=True, progress=False, on_round=on_round, keep_params=False
    )
    assert summary is not None
    return {**summary, "num_samples": built.dataset.n}
