"""The main side of a sweep: runs in a process pool, de-duplication of identical configs, pruning bounds,
the results file, the choice of each row's best setting and its seed reruns.

``stlsgd sweep`` runs every setting (or, with ``search = "descent"``, the walk of :mod:`.search`) in worker
processes that each load the data once, appends each run's record to ``OUT/results.jsonl`` as soon as it ends
(fsync'd: a crash loses nothing, and a rerun skips every run already there, keyed by a hash of the resolved
config), keeps each run's files under ``OUT/runs/<key>/``, picks per label the setting with the fewest rounds to
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


class LocalPool:
    """A process pool on this machine; the pruning bounds live in shared memory that workers read every round."""

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

    def lower(self, slot: int, rounds: int) -> None:
        self.bound[slot] = min(self.bound[slot], rounds)

    def submit(self, task: dict[str, Any]) -> Future:
        return self.executor.submit(execute, {**task, "out": str(self.out / "runs" / task["key"])})

    def collect(self, result: dict[str, Any], key: str) -> dict[str, Any]:
        return result  # the worker wrote the run's files into OUT/runs/<key>/ itself

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
        self.lost: dict[str, int] = {}  # key -> times its worker process died under it

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
        pending: dict[Future, tuple[list[RunSpec], int]] = {}  # future -> its runs and the pool's generation
        self._start(specs, pending)
        self._feed(more, pending)
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                group, generation = pending.pop(fut)
                key = group[0].key
                try:
                    summary, error = self.pool.collect(fut.result(), key), None
                except StlsgdError as exc:  # a run's own input error: one line, recorded
                    summary, error = None, str(exc)
                except Exception as exc:  # noqa: BLE001 -- a worker error is recorded; the sweep goes on
                    if not self.pool.lost(exc):
                        summary, error = None, "".join(traceback.format_exception(exc))[-2000:]
                    else:
                        # A worker process died (killed, out of memory) under this run: it is run again, and
                        # recorded as failed if that happens twice. A process pool breaks as a whole: each of
                        # its runs comes here and goes to one fresh pool.
                        self.lost[key] = self.lost.get(key, 0) + 1
                        if self.lost[key] < 2:
                            if generation == self.pool.generation:
                                self.pool.restart()
                            pending[self._submit(group)] = (group, self.pool.generation)
                            continue
                        summary, error = None, "its worker process died twice (killed, or out of memory?)"
                for spec in group:
                    self._keep(make_record(spec, summary, error))
            self._feed(more, pending)

    def _start(self, specs: list[RunSpec], pending: dict[Future, tuple[list[RunSpec], int]]) -> None:
        """Submit the specs not already recorded, one run per distinct config."""
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
        for group in groups.values():
            pending[self._submit(group)] = (group, self.pool.generation)

    def _feed(
        self, more: Callable[[set[str]], list[RunSpec]] | None, pending: dict[Future, tuple[list[RunSpec], int]]
    ) -> None:
        # A row whose next runs are all recorded already (a resumed sweep) asks again at once.
        while more is not None:
            specs = more({s.label for group, _ in pending.values() for s in group})
            if not specs:
                return
            self._start(specs, pending)

    def _submit(self, group: list[RunSpec]) -> Future:
        # Seed reruns are the reported figures: never cut short. A config shared by several labels is
        # hopeless only once it is hopeless for all of them.
        slots = (
            []
            if group[0].phase == "seed" or not self.sweep.prune
            else sorted({self.sweep.labels.index(s.label) for s in group})
        )
        return self.pool.submit({"config": group[0].config, "key": group[0].key, "slots": slots})

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
