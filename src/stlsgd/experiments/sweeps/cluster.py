"""A sweep's runs on a Dask cluster (``stlsgd sweep FILE --cluster tcp://HOST:PORT | local:N``).

The submitting process keeps everything a sweep writes: the lock, ``results.jsonl``, ``best.json`` and each
run's directory ``OUT/runs/<key>/``. Workers get the data (``--data-dir`` as *they* see it), never the output
directory: a run is computed in a temporary directory on its worker and its files (metrics, summary, config,
final parameters) come back with the result, to be written under ``OUT`` here. So a cluster whose nodes share
no file system with the submitting machine works, and a killed submitting process is resumed with the same
command as a local sweep is (``results.jsonl`` says what is done).

Pruning bounds: the submitting process holds them. Each bundle of runs (:func:`.worker.run_bundle`) is sent with
the bounds of its rows as they are when it is submitted, and reads the newer ones from a Dask ``Variable`` at
most every ``REFRESH_S``; this process lowers it as results arrive, and a worker as soon as one of its runs reaches
the target: a run that can no longer win stops soon after a better one finished anywhere.

A worker lost in the middle of a run (killed, out of memory, its node gone): Dask's scheduler gives its
tasks to other workers by itself; a task that killed several workers comes back as ``KilledWorker``, and the
scheduler runs it once more before recording it as failed, as with a local process pool.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from stlsgd.errors import StlsgdError
from stlsgd.experiments.sweeps.worker import NO_BOUND, run_bundle
from stlsgd.files import fsync_dir
from stlsgd.threads import share_cores

# How often a run asks the cluster for newer pruning bounds: a round trip to the scheduler (about a millisecond on a
# LAN), against a9a's thousands of rounds a second that a stale bound lets a hopeless run go on for.
REFRESH_S = 0.1
CONNECT_TIMEOUT_S = 30
_ADDRESS = re.compile(r"^(tcp|tls)://[^\s/:]+:\d{1,5}$")


def check_cluster(spec: str) -> None:
    """Refuse a ``--cluster`` value that is neither ``tcp://HOST:PORT`` nor ``local:N`` (before anything runs)."""
    if spec.startswith("local:"):
        n = spec.removeprefix("local:")
        if not n.isdigit() or int(n) < 1:
            raise StlsgdError(f"--cluster {spec}: local:N needs a number of workers N >= 1, e.g. local:4")
        return
    if not _ADDRESS.match(spec):
        raise StlsgdError(
            f"--cluster {spec}: expected tcp://HOST:PORT (a running `dask scheduler`) or local:N (N workers here)"
        )


class DaskPool:
    """The scheduler's pool on a ``distributed.Client``: submit, lower a row's bound, collect a run's files."""

    generation = 0  # Dask replaces lost workers itself: there is no pool to restart

    def __init__(self, spec: str, labels: int, out: Path, data_dir: str | None) -> None:
        check_cluster(spec)
        try:
            import dask
            import distributed
        except ImportError:
            raise StlsgdError(
                f"--cluster {spec}: needs dask.distributed; install stlsgd with the dask extra (pip install stlsgd[dask])"
            ) from None
        self.out, self.data_dir = out, data_dir
        self.closed = False
        self.cluster: Any = None
        self.cores = 0  # threads per run for numba/torch; 0 leaves the worker's defaults
        if spec.startswith("local:"):
            n = int(spec.removeprefix("local:"))
            # Dask's statistical profiler samples each worker's threads every 10 ms: time taken from the runs,
            # which this local cluster has no dashboard to show.
            with dask.config.set({"distributed.worker.profile.enabled": False}):
                self.cluster = distributed.LocalCluster(
                    n_workers=n,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.ERROR,
                )
            self.cores, address = n, self.cluster.scheduler_address
        else:
            address = spec
        try:
            self.client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S)
        except OSError as err:
            self._close_cluster()
            raise StlsgdError(
                f"--cluster {spec}: cannot reach the Dask scheduler ({err}); start one with `dask scheduler` "
                "and its workers with `dask worker ADDRESS`"
            ) from None
        self.executor = self.client.get_executor(pure=False)
        self.width = max(1, sum(self.client.nthreads().values()))  # bundles of one row that run side by side
        self.bounds = [NO_BOUND] * labels
        self.variable = distributed.Variable(f"stlsgd-sweep-bounds-{uuid.uuid4().hex}", client=self.client)
        self.variable.set(list(self.bounds))
        self._killed: tuple[type[BaseException], ...] = (distributed.KilledWorker,)

    def lower(self, slot: int, rounds: int) -> None:
        if rounds < self.bounds[slot]:
            self.bounds[slot] = rounds
            try:
                _lower_cluster(self.variable, [slot], rounds, CONNECT_TIMEOUT_S)
            except Exception:  # noqa: BLE001 -- the scheduler is slow: set ours (at worst it raises a worker's lower one)
                self.variable.set(list(self.bounds))

    def submit(self, tasks: list[dict[str, Any]]) -> Future:
        snapshot = {i: self.bounds[i] for t in tasks for i in t["slots"]}
        return self.executor.submit(remote_run, tasks, self.data_dir, self.variable.name, snapshot, self.cores)

    def collect(self, result: dict[str, Any], key: str) -> dict[str, Any]:
        """Write the run's files into ``OUT/runs/<key>/`` (replacing an earlier, failed or pruned attempt)."""
        runs = self.out / "runs"
        runs.mkdir(exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=runs))
        for name, data in result["files"].items():
            with open(staging / name, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        final = runs / key
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        elif final.exists() or final.is_symlink():
            final.unlink()
        os.replace(staging, final)
        fsync_dir(runs)
        return result["summary"]

    def lost(self, exc: BaseException) -> bool:
        return isinstance(exc, self._killed)

    def restart(self) -> None:
        pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.executor.shutdown(wait=False)
        try:
            self.variable.delete()
        except Exception:  # noqa: BLE001 -- the scheduler may be gone already; nothing to clean then
            pass
        self.client.close()
        self._close_cluster()

    def _close_cluster(self) -> None:
        if self.cluster is not None:
            self.cluster.close()


_SHARED: list[int] = []  # the core share this worker process already set
_MALLOC: list[bool] = []  # whether this worker process's allocator was already set back

# glibc's mallopt parameters, and the largest values its dynamic rule reaches on 64-bit (malloc/malloc.c).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_MAX, _TRIM_MAX = 32 << 20, 64 << 20


def undo_dask_malloc_trim() -> bool:
    """Give this process's allocator back glibc's large-buffer thresholds, once; True if they were set.

    Dask's nanny starts each worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (``distributed.nanny.pre-spawn-environ``),
    which also switches off glibc's dynamic mmap threshold: every buffer over 128 KiB (a round's sampled rows,
    its gradients) is then mapped and unmapped, page faults and all, on every round. A run's own thread took 25-30 %
    more CPU in such a worker than in a pool process (docs/sweeps.md). The thresholds a pool process reaches by
    glibc's dynamic rule are set here instead. Not glibc (musl, macOS): nothing to undo.
    """
    if _MALLOC:
        return False
    _MALLOC.append(True)
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_MAX)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_MAX))
    except (OSError, AttributeError):
        return False


def _lower_cluster(variable: Any, slots: list[int], rounds: int, timeout: float) -> None:
    """Lower the cluster's bounds of ``slots`` to ``rounds`` where they are higher (the submitting process and the
    workers alike). Not atomic: a write lost to a race between two writers leaves a bound higher than it could be,
    which only prunes later."""
    latest = variable.get(timeout=timeout)
    variable.set([min(b, rounds) if i in slots else b for i, b in enumerate(latest)])


def remote_run(
    tasks: list[dict[str, Any]], data_dir: str | None, variable: str, snapshot: dict[int, int], cores: int
) -> list[dict[str, Any]]:
    """Run a bundle of settings on a Dask worker; returns, per task, its summary and its files' content (the
    directories are dropped), or its error."""
    import distributed

    undo_dask_malloc_trim()
    if cores and _SHARED != [cores]:
        share_cores(cores)
        _SHARED[:] = [cores]
    bounds = dict(snapshot)
    # The bundle's runs read it from threads of their own, which only a Variable given its client can serve.
    var = distributed.Variable(variable, client=distributed.get_client())
    checked = [time.monotonic()]

    def bound(slots: list[int]) -> int:
        now = time.monotonic()
        if now - checked[0] >= REFRESH_S:
            checked[0] = now
            try:
                latest = var.get(timeout=REFRESH_S)
                bounds.update({i: min(bounds[i], latest[i]) for i in bounds})
            except Exception:  # noqa: BLE001 -- the bounds only save time: a late one never changes a result
                pass
        return max(bounds[i] for i in slots)

    def lower(slots: list[int], rounds: int) -> None:
        for i in slots:
            bounds[i] = min(bounds[i], rounds)
        try:
            _lower_cluster(var, slots, rounds, REFRESH_S)
        except Exception:  # noqa: BLE001 -- as above: the other workers then hear of it from the submitting process
            pass

    scratch = Path(tempfile.mkdtemp(prefix="stlsgd-run-"))
    try:
        outs = [scratch / str(i) for i in range(len(tasks))]
        results = run_bundle(tasks, outs, data_dir, bound, lower)
        for out, result in zip(outs, results):
            if "summary" in result:
                result["files"] = {
                    p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and not p.name.startswith(".")
                }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results
