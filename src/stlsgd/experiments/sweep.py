"""Hyper-parameter sweeps with the paper's tuning protocol (Section 5): grids per method, pruning, seeds.

A sweep file holds a base experiment (the ``stlsgd run`` schema: data/problem/algorithm/run) and, per method,
a grid and optional fixed fields::

    name = "table2_a9a_iid"
    seeds = [0, 1, 2]
    [base.data]
    dataset = "a9a"
    [[methods]]
    method = "local_sgd"
    label = "Local SGD"
    grid = { lr = [3.2, 32, 0.32], lr_decay = [1e-3, 1e-2, 1e-4], k = [400, 200, 800, 100, 1600] }
    fixed = { "run.eval_every" = 1 }

Bare keys name ``algorithm`` fields, dotted keys any field (``run.eval_every``). Values are tried in the
order listed, so list the likely-good ones first: an early good run lets pruning cut the rest short.

``stlsgd sweep`` runs every setting in worker processes that each load the data once, appends each run's
record to ``OUT/results.jsonl`` as soon as it ends (fsync'd: a crash loses nothing, and a rerun skips every
run already there, keyed by a hash of the resolved config), keeps each run's metrics under
``OUT/runs/<key>/``, picks per label the setting with the fewest rounds to target, reruns it with the extra
seeds and writes ``OUT/best.json``.

Pruning: a run whose round count passes the best rounds-to-target already finished for its label can no
longer win; it is stopped and recorded as ``pruned`` (never as failed). The bound is a shared-memory array
that the main process lowers as results arrive and that each worker reads every round.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stlsgd.errors import ConfigError, StlsgdError
from stlsgd.experiments.config import Experiment, read_raw, validate
from stlsgd.threads import share_cores

RESULTS = "results.jsonl"
BEST = "best.json"
NO_BOUND = 2**62  # "no finished run yet" in the shared pruning array


class MethodGrid(BaseModel):
    """One row of the table: a method, its label and the grid of settings tried for it."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["sync_sgd", "lb_sgd", "cr_psgd", "local_sgd", "stl_sc", "stl_nc"]
    label: str | None = None
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    fixed: dict[str, Any] = Field(default_factory=dict)


class SweepSpec(BaseModel):
    """A sweep file: base experiment, per-method grids and the seeds used to rerun each best setting."""

    model_config = ConfigDict(extra="forbid")

    name: str
    seeds: list[int] = Field(default_factory=lambda: [0])
    prune: bool = True
    base: dict[str, Any] = Field(default_factory=dict)
    methods: list[MethodGrid] = Field(min_length=1)


@dataclass
class RunSpec:
    """One resolved run of the sweep."""

    key: str
    label: str
    method: str
    phase: Literal["grid", "seed"]
    order: int
    seed: int
    settings: dict[str, Any]
    config: dict[str, Any]


@dataclass
class Sweep:
    name: str
    source: Path
    seeds: list[int]
    prune: bool
    labels: list[str]
    grid: list[RunSpec]
    base: dict[str, Any] = field(default_factory=dict)


def _set_path(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".") if "." in key else ["algorithm", key]
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part} is not a section")
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def config_key(config: dict[str, Any]) -> str:
    """Stable identity of a resolved run: the hash of its non-default fields, without the display name.

    Leaving defaults out keeps keys (and so the skipping of finished runs) stable when the config schema
    gains new fields with defaults.
    """
    body = Experiment.model_validate(config).model_dump(mode="json", exclude_defaults=True)
    body.pop("name", None)
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _with_seed(spec: RunSpec, seed: int, order: int) -> RunSpec:
    config = copy.deepcopy(spec.config)
    config["run"]["seed"] = seed
    return RunSpec(config_key(config), spec.label, spec.method, "seed", order, seed, spec.settings, config)


def _interleave(per_label: list[list[RunSpec]]) -> Iterator[RunSpec]:
    """Round-robin over labels: every label's likeliest setting runs early, so its bound exists early."""
    for batch in itertools.zip_longest(*per_label):
        yield from (s for s in batch if s is not None)


def load_sweep(path: str | Path, *, only: list[str] | None = None, limit: int | None = None) -> Sweep:
    """Read a sweep file and validate every expanded run up front (errors name the file and the field).

    ``only`` keeps the named labels; ``limit`` keeps each label's first ``limit`` settings (a quick probe).
    """
    path = Path(path)
    raw = read_raw(path)
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        msg = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
        raise ConfigError(f"{path}: {loc}: {msg}") from None
    base = copy.deepcopy(spec.base)
    if "run" in base and "seed" in base["run"] and base["run"]["seed"] not in spec.seeds:
        raise ConfigError(f"{path}: seeds: must include base.run.seed ({base['run']['seed']})")
    labels: list[str] = []
    per_label: list[list[RunSpec]] = []
    for i, mg in enumerate(spec.methods):
        label = mg.label or mg.method
        if label in labels:
            raise ConfigError(f"{path}: methods[{i}].label: duplicate label {label!r}")
        labels.append(label)
        for key, values in mg.grid.items():
            if not values:
                raise ConfigError(f"{path}: methods[{i}].grid.{key}: empty list")
        keys = list(mg.grid)
        runs: list[RunSpec] = []
        for combo in itertools.product(*(mg.grid[k] for k in keys)):
            settings = dict(zip(keys, combo))
            config = copy.deepcopy(base)
            config["name"] = f"{spec.name}/{label}"
            try:
                _set_path(config, "algorithm.method", mg.method)
                for key, value in {**mg.fixed, **settings}.items():
                    _set_path(config, key, value)
            except ConfigError as exc:
                raise ConfigError(f"{path}: methods[{i}]: {exc}") from None
            where = ", ".join(f"{k}={v}" for k, v in settings.items())
            exp = validate(config, f"{path}: methods[{i}] ({label}{': ' + where if where else ''})")
            resolved = exp.to_dict()
            runs.append(RunSpec(config_key(resolved), label, mg.method, "grid", 0, exp.run.seed, settings, resolved))
        per_label.append(runs[:limit] if limit else runs)
    if only:
        unknown = [label for label in only if label not in labels]
        if unknown:
            raise ConfigError(f"{path}: --only: unknown label {unknown[0]!r}; labels: {', '.join(labels)}")
        per_label = [runs for label, runs in zip(labels, per_label) if label in only]
        labels = [label for label in labels if label in only]
    grid = list(_interleave(per_label))
    for order, run_spec in enumerate(grid):
        run_spec.order = order
    return Sweep(spec.name, path, spec.seeds, spec.prune, labels, grid, base)


# --------------------------------------------------------------------------------------------------------
# Worker side: one process runs many settings; the data, partition, problem and f* are built once.

_BOUND: Any = None  # shared RawArray: best finished rounds-to-target per label index
_DATA_DIR: str | None = None
_BUILT: dict[str, Any] = {}


def _init_worker(bound: Any, data_dir: str | None, jobs: int = 1) -> None:
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


class _SampleCounter:
    """Samples processed by all clients up to a round (Round.steps x batch x N summed), for the epochs axis."""

    def __init__(self, plan: Any, num_clients: int) -> None:
        self._rounds = plan.rounds()
        self._num_clients = num_clients
        self._done = 0  # rounds counted so far
        self._samples = 0

    def at(self, round_count: int) -> int:
        while self._done < round_count:
            rnd = next(self._rounds)
            self._samples += rnd.steps * rnd.batch * self._num_clients
            self._done += 1
        return self._samples


def _built_for(exp: Experiment) -> Any:
    """The run's dataset, partition and problem, cached per (data, problem) sections in this worker."""
    from stlsgd.experiments.build import build

    ident = json.dumps([exp.data.model_dump(mode="json"), exp.problem.model_dump(mode="json")], sort_keys=True)
    if ident not in _BUILT:
        _BUILT[ident] = build(exp, _DATA_DIR)
    return _BUILT[ident]


def execute(task: dict[str, Any]) -> dict[str, Any]:
    """Run one setting (in a worker) and write its config, metrics and summary under ``task['out']``."""
    from stlsgd.executors.sampling import Sampler
    from stlsgd.executors.simulator import init_run_state, run
    from stlsgd.experiments.build import build_plan
    from stlsgd.experiments.config import dump_config
    from stlsgd.experiments.runner import cache_dir, stop_rule, summarize, write_json_atomic

    exp = Experiment.model_validate(task["config"])
    built = _built_for(exp)
    d = exp.data
    plan = build_plan(exp.algorithm, num_samples=built.dataset.n, num_clients=d.num_clients, lam=built.problem.lam,
                      iid_default=d.partition in ("shared", "split"))
    fstar = built.problem.optimum(cache_dir=cache_dir()) if exp.run.target_gap is not None else None
    out = Path(task["out"])
    out.mkdir(parents=True, exist_ok=True)
    dump_config(exp, out / "config.yaml")
    sampler = Sampler(built.partition, exp.run.seed)
    state = init_run_state(built.problem, sampler, d.num_clients, exp.run.seed)
    counter = _SampleCounter(plan, d.num_clients)
    slots: list[int] = task["slots"]
    n = built.dataset.n

    def on_round(st: Any, rnd: Any) -> str | None:
        # Only a strictly larger round count is hopeless: at the bound itself the run could still tie.
        if slots and st.round > max(_BOUND[i] for i in slots):
            return "pruned"
        return None

    with open(out / "metrics.jsonl", "w", buffering=1) as fh:

        def on_metrics(m: dict[str, Any]) -> None:
            samples = counter.at(m["round"])
            fh.write(json.dumps({**m, "samples": samples, "epochs": samples / n}) + "\n")

        state = run(plan, built.problem, sampler, stop_rule(exp, fstar is not None), state, fstar=fstar,
                    on_metrics=on_metrics, on_round=on_round, progress=False)
    summary = summarize(exp, state, plan.describe(), fstar)
    write_json_atomic(out / "summary.json", summary)
    summary["num_samples"] = n
    return summary


# --------------------------------------------------------------------------------------------------------
# Main side: scheduling, the results file, the choice of the best setting and the seed reruns.


def read_results(path: Path) -> list[dict[str, Any]]:
    """Records of ``results.jsonl``; a line cut short by a crash is ignored (its run is simply redone)."""
    return read_jsonl(path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none if it is missing), skipping a last line cut short by a crash."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _record(spec: RunSpec, summary: dict[str, Any] | None, error: str | None) -> dict[str, Any]:
    s = summary or {}
    final = s.get("final") or {}
    return {
        "key": spec.key,
        "label": spec.label,
        "method": spec.method,
        "phase": spec.phase,
        "order": spec.order,
        "seed": spec.seed,
        "settings": spec.settings,
        "status": s.get("status", "failed"),
        "rounds_to_target": s.get("rounds_to_target"),
        "iterations_to_target": s.get("iterations_to_target"),
        "rounds": s.get("rounds"),
        "iterations": s.get("iterations"),
        "eval_every": spec.config["run"]["eval_every"],
        "eval_every_iterations": spec.config["run"]["eval_every_iterations"],
        "final_gap": final.get("gap"),
        "final_objective": final.get("objective"),
        "final_accuracy": final.get("accuracy"),
        "num_samples": s.get("num_samples"),
        "wall_s": s.get("wall_s"),
        "run_dir": f"runs/{spec.key}",
        "error": error,
    }


def current_records(sweep: Sweep, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of runs that this version of the sweep file asks for.

    ``results.jsonl`` also keeps the runs of earlier versions of the file (a grid value, budget or fixed
    field since edited): they stay on disk, but a setting's old config must neither be chosen, nor counted,
    nor bound the pruning of its new one.
    """
    grid = {(s.label, s.key) for s in sweep.grid}
    by_setting = {(s.label, json.dumps(s.settings, sort_keys=True)): s for s in sweep.grid}
    kept = []
    for r in records:
        if r["phase"] == "grid":
            current = (r["label"], r["key"]) in grid
        else:
            spec = by_setting.get((r["label"], json.dumps(r["settings"], sort_keys=True)))
            current = spec is not None and r["key"] == _with_seed(spec, r["seed"], 0).key
        if current:
            kept.append(r)
    return kept


def best_of(records: list[dict[str, Any]], label: str) -> dict[str, Any] | None:
    """The label's grid run with the fewest rounds to target (ties: fewer iterations, then grid order)."""
    reached = [r for r in records if r["label"] == label and r["phase"] == "grid" and r["status"] == "reached"]
    if not reached:
        return None
    return min(reached, key=lambda r: (r["rounds_to_target"], r["iterations_to_target"], r["order"]))


def _describe(record: dict[str, Any]) -> str:
    where = " ".join(f"{k}={v}" for k, v in record["settings"].items())
    seed = f" seed={record['seed']}" if record["phase"] == "seed" else ""
    if record["status"] == "reached":
        what = f"reached in {record['rounds_to_target']} rounds"
    elif record["status"] == "failed":
        what = f"failed: {(record['error'] or '').strip().splitlines()[-1] if record['error'] else ''}"
    else:
        what = f"{record['status']} after {record['rounds']} rounds"
    wall = f" ({record['wall_s']:.1f} s)" if record.get("wall_s") is not None else ""
    return f"{record['label']} {where}{seed}: {what}{wall}"


class _Scheduler:
    """Runs specs in a process pool, de-duplicating identical configs and keeping the pruning bounds."""

    def __init__(self, sweep: Sweep, out: Path, jobs: int, data_dir: str | None, quiet: bool) -> None:
        self.sweep, self.out, self.quiet = sweep, out, quiet
        self.results_path = out / RESULTS
        self.records = read_results(self.results_path)  # every run on disk: a finished config is not redone
        self.current = current_records(sweep, self.records)  # what this sweep file chooses from and counts
        ctx = mp.get_context("spawn")  # numba and torch are not fork-safe; workers start clean
        self.bound = ctx.RawArray("q", len(sweep.labels))
        for i, label in enumerate(sweep.labels):
            best = best_of(self.current, label) if sweep.prune else None
            self.bound[i] = best["rounds_to_target"] if best else NO_BOUND
        self._pool_args = {"max_workers": jobs, "mp_context": ctx, "initializer": _init_worker,
                           "initargs": (self.bound, data_dir, jobs)}
        self.pool = ProcessPoolExecutor(**self._pool_args)
        self.done_count = 0
        self.lost: dict[str, int] = {}  # key -> times its worker process died under it

    def _done(self, spec: RunSpec) -> bool:
        return any(r["key"] == spec.key and r["label"] == spec.label and r["status"] != "failed"
                   for r in self.records)

    def _keep(self, record: dict[str, Any]) -> None:
        _append(self.results_path, record)
        self.records.append(record)
        self.current.append(record)
        if record["phase"] == "grid" and record["status"] == "reached" and self.sweep.prune:
            i = self.sweep.labels.index(record["label"])
            self.bound[i] = min(self.bound[i], record["rounds_to_target"])
        self.done_count += 1
        # best.json follows every result, so an interrupted sweep can still be reported (marked incomplete).
        write_best(self.out, self.sweep, self.current, complete=False)
        if not self.quiet:
            print(f"[{self.done_count}] {_describe(record)}", flush=True)

    def run(self, specs: list[RunSpec]) -> None:
        groups: dict[str, list[RunSpec]] = {}
        for spec in specs:
            if self._done(spec):
                continue
            prior = next((r for r in self.records if r["key"] == spec.key and r["status"] not in ("failed", "pruned")),
                         None)
            if prior is not None:  # the same config already ran under another label: reuse its result
                self._keep({**prior, **_record(spec, None, None), **{k: prior[k] for k in _RESULT_FIELDS}})
                continue
            groups.setdefault(spec.key, []).append(spec)
        pending: dict[Future, tuple[list[RunSpec], ProcessPoolExecutor]] = {}
        for group in groups.values():
            pending[self._submit(group)] = (group, self.pool)
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                group, pool = pending.pop(fut)
                try:
                    summary, error = fut.result(), None
                except BrokenProcessPool:
                    # A worker process died (killed, out of memory): every run of its pool fails with it, so
                    # each is run again on a fresh pool -- and recorded as failed if that happens twice.
                    key = group[0].key
                    self.lost[key] = self.lost.get(key, 0) + 1
                    if self.lost[key] < 2:
                        if pool is self.pool:
                            self.pool.shutdown(wait=False, cancel_futures=True)
                            self.pool = ProcessPoolExecutor(**self._pool_args)
                        pending[self._submit(group)] = (group, self.pool)
                        continue
                    summary, error = None, "its worker process died twice (killed, or out of memory?)"
                except Exception as exc:  # a worker error is recorded; the sweep goes on
                    summary, error = None, "".join(traceback.format_exception(exc))[-2000:]
                for spec in group:
                    self._keep(_record(spec, summary, error))

    def _submit(self, group: list[RunSpec]) -> Future:
        # Seed reruns are the reported figures: never cut short. A config shared by several labels is
        # hopeless only once it is hopeless for all of them.
        slots = [] if group[0].phase == "seed" or not self.sweep.prune else sorted(
            {self.sweep.labels.index(s.label) for s in group})
        task = {"config": group[0].config, "out": str(self.out / "runs" / group[0].key), "slots": slots}
        return self.pool.submit(execute, task)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


_RESULT_FIELDS = ("status", "rounds_to_target", "iterations_to_target", "rounds", "iterations", "final_gap",
                  "final_objective", "final_accuracy", "num_samples", "wall_s", "run_dir", "error")


def summarize_best(sweep: Sweep, records: list[dict[str, Any]]) -> dict[str, Any]:
    """best.json: per label the chosen setting and the rounds to target of each seed (median and range)."""
    methods: dict[str, Any] = {}
    n = next((r["num_samples"] for r in records if r.get("num_samples")), None)
    for label in sweep.labels:
        best = best_of(records, label)
        tried = [r for r in records if r["label"] == label and r["phase"] == "grid"]
        counts = {s: sum(r["status"] == s for r in tried) for s in ("reached", "pruned", "budget", "diverged", "failed")}
        counts["planned"] = sum(s.label == label for s in sweep.grid)
        if best is None:
            # No setting reached the target: keep the closest run (lowest final gap, else loss) for the figures.
            scored = [r for r in tried if (r["final_gap"] if r["final_gap"] is not None else r["final_objective"])
                      is not None]
            closest = min(scored, key=lambda r: r["final_gap"] if r["final_gap"] is not None else r["final_objective"],
                          default=None)
            methods[label] = {"method": next((r["method"] for r in tried), None), "settings": None, "tried": counts,
                              "closest": None if closest is None else {
                                  "settings": closest["settings"], "status": closest["status"],
                                  "rounds": closest["rounds"], "final_gap": closest["final_gap"],
                                  "final_objective": closest["final_objective"], "run_dir": closest["run_dir"]}}
            continue
        runs: dict[str, Any] = {}
        for seed in sweep.seeds:
            if seed == best["seed"]:
                rec = best
            else:
                rec = next((r for r in records if r["label"] == label and r["phase"] == "seed" and r["seed"] == seed
                            and r["settings"] == best["settings"]), None)
            if rec is not None:
                runs[str(seed)] = {"status": rec["status"], "rounds_to_target": rec["rounds_to_target"],
                                   "iterations_to_target": rec["iterations_to_target"], "run_dir": rec["run_dir"]}
        reached = [v["rounds_to_target"] for v in runs.values() if v["status"] == "reached"]
        methods[label] = {
            "method": best["method"],
            "settings": best["settings"],
            "key": best["key"],
            "run_dir": best["run_dir"],
            "eval_every": best["eval_every"],
            "eval_every_iterations": best["eval_every_iterations"],
            "seeds": runs,
            "seeds_reached": len(reached),
            "median": statistics.median(reached) if reached else None,
            "min": min(reached) if reached else None,
            "max": max(reached) if reached else None,
            "tried": counts,
        }
    run_cfg = sweep.grid[0].config["run"]
    data_cfg = sweep.grid[0].config["data"]
    return {
        "sweep": sweep.name,
        "config": str(sweep.source),
        "dataset": data_cfg["dataset"],
        "partition": data_cfg["partition"],
        "num_clients": data_cfg["num_clients"],
        "num_samples": n,
        "target_gap": run_cfg["target_gap"],
        "target_accuracy": run_cfg["target_accuracy"],
        "seeds": sweep.seeds,
        "labels": sweep.labels,
        "methods": methods,
    }


def write_best(out: Path, sweep: Sweep, records: list[dict[str, Any]], *, complete: bool,
               wall_s: float | None = None) -> dict[str, Any]:
    """Write OUT/best.json atomically; ``complete`` is False while grid or seed runs are still to come."""
    from stlsgd.experiments.runner import write_json_atomic

    best = {**summarize_best(sweep, records), "complete": complete}
    if wall_s is not None:
        best["wall_s"] = round(wall_s, 1)
    write_json_atomic(out / BEST, best)
    return best


def run_sweep(config: str | Path, out: Path | None = None, *, jobs: int | None = None, data_dir: str | None = None,
              quiet: bool = False, only: list[str] | None = None, limit: int | None = None) -> dict[str, Any]:
    """Run (or continue) a sweep; returns the content written to ``OUT/best.json``."""
    sweep = load_sweep(config, only=only, limit=limit)
    out = Path(out) if out is not None else Path("runs") / "sweeps" / sweep.name
    out.mkdir(parents=True, exist_ok=True)
    jobs = max(1, jobs or os.cpu_count() or 1)
    started = time.perf_counter()
    scheduler = _Scheduler(sweep, out, jobs, data_dir, quiet)
    try:
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
                    reruns.append(_with_seed(spec, seed, order))
                    order += 1
        scheduler.run(reruns)
    finally:
        scheduler.close()
    best = write_best(out, sweep, scheduler.current, complete=True, wall_s=time.perf_counter() - started)
    if not quiet:
        for label, info in best["methods"].items():
            if info.get("median") is None:
                print(f"{label}: did not reach the target ({info['tried']})")
            else:
                print(f"{label}: median {info['median']} rounds (range {info['min']}-{info['max']}, "
                      f"{info['seeds_reached']}/{len(sweep.seeds)} seeds) with {info['settings']}")
        print(f"sweep {sweep.name}: {best['wall_s']:.1f} s; results in {out}/ ({RESULTS}, {BEST}, runs/)")
    return best


def _cmd_sweep(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise StlsgdError(f"--jobs: must be >= 1, got {args.jobs}")
    if args.limit is not None and args.limit < 1:
        raise StlsgdError(f"--limit: must be >= 1, got {args.limit}")
    run_sweep(args.config, Path(args.out) if args.out else None, jobs=args.jobs, data_dir=args.data_dir,
              quiet=args.quiet, only=args.only, limit=args.limit)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``stlsgd sweep CONFIG [--jobs J] [--out DIR] [--data-dir D] [--quiet]``."""
    p = subparsers.add_parser("sweep", help="run a hyper-parameter grid per method, pick the best, rerun seeds")
    p.add_argument("config", help="sweep file (.toml or .yaml): [base] experiment + [[methods]] grids")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: all CPUs)")
    p.add_argument("--out", help="output directory (default runs/sweeps/NAME)")
    p.add_argument("--data-dir", help="data directory (default $STLSGD_DATA or the user cache)")
    p.add_argument("--quiet", action="store_true", help="no line per finished run")
    p.add_argument("--only", action="append", metavar="LABEL", help="run only this row (repeatable)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="run only the first N settings of each row, in the file's order (a quick probe)")
    p.set_defaults(func=_cmd_sweep)


__all__ = ["MethodGrid", "RunSpec", "Sweep", "SweepSpec", "best_of", "config_key", "current_records", "execute",
           "load_sweep", "read_results", "register", "run_sweep", "summarize_best", "write_best"]
