"""Hyper-parameter sweeps with the paper's tuning protocol (Section 5): grids per method, pruning, seeds.

- :mod:`.spec`: the sweep file and its expansion into validated runs;
- :mod:`.worker`: one run in a worker process (data built once per worker, pruning, dying with the sweep);
- :mod:`.scheduler`: the process pool, de-duplication, bounds, seed reruns (:func:`run_sweep`);
- :mod:`.search`: the walk through each row's grid that ``search = "descent"`` runs instead of all of it;
- :mod:`.cluster`: the same runs on a Dask cluster (``--cluster tcp://HOST:PORT`` or ``local:N``);
- :mod:`.results`: ``results.jsonl`` (foreign lines skipped), the choice of the best setting and ``best.json``.
- :mod:`.replay`: the runs an archived sweep's figures draw, rerun from ``results.jsonl`` and ``best.json``.
"""

from stlsgd.experiments.sweeps.results import (
    BEST,
    RESULTS,
    best_of,
    current_records,
    read_results,
    summarize_best,
    write_best,
)
from stlsgd.experiments.sweeps.scheduler import run_sweep
from stlsgd.experiments.sweeps.spec import RunSpec, Sweep, config_key, load_sweep

__all__ = [
    "BEST",
    "RESULTS",
    "RunSpec",
    "Sweep",
    "best_of",
    "config_key",
    "current_records",
    "load_sweep",
    "read_results",
    "run_sweep",
    "summarize_best",
    "write_best",
]
