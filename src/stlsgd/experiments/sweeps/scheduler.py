"""The main side of a sweep: runs in a process pool, de-duplication of identical configs, pruning bounds,
the results file, the choice of each row's best setting and its seed reruns.

``stlsgd sweep`` runs every setting (or, with ``search = "descent"``, the walk of :mod:`.search`) in worker
processes that each load the data once, a row's settings in bundles whose runs take turns a round at a time
(:func:`.worker.run_bundle`), appends each run's record to ``OUT/results.jsonl`` as soon as its bundle ends
(fsync'd: a crash loses only the bundles in flight, and a rerun skips every run already there, keyed by a hash
of the resolved config), keeps each run's files under ``OUT/runs/<key>/``, picks per label the setting with the fewest rounds to
target, reruns it with the extra seeds and writes ``OUT/best.json``. One sweep at a time writes into an ``OUT``
(a lock names the holder's pid).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from stlsgd import faults
from stlsgd.errors import StlsgdError
from stlsgd.experiments.sweeps.results import (
    BEST,
    RESULT_FIELDS,
    RESULTS,
    append_result,
    best_of,
    current_records,
    describe,
    make_record,
    read_results,
    write_best,
)
from stlsgd.experiments.sweeps.search import Descent
from stlsgd.experiments.sweeps.spec import RunSpec, Sweep, load_sweep, with_seed
from stlsgd.experiments.sweeps.worker import NO_BOUND, execute, init_worker
from stlsgd.files import LockedError, lock_directory

# Progress is logged at INFO (the CLI prints it on stdout); warnings at WARNING.
log = logging.getLogger(__name__)


# Most runs a bundle holds at once (each keeps its state in memory while the others take their turns).
BUNDLE_MAX = 128

Bundle = list[list[RunSpec]]  # runs (each: the specs of one distinct config) that take turns in one task


class LocalPool:
    """A process pool on this machine; the pruning bounds live in shared memory that workers read every round
    and lower as their runs reach the target."""

    def __init__(self, labels: int, out: Path, jobs: int, data_dir: str | None) -> None:
        ctx = mp.get_context("spawn")  # numba and torch are not fork-safe; workers start clean
        self.out = out
        self.bound = ctx.RawArray("q", labels)
        for i in range(labels):
            self.bound[i] = NO_BOUND
        self._args: dict[str, Any] = {
            "max_workers": jobs,
            "mp_context": ctx,
            "initializer": init_worker,
            "initargs": (self.bound, data_dir, jobs, os.getpid()),
        }
        self.executor = ProcessPoolExecutor(**self._args)
        self.generation = 0  # counts restarts: a run of an older, broken pool does not break the new one
        self.width = jobs  # bundles of one row that run side by side

    def lower(self, slot: int, rounds: int) -> None:
        self.bound[slot] = min(self.bound[slot], rounds)

    def submit(self, tasks: list[dict[str, Any]]) -> Future:
        """A bundle of runs (:func:`~stlsgd.experiments.sweeps.worker.run_bundle`); the future gives one item per task."""
        return self.executor.submit(execute, [{**t, "out": str(self.out / "runs" / t["key"])} for t in tasks])

    def collect(self, result: dict[str, Any], key: str) -> dict[str, Any]:
        return result["summary"]  # the worker wrote the run's files into OUT/runs/<key>/ itself

    def lost(self, exc: BaseException) -> bool:
        return isinstance(exc, BrokenProcessPool)

    def restart(self) -> None:
        """After a worker died every run of the pool fails with it: a fresh pool runs them again."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.executor = ProcessPoolExecutor(**self._args)
        self.generation += 1

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


class Scheduler:
    """Runs specs in a pool (local processes, or a Dask cluster), de-duplicating identical configs and keeping
    the pruning bounds."""

    def __init__(self, sweep: Sweep, out: Path, jobs: int, data_dir: str | None, quiet: bool, pool: Any = None) -> None:
        self.sweep, self.out, self.quiet = sweep, out, quiet
        self.records = read_results(out)  # every run on disk: a finished config is not redone
        self.current = current_records(sweep, self.records)  # what this sweep file chooses from and counts
        # A Dask pool is connected by run_sweep, before the output directory is touched.
        self.pool: Any = pool if pool is not None else LocalPool(len(sweep.labels), out, jobs, data_dir)
        for i, label in enumerate(sweep.labels):
            best = best_of(self.current, label) if sweep.prune else None
            if best is not None:
                self.pool.lower(i, best["rounds_to_target"])
        self.done_count = 0
        self.fault = faults.from_env()
        self.lost: dict[tuple[str, ...], int] = {}  # a bundle's keys -> times its worker process died under it

    def _done(self, spec: RunSpec) -> bool:
        return any(r["key"] == spec.key and r["label"] == spec.label and r["status"] != "failed" for r in self.records)

    def _keep(self, record: dict[str, Any]) -> None:
        record = append_result(self.out, record)
        self.records.append(record)
        self.current.append(record)
        if record["phase"] == "grid" and record["status"] == "reached" and self.sweep.prune:
            self.pool.lower(self.sweep.labels.index(record["label"]), record["rounds_to_target"])
        self.done_count += 1
        if self.fault is not None:  # $STLSGD_FAULT=die-after-record=N: a test's kill of this process
            self.fault.recorded(self.done_count)
        # best.json follows every result, so an interrupted sweep can still be reported (marked incomplete).
        write_best(self.out, self.sweep, self.current, complete=False)
        if not self.quiet:
            log.info("[%d] %s", self.done_count, describe(record))

    def run(self, specs: list[RunSpec], more: Callable[[set[str]], list[RunSpec]] | None = None) -> None:
        """Run ``specs``; with ``more``, also what ``more(busy)`` asks for whenever a row ends its runs (``busy``:
        the labels with runs still going), until it asks for nothing."""
        pending: dict[Future, tuple[Bundle, int]] = {}  # future -> its runs and the pool's generation
        self._start(specs, pending)
        self._feed(more, pending)
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                bundle, generation = pending.pop(fut)
                try:
                    results = fut.result()
                except Exception as exc:  # noqa: BLE001 -- a worker error is recorded; the sweep goes on
                    if self.pool.lost(exc):
                        self._resubmit(bundle, generation, pending)
                        continue
                    message = "".join(traceback.format_exception(exc))[-2000:]
                    results = [{"error": message}] * len(bundle)
                for group, result in zip(bundle, results):
                    summary, error = None, result.get("error")
                    if error is None:
                        summary = self.pool.collect(result, group[0].key)
                    for spec in group:
                        self._keep(make_record(spec, summary, error))
            self._feed(more, pending)

    def _resubmit(self, bundle: Bundle, generation: int, pending: dict[Future, tuple[Bundle, int]]) -> None:
        """A worker process died (killed, out of memory) under this bundle: its runs are run again; a bundle lost
        twice runs again one run at a time, and a run lost twice alone is recorded as failed. A process pool
        breaks as a whole: each of its bundles comes here and goes to one fresh pool."""
        if generation == self.pool.generation:
            self.pool.restart()
        keys = tuple(group[0].key for group in bundle)
        self.lost[keys] = self.lost.get(keys, 0) + 1
        if self.lost[keys] < 2:
            pending[self._submit(bundle)] = (bundle, self.pool.generation)
        elif len(bundle) > 1:
            for group in bundle:
                pending[self._submit([group])] = ([group], self.pool.generation)
        else:
            for spec in bundle[0]:
                self._keep(make_record(spec, None, "its worker process died twice (killed, or out of memory?)"))

    def _start(self, specs: list[RunSpec], pending: dict[Future, tuple[Bundle, int]]) -> None:
        """Submit the specs not already recorded, one run per distinct config, in bundles (:meth:`_bundles`)."""
        groups: dict[str, list[RunSpec]] = {}
        for spec in specs:
            if self._done(spec):
                continue
            prior = next(
                (r for r in self.records if r["key"] == spec.key and r["status"] not in ("failed", "pruned")), None
            )
            if prior is not None:  # the same config already ran under another label: reuse its result
                self._keep({**make_record(spec, None, None), **{k: prior.get(k) for k in RESULT_FIELDS}})
                continue
            groups.setdefault(spec.key, []).append(spec)
        for bundle in self._bundles(list(groups.values())):
            pending[self._submit(bundle)] = (bundle, self.pool.generation)

    def _bundles(self, groups: list[list[RunSpec]]) -> list[Bundle]:
        """The runs a row may prune, split into as many bundles as the pool runs side by side (every
        ``width``-th run, so that each holds the row's range of settings), at most BUNDLE_MAX runs each; every
        other run (seed reruns, a sweep without pruning) alone."""
        rows: dict[str, list[list[RunSpec]]] = {}
        alone: list[Bundle] = []
        for group in groups:
            if self._slots(group):
                rows.setdefault(group[0].label, []).append(group)
            else:
                alone.append([group])
        bundles: list[Bundle] = []
        for row in rows.values():
            n = max(min(len(row), max(1, self.pool.width)), -(-len(row) // BUNDLE_MAX))
            bundles.extend(row[j::n] for j in range(n))
        return bundles + alone

    def _feed(
        self, more: Callable[[set[str]], list[RunSpec]] | None, pending: dict[Future, tuple[Bundle, int]]
    ) -> None:
        # A row whose next runs are all recorded already (a resumed sweep) asks again at once.
        while more is not None:
            specs = more({s.label for bundle, _ in pending.values() for group in bundle for s in group})
            if not specs:
                return
            self._start(specs, pending)

    def _slots(self, group: list[RunSpec]) -> list[int]:
        # Seed reruns are the reported figures: never cut short. A config shared by several labels is
        # hopeless only once it is hopeless for all of them.
        if group[0].phase == "seed" or not self.sweep.prune:
            return []
        return sorted({self.sweep.labels.index(s.label) for s in group})

    def _submit(self, bundle: Bundle) -> Future:
        return self.pool.submit(
            [{"config": group[0].config, "key": group[0].key, "slots": self._slots(group)} for group in bundle]
        )

    def close(self) -> None:
        self.pool.close()


def run_sweep(
    config: str | Path,
    out: Path | None = None,
    *,
    jobs: int | None = None,
    data_dir: str | None = None,
    quiet: bool = False,
    only: list[str] | None = None,
    limit: int | None = None,
    cluster: str | None = None,
) -> dict[str, Any]:
    """Run (or continue) a sweep; returns the content written to ``OUT/best.json``.

    ``cluster`` runs it on Dask instead of a local process pool: ``tcp://HOST:PORT`` (a running ``dask
    scheduler``) or ``local:N`` (a ``LocalCluster`` of N one-thread worker processes); ``data_dir`` is then
    the data directory as the workers see it. This process alone writes ``OUT``."""
    if jobs is not None and jobs < 1:
        raise StlsgdError(f"--jobs: must be >= 1, got {jobs}")
    if limit is not None and limit < 1:
        raise StlsgdError(f"--limit: must be >= 1, got {limit}")
    if cluster is not None:
        from stlsgd.experiments.sweeps.cluster import check_cluster

        check_cluster(cluster)
    sweep = load_sweep(config, only=only, limit=limit)
    out = Path(out) if out is not None else Path("runs") / "sweeps" / sweep.name
    if out.exists() and not out.is_dir():
        raise StlsgdError(f"{out}: exists and is not a directory; choose another --out")
    pool = None
    if cluster is not None:  # an unreachable cluster is refused before anything is written
        from stlsgd.experiments.sweeps.cluster import DaskPool

        pool = DaskPool(cluster, len(sweep.labels), out, data_dir)
    try:
        return _locked(sweep, out, max(1, jobs or os.cpu_count() or 1), data_dir, quiet, pool)
    except BaseException:
        if pool is not None:
            pool.close()
        raise


def _locked(sweep: Sweep, out: Path, jobs: int, data_dir: str | None, quiet: bool, pool: Any) -> dict[str, Any]:
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = lock_directory(out)
    except LockedError as err:
        raise StlsgdError(
            f"{out}: another stlsgd sweep (pid {err.holder}) is writing here; wait for it to end "
            "or choose another --out"
        ) from None
    except OSError as err:
        raise StlsgdError(f"{out}: cannot write the sweep here ({err.strerror or err}); choose another --out") from None
    try:
        return _run(sweep, out, jobs, data_dir, quiet, pool)
    finally:
        os.close(lock)


def _run(sweep: Sweep, out: Path, jobs: int, data_dir: str | None, quiet: bool, pool: Any) -> dict[str, Any]:
    started = time.perf_counter()
    scheduler = Scheduler(sweep, out, jobs, data_dir, quiet, pool)
    try:
        if sweep.search == "descent":
            scheduler.run([], more=Descent(sweep, scheduler.current).next_runs)
        else:
            scheduler.run(sweep.grid)
        reruns: list[RunSpec] = []
        order = len(sweep.grid)
        for label in sweep.labels:
            best = best_of(scheduler.current, label)
            if best is None:
                continue
            spec = next(s for s in sweep.grid if s.key == best["key"] and s.label == label)
            for seed in sweep.seeds:
                if seed != spec.seed:
                    reruns.append(with_seed(spec, seed, order))
                    order += 1
        scheduler.run(reruns)
    finally:
        scheduler.close()
    best = write_best(out, sweep, scheduler.current, complete=True, wall_s=time.perf_counter() - started)
    if not quiet:
        for label, info in best["methods"].items():
            if info.get("median") is None:
                log.info("%s: did not reach the target (%s)", label, info["tried"])
            else:
                log.info(
                    "%s: median %s rounds (range %s-%s, %s/%d seeds) with %s",
                    label,
                    info["median"],
                    info["min"],
                    info["max"],
                    info["seeds_reached"],
                    len(sweep.seeds),
                    info["settings"],
                )
                if info["edges"]:
                    log.warning(
                        "%s: %s chosen at the edge of its grid's list: a longer list might choose better",
                        label,
                        ", ".join(f"{k}={info['settings'][k]}" for k in info["edges"]),
                    )
        log.info("sweep %s: %.1f s; results in %s/ (%s, %s, runs/)", sweep.name, best["wall_s"], out, RESULTS, BEST)
    return best
