"""A sweep's results: ``results.jsonl`` (one record per finished run), the choice of each row's best setting
and ``best.json``."""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from stlsgd.errors import StlsgdError
from stlsgd.experiments.records import RECORD_STATUSES, Number, RunSummary, SweepRecord, record_problem
from stlsgd.experiments.sweeps.spec import RunSpec, Sweep, grid_edges, settings_key, with_seed
from stlsgd.files import append_jsonl, read_jsonl_numbered, write_json_atomic

log = logging.getLogger(__name__)

RESULTS = "results.jsonl"
BEST = "best.json"
STATUSES = RECORD_STATUSES

# What a record copies from the run's summary; a config already run under another label reuses them.
RESULT_FIELDS = (
    "status",
    "rounds_to_target",
    "iterations_to_target",
    "rounds",
    "iterations",
    "client_steps",
    "bytes_per_client",
    "final_gap",
    "final_objective",
    "final_accuracy",
    "num_samples",
    "wall_s",
    "run_dir",
    "error",
)


class _Strict(BaseModel):
    # Strict: a field of the wrong type is refused, not coerced ("3" is not 3); fields a later stlsgd adds pass.
    model_config = ConfigDict(strict=True, extra="allow")


class _SeedBest(_Strict):
    status: StrictStr
    rounds_to_target: StrictInt | None = None
    iterations_to_target: StrictInt | None = None
    client_steps: StrictInt | None = None
    bytes_per_client: Number | None = None
    run_dir: StrictStr | None = None


class _MethodBest(_Strict):
    method: StrictStr | None = None
    settings: dict[str, Any] | None = None
    seeds: dict[str, _SeedBest] = {}
    median: Number | None = None
    min: Number | None = None
    max: Number | None = None
    tried: dict[str, StrictInt] = {}
    edges: list[StrictStr] = []


class BestFile(_Strict):
    """``best.json``, as the report reads it."""

    sweep: StrictStr
    dataset: StrictStr
    labels: list[StrictStr]
    methods: dict[str, _MethodBest]
    seeds: list[StrictInt]
    num_clients: StrictInt | None = None
    num_samples: StrictInt | None = None
    target_gap: Number | None = None


def check_best(path: Path, best: Any) -> dict[str, Any]:
    """``best`` (read from ``path``) as a dict with every field the report needs, or a one-line error."""
    try:
        BestFile.model_validate(best)
    except ValidationError as err:
        raise StlsgdError(
            f"{path}: not a best.json stlsgd sweep wrote ({record_problem(err)}); "
            f"rerun `stlsgd sweep` into {path.parent}"
        ) from None
    for label in best["labels"]:
        if label not in best["methods"]:
            raise StlsgdError(f"{path}: labels names {label!r}, which methods lacks; rerun `stlsgd sweep`")
    return dict(best)


def read_results(out: Path) -> list[dict[str, Any]]:
    """Every record of ``OUT/results.jsonl``. A line torn by a crash, or a record that is not a sweep result
    (another tool's line, a hand edit), is skipped with a warning naming the line: its run is simply redone."""
    path = out / RESULTS
    records = []
    for number, raw in read_jsonl_numbered(path):  # torn and malformed lines: skipped there, with a warning
        try:
            records.append(SweepRecord.model_validate(raw).to_json())
        except ValidationError as err:
            log.warning("%s:%d: skipping a line that is not a sweep result (%s)", path, number, record_problem(err))
    return records


def append_result(out: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append ``record`` to ``OUT/results.jsonl`` and return it as written; a record missing a field, or of
    a wrong type, is refused here (a ValidationError), before the line is written."""
    line = SweepRecord.model_validate(record).to_json()
    append_jsonl(out / RESULTS, line)
    return line


def make_record(spec: RunSpec, summary: dict[str, Any] | None, error: str | None) -> dict[str, Any]:
    """The results.jsonl line of one run (``summary`` None: the run failed with ``error``).

    ``client_steps`` and ``bytes_per_client`` are counted at the run's last evaluation: the target when it
    was reached.
    """
    # A summary is checked again here: the run may have come back from another process or machine.
    s = {} if summary is None else RunSummary.model_validate(summary).to_json()
    final = s.get("final") or {}
    return SweepRecord.model_validate(
        {
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
            "client_steps": final.get("client_steps"),
            "bytes_per_client": final.get("bytes_per_client"),
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
    ).to_json()


def current_records(sweep: Sweep, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of runs that this version of the sweep file asks for.

    ``results.jsonl`` also keeps the runs of earlier versions of the file (a grid value, budget or fixed
    field since edited): they stay on disk, but a setting's old config must neither be chosen, nor counted,
    nor bound the pruning of its new one.
    """
    grid = {(s.label, s.key) for s in sweep.grid}
    by_setting = {(s.label, settings_key(s.settings)): s for s in sweep.grid}
    kept = []
    for r in records:
        if r["phase"] == "grid":
            current = (r["label"], r["key"]) in grid
        else:
            spec = by_setting.get((r["label"], settings_key(r["settings"])))
            current = spec is not None and r["key"] == with_seed(spec, r["seed"], 0).key
        if current:
            kept.append(r)
    return kept


def best_of(records: list[dict[str, Any]], label: str) -> dict[str, Any] | None:
    """The label's grid run with the fewest rounds to target (ties: fewer iterations, then grid order)."""
    reached = [r for r in records if r["label"] == label and r["phase"] == "grid" and r["status"] == "reached"]
    if not reached:
        return None
    return min(reached, key=lambda r: (r["rounds_to_target"], r["iterations_to_target"], r["order"]))


def describe(record: dict[str, Any]) -> str:
    """One line per finished run, as the sweep prints it."""
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


def closest_record(tried: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run nearest the target: lowest final gap, else loss (None when no run has either)."""

    def score(r: dict[str, Any]) -> float | None:
        return r["final_gap"] if r["final_gap"] is not None else r["final_objective"]

    return min((r for r in tried if score(r) is not None), key=lambda r: float(score(r) or 0.0), default=None)


def _closest(tried: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What best.json keeps of an unreached row's closest run (the figures draw it)."""
    closest = closest_record(tried)
    if closest is None:
        return None
    return {k: closest[k] for k in ("settings", "status", "rounds", "final_gap", "final_objective", "run_dir")}


def summarize_best(sweep: Sweep, records: list[dict[str, Any]]) -> dict[str, Any]:
    """best.json: per label the chosen setting and the rounds to target of each seed (median and range)."""
    methods: dict[str, Any] = {}
    n = next((r["num_samples"] for r in records if r.get("num_samples")), None)
    for label in sweep.labels:
        best = best_of(records, label)
        tried = [r for r in records if r["label"] == label and r["phase"] == "grid"]
        counts: dict[str, int] = {s: sum(r["status"] == s for r in tried) for s in STATUSES}
        counts["planned"] = sum(s.label == label for s in sweep.grid)
        if best is None:
            methods[label] = {
                "method": next((r["method"] for r in tried), None),
                "settings": None,
                "tried": counts,
                "closest": _closest(tried),
            }
            continue
        runs: dict[str, Any] = {}
        for seed in sweep.seeds:
            rec = (
                best
                if seed == best["seed"]
                else next(
                    (
                        r
                        for r in records
                        if r["label"] == label
                        and r["phase"] == "seed"
                        and r["seed"] == seed
                        and r["settings"] == best["settings"]
                    ),
                    None,
                )
            )
            if rec is not None:
                runs[str(seed)] = {
                    k: rec.get(k)
                    for k in (
                        "status",
                        "rounds_to_target",
                        "iterations_to_target",
                        "client_steps",
                        "bytes_per_client",
                        "run_dir",
                    )
                }
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
            # settings chosen at the smallest or largest value of their grid's list: extend it, or say why not
            "edges": grid_edges(best["settings"], sweep.grids.get(label, {})),
        }
    run_cfg = sweep.grid[0].config["run"]
    data_cfg = sweep.grid[0].config["data"]
    return {
        "sweep": sweep.name,
        "config": recorded_path(sweep.source),
        "dataset": data_cfg["dataset"],
        "partition": data_cfg["partition"],
        "num_clients": data_cfg["num_clients"],
        "num_samples": n,
        "target_gap": run_cfg["target_gap"],
        "target_accuracy": run_cfg["target_accuracy"],
        "seeds": sweep.seeds,
        "search": sweep.search,
        "labels": sweep.labels,
        "methods": methods,
    }


def recorded_path(source: Path) -> str:
    """The sweep file as best.json names it: relative to the working directory when it lies under it (so a
    checkout moved or cloned elsewhere still finds it, :func:`sweep_file_of`, and no record names this
    machine's folders), else as given: only that path finds it."""
    try:
        return str(source.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(source)


def write_best(
    out: Path, sweep: Sweep, records: list[dict[str, Any]], *, complete: bool, wall_s: float | None = None
) -> dict[str, Any]:
    """Write OUT/best.json atomically; ``complete`` is False while grid or seed runs are still to come."""
    best = {**summarize_best(sweep, records), "complete": complete}
    if wall_s is not None:
        best["wall_s"] = round(wall_s, 1)
    write_json_atomic(out / BEST, best)
    return best


def sweep_file_of(best: dict[str, Any]) -> Path | None:
    """The sweep file best.json names: as recorded, or (recorded relative to the directory the sweep ran from, or
    on another machine) that path, or its ``configs/...`` tail, under the working directory or a folder above
    the sweep's own."""
    path = Path(best.get("config", ""))
    if path.is_file():
        return path
    parts = path.parts
    tails = [] if path.is_absolute() else [path]
    if "configs" in parts:
        tails.append(Path(*parts[parts.index("configs") :]))
    roots = [Path.cwd()]
    if "_dir" in best:
        roots += list(Path(best["_dir"]).resolve().parents)
    return next((root / tail for tail in tails for root in roots if (root / tail).is_file()), None)


def drawn_run_dir(info: dict[str, Any]) -> str | None:
    """The run the report draws for a row of best.json (``info``): its chosen run, else its closest one (a row
    that never reached the target); None when the row has neither."""
    run_dir = info.get("run_dir") or (info.get("closest") or {}).get("run_dir")
    return str(run_dir) if run_dir else None
