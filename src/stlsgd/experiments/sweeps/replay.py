"""Replay an archived sweep: rerun the runs its figures draw, from ``results.jsonl`` and ``best.json`` alone.

A sweep keeps every run's files under ``OUT/runs/<key>/``; an archive (a repository, a paper's data) often
keeps only ``results.jsonl`` and ``best.json``. ``stlsgd replay DIR`` reruns each row's chosen run (the
``run_dir`` of ``best.json``; for a row that never reached the target, its closest run) into
``DIR/runs/<key>/``, so that ``stlsgd report DIR`` can draw the figures again.

Each run is rebuilt through the sweep's own code path: the sweep file (``best.json``'s ``config``, or
``--config``) is expanded by :func:`~stlsgd.experiments.sweeps.spec.load_sweep`, the run is the spec whose key
(the hash of the resolved experiment: settings, seed, ``eval_every``, budgets) equals the recorded one, and it
runs in the sweep's worker (:func:`~stlsgd.experiments.sweeps.worker.execute`), in a process pool like the
sweep's, with every evaluation its ``eval_every`` asks for. Each replay is written aside and moved into
``DIR/runs/`` only when its outcome (status, rounds and iterations to target; for a run that did not reach the
target, the rounds and iterations where it stopped) equals the record; otherwise it is removed and the command
ends with one line naming the row and both outcomes (exit status 2): the code has changed since the sweep, and
its figure would not show the recorded run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stlsgd.errors import StlsgdError
from stlsgd.experiments.sweeps.results import (
    BEST,
    RESULTS,
    check_best,
    drawn_run_dir,
    make_record,
    read_results,
    sweep_file_of,
)
from stlsgd.experiments.sweeps.scheduler import LocalPool
from stlsgd.experiments.sweeps.spec import RunSpec, Sweep, load_sweep, with_seed
from stlsgd.files import LockedError, lock_directory, refuse_links

log = logging.getLogger(__name__)

#: The fields a replay must reproduce; for a run that did not reach the target, also where it stopped.
COMPARED = ("status", "rounds_to_target", "iterations_to_target")
STOPPED = ("rounds", "iterations")
STAGING = ".replay"  # DIR/.replay/runs/<key>: replays not yet checked


@dataclass
class Replay:
    """One run to replay: the rows that draw it, its record in ``results.jsonl`` and its rebuilt spec."""

    labels: list[str]
    record: dict[str, Any]
    spec: RunSpec

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def run_dir(self) -> str:
        return str(self.record["run_dir"])


def outcome(record: dict[str, Any]) -> str:
    """A record's outcome in words, as a mismatch names it."""
    if record["status"] == "reached":
        return f"reached in {record['rounds_to_target']} rounds ({record['iterations_to_target']} iterations)"
    if record["status"] == "failed":
        lines = (record.get("error") or "").strip().splitlines()
        return "failed" + (f" ({lines[-1]})" if lines else "")
    return f"{record['status']} after {record['rounds']} rounds ({record['iterations']} iterations)"


def same_outcome(replayed: dict[str, Any], recorded: dict[str, Any]) -> bool:
    fields = COMPARED if recorded["status"] == "reached" else (*COMPARED, *STOPPED)
    return all(replayed.get(f) == recorded.get(f) for f in fields)


def sweep_file(directory: Path, best: dict[str, Any], config: str | Path | None) -> Path:
    """The sweep file to rebuild the runs from: ``config`` when given, else the one ``best.json`` names."""
    if config is not None:
        path = Path(config)
        if not path.is_file():
            raise StlsgdError(f"--config: {path}: no such sweep file")
        return path
    found = sweep_file_of({**best, "_dir": directory})
    if found is None:
        raise StlsgdError(
            f"{directory / BEST}: config: sweep file {best.get('config')!r} not found; give it with --config FILE"
        )
    return found


def plan_replays(directory: Path, config: str | Path | None = None) -> tuple[Sweep, list[Replay]]:
    """Read ``DIR/best.json`` and ``DIR/results.jsonl`` and rebuild the run of every row the figures draw.

    Only reads: every problem (no best.json, a run_dir absent from the results, a sweep file that no longer
    yields the recorded run) is a one-line :class:`StlsgdError` before anything is written."""
    path = directory / BEST
    try:
        best = check_best(path, json.loads(path.read_text()))
    except FileNotFoundError:
        raise StlsgdError(f"{path}: not found; give a sweep directory holding {BEST} and {RESULTS}") from None
    except IsADirectoryError:
        raise StlsgdError(f"{path}: is a directory; give a sweep directory holding {BEST} and {RESULTS}") from None
    except json.JSONDecodeError as exc:
        raise StlsgdError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    records = read_results(directory)
    if not records:
        raise StlsgdError(f"{directory / RESULTS}: no results; give the sweep directory with its {RESULTS}")
    source = sweep_file(directory, best, config)
    sweep = load_sweep(
        source, only=[label for label in best["labels"] if drawn_run_dir(best["methods"][label])] or None
    )
    if sweep.name != best["sweep"]:
        raise StlsgdError(f"{source}: is sweep {sweep.name!r}, {path} is of sweep {best['sweep']!r}; give --config")
    grid = {(s.label, s.key): s for s in sweep.grid}
    replays: dict[str, Replay] = {}
    for label in best["labels"]:
        run_dir = drawn_run_dir(best["methods"][label])
        if run_dir is None:
            continue  # nothing ran for this row: nothing is drawn
        record = next((r for r in records if r["label"] == label and r["run_dir"] == run_dir), None)
        if record is None:
            raise StlsgdError(f"{path}: methods.{label}.run_dir: {run_dir} is not in {RESULTS}; rerun `stlsgd sweep`")
        if run_dir != f"runs/{record['key']}":  # the only place a sweep puts a run: never write elsewhere
            raise StlsgdError(f"{path}: methods.{label}.run_dir: {run_dir!r} is not runs/<key>; rerun `stlsgd sweep`")
        spec = grid.get((label, record["key"]))
        if record["phase"] == "seed":
            base = next(
                (s for s in sweep.grid if s.label == label and s.settings == record["settings"]),
                None,
            )
            spec = None if base is None else with_seed(base, record["seed"], record["order"])
        if spec is None or spec.key != record["key"]:
            raise StlsgdError(
                f"{source}: row {label!r}: no run of this sweep file is the recorded {run_dir} (the file was "
                "edited since the sweep?); give the sweep file it ran with: --config FILE"
            )
        if run_dir in replays:
            replays[run_dir].labels.append(label)  # one config chosen by two rows: one run
        else:
            replays[run_dir] = Replay([label], record, spec)
    if not replays:
        raise StlsgdError(f"{path}: no row has a run to replay")
    return sweep, list(replays.values())


def replay(
    directories: list[str | Path] | str | Path,
    *,
    config: str | Path | None = None,
    jobs: int | None = None,
    data_dir: str | None = None,
    quiet: bool = False,
) -> list[dict[str, Any]]:
    """Replay the drawn runs of each sweep directory into its ``runs/``; return the replayed records.

    Every directory is read and every run rebuilt first: bad input is a one-line :class:`StlsgdError` before
    anything is written. A replay whose outcome differs from its record is removed, the others are kept and
    the remaining directories replayed; then one :class:`StlsgdError` names the first mismatch."""
    dirs = [Path(d) for d in ([directories] if isinstance(directories, (str, Path)) else directories)]
    if not dirs:
        raise StlsgdError("replay: give at least one sweep directory")
    if jobs is not None and jobs < 1:
        raise StlsgdError(f"--jobs: must be >= 1, got {jobs}")
    if config is not None and len(dirs) > 1:
        raise StlsgdError("--config: names the sweep file of one directory; replay the directories one by one")
    for directory in dirs:
        if not directory.is_dir():
            raise StlsgdError(f"{directory}: not a directory; give a sweep directory holding {BEST} and {RESULTS}")
    plans = [plan_replays(directory, config)[1] for directory in dirs]
    for directory in dirs:
        refuse_links(directory)  # as locking it would, but for every directory before the first is written
    kept: list[dict[str, Any]] = []
    mismatches: list[str] = []
    for directory, replays in zip(dirs, plans):
        try:
            lock = lock_directory(directory)
        except LockedError as err:
            raise StlsgdError(
                f"{directory}: another stlsgd sweep or replay (pid {err.holder}) is writing here; wait for it to end"
            ) from None
        try:
            workers = max(1, min(jobs or os.cpu_count() or 1, len(replays)))
            done, failed = _run(directory, replays, workers, data_dir, quiet)
        finally:
            os.close(lock)
        kept += done
        mismatches += failed
    if mismatches:
        for line in mismatches[1:]:
            log.warning("%s", line)
        more = f" (and {len(mismatches) - 1} more, above)" if len(mismatches) > 1 else ""
        raise StlsgdError(f"{mismatches[0]}{more}")
    return kept


def _run(
    directory: Path, replays: list[Replay], jobs: int, data_dir: str | None, quiet: bool
) -> tuple[list[dict[str, Any]], list[str]]:
    """Replay ``replays`` in a pool of ``jobs`` workers; returns the kept records and the mismatches' lines."""
    started = time.perf_counter()
    staging = directory / STAGING
    shutil.rmtree(staging, ignore_errors=True)  # a killed replay's leftovers (we hold the lock)
    # Longest first (the sweep's wall times), so that parallel workers end together.
    replays = sorted(replays, key=lambda r: -float(r.record.get("wall_s") or 0.0))
    pool = LocalPool(0, staging, jobs, data_dir)  # no pruning bounds (see below)
    mismatches: list[str] = []
    kept: list[dict[str, Any]] = []
    try:
        pending: dict[Future, int] = {}
        for slot, rep in enumerate(replays):
            # No pruning slots: a drawn run is a row's reached run or, in a row that reached nothing (so
            # had no bound), its closest one; neither was stopped by a bound. The figures want every
            # evaluation point, not the coarse curve a sweep run may keep: ``every_evaluation``.
            task = {"config": rep.spec.config, "key": rep.key, "slots": [], "every_evaluation": True}
            pending[pool.submit([task])] = slot
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                rep = replays[pending.pop(fut)]
                try:
                    (result,) = fut.result()
                except Exception as exc:  # noqa: BLE001 -- compared (and reported) as a failed run
                    result = {"error": "".join(traceback.format_exception(exc))[-2000:], "input_error": False}
                if result.get("input_error"):
                    # The run's own input error (no data there, ...): one line, nothing kept of it.
                    raise StlsgdError(result["error"])
                summary, error = result.get("summary"), result.get("error")
                replayed = make_record(rep.spec, summary, error)
                rows = " / ".join(repr(label) for label in rep.labels)
                if same_outcome(replayed, rep.record):
                    _move_in(staging / "runs" / rep.key, directory / "runs" / rep.key)
                    kept.append(replayed)
                    if not quiet:
                        log.info(
                            "[%d/%d] %s %s: %s, as recorded (%.1f s)",
                            len(kept) + len(mismatches),
                            len(replays),
                            rows,
                            rep.run_dir,
                            outcome(replayed),
                            replayed["wall_s"] or 0.0,
                        )
                else:
                    shutil.rmtree(staging / "runs" / rep.key, ignore_errors=True)
                    if not quiet:
                        log.info(
                            "[%d/%d] %s %s: replayed %s, recorded %s: not kept",
                            len(kept) + len(mismatches) + 1,
                            len(replays),
                            rows,
                            rep.run_dir,
                            outcome(replayed),
                            outcome(rep.record),
                        )
                    mismatches.append(
                        f"{directory / RESULTS}: row {rows} ({rep.run_dir}) replayed {outcome(replayed)}, recorded "
                        f"{outcome(rep.record)}; not kept (the code changed since the sweep?)"
                    )
    finally:
        pool.close()
        shutil.rmtree(staging, ignore_errors=True)
    if not quiet:
        log.info(
            "replayed %d of %d runs in %.1f s into %s/",
            len(kept),
            len(replays),
            time.perf_counter() - started,
            directory / "runs",
        )
    return kept, mismatches


def _move_in(src: Path, dst: Path) -> None:
    """The checked replay becomes ``dst`` (an older copy there, complete or not, is replaced)."""
    dst.parent.mkdir(exist_ok=True)
    if dst.is_symlink() or dst.is_file():
        dst.unlink()
    elif dst.exists():
        shutil.rmtree(dst)
    os.replace(src, dst)
