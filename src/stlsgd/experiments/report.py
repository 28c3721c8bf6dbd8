"""Tables and figures from finished sweeps, in the paper's layout (Table 2 / Figure 1, Table 3 / Figure 2).

``stlsgd report DIR [DIR ...] [--out OUTDIR] [--prefix NAME]`` reads each sweep directory's ``best.json`` and
the metrics of each row's best run (``DIR/runs/<key>/metrics.jsonl``) and writes:

- ``NAME.md`` and ``NAME.csv``: methods as rows, one column per sweep; each cell the median rounds to target
  over the seeds, their range, and the speedup against the SyncSGD row (median SyncSGD rounds / median
  rounds), as the paper's Tables 2 and 3;
- ``NAME_rounds.png``: the objective gap (training loss when the optimum is unknown) against rounds, one
  panel per sweep, the best setting of each method (Figures 1 and 2);
- ``NAME_epochs.png``: the same against epochs, samples processed by all clients / n (appendix figures).

The report is written whole or not at all: every file is built in a temporary folder beside the output
directory and moved in only when all succeeded (replacing the links or files of those names, and removing this
prefix's files an earlier report wrote that this one does not, such as ``NAME_latency.png`` without
``--network``); other files in the directory are left alone. A failure half-way leaves the old report as it was.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from stlsgd.costmodel import Network, check_profile_matches
from stlsgd.errors import StlsgdError
from stlsgd.experiments.plots import Curve, Panel, panels_figure
from stlsgd.experiments.sweeps.results import BEST, check_best, drawn_run_dir, read_results
from stlsgd.experiments.time_report import (
    compute_figure,
    crossovers,
    latency_figure,
    row_usages,
    sweep_title,
    time_cells,
    time_selected,
    unpriced_reason,
)
from stlsgd.files import current_umask, read_jsonl_numbered

log = logging.getLogger(__name__)

BASELINE_METHOD = "sync_sgd"
#: What a report named PREFIX writes: PREFIX + each of these (the files replaced or removed on the next one).
REPORT_FILES = (".md", ".csv", "_rounds.png", "_epochs.png", "_compute.png", "_latency.png")


def load_sweep_dir(directory: Path) -> dict[str, Any]:
    path = directory / BEST
    try:
        best = json.loads(path.read_text())
    except FileNotFoundError:
        raise StlsgdError(f"{path}: not found (run `stlsgd sweep` into {directory} first)") from None
    except json.JSONDecodeError as exc:
        raise StlsgdError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    best = check_best(path, best)
    best["_dir"] = directory
    return best


def _baseline(sweep: dict[str, Any]) -> float | None:
    for info in sweep["methods"].values():
        if info.get("method") == BASELINE_METHOD and info.get("median") is not None:
            return float(info["median"])
    return None


def _fmt(x: float) -> str:
    return f"{x:g}" if x != int(x) else str(int(x))


def table_rows(sweeps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (label, sweep): median/min/max rounds over the seeds and the speedup vs SyncSGD."""
    rows = []
    for sweep in sweeps:
        base = _baseline(sweep)
        for label, info in sweep["methods"].items():
            median = info.get("median")
            rows.append(
                {
                    "label": label,
                    "sweep": sweep["sweep"],
                    "median_rounds": median,
                    "min_rounds": info.get("min"),
                    "max_rounds": info.get("max"),
                    "seeds_reached": info.get("seeds_reached", 0),
                    "seeds": len(sweep.get("seeds", [])),
                    "speedup": (base / median) if (base and median) else None,
                    "settings": info.get("settings"),
                    "eval_every": info.get("eval_every"),
                    "edges": info.get("edges") or [],  # best.json of an older stlsgd has none
                }
            )
    return rows


def _labels(sweeps: list[dict[str, Any]]) -> list[str]:
    labels: list[str] = []
    for sweep in sweeps:
        labels += [label for label in sweep["labels"] if label not in labels]
    return labels


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    if row["median_rounds"] is None:
        return "— (not reached)"
    text = _fmt(row["median_rounds"])
    if row["min_rounds"] != row["max_rounds"]:
        text += f" [{row['min_rounds']}–{row['max_rounds']}]"
    if row["seeds_reached"] < row["seeds"]:
        text += f" ({row['seeds_reached']}/{row['seeds']} seeds)"
    if row["speedup"] is not None:
        text += f" ({row['speedup']:.1f}×)"
    return text


def markdown(sweeps: list[dict[str, Any]]) -> str:
    rows = table_rows(sweeps)
    names = [s["sweep"] for s in sweeps]
    by_key = {(r["label"], r["sweep"]): r for r in rows}
    target = _target_text(sweeps)
    unfinished = [s["sweep"] for s in sweeps if not s.get("complete", True)]
    lines = [
        f"Communication rounds to reach {target}: median over seeds {_seed_text(sweeps)} [range] "
        f"(speedup vs SyncSGD = median SyncSGD rounds / median rounds).",
        "",
        "| Algorithms | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label in _labels(sweeps):
        lines.append(f"| {label} | " + " | ".join(_cell(by_key.get((label, n))) for n in names) + " |")
    if unfinished:
        lines += [
            "",
            f"Incomplete sweeps (stopped before every grid run and seed rerun was done; the figures are "
            f"the best of the runs finished so far): {', '.join(unfinished)}.",
        ]
    lines += [
        "",
        "Chosen settings (the grid setting with the fewest rounds at seed 0; "
        "rounds are measured every `eval_every` rounds):",
        "",
        "| Algorithms | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label in _labels(sweeps):
        cells = []
        for n in names:
            row = by_key.get((label, n))
            if row is None or row["settings"] is None:
                cells.append("" if row is None else "—")
            else:
                edges = row["edges"]
                cells.append(
                    ", ".join(f"{k}={v}" + (" (edge)" if k in edges else "") for k, v in row["settings"].items())
                    + f" (eval every {row['eval_every']})"
                )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    at_edge = [f"{r['label']} ({r['sweep']}): {', '.join(r['edges'])}" for r in rows if r["edges"]]
    if at_edge:
        lines += [
            "",
            "(edge): chosen at the smallest or largest value of its grid's list, so a longer list might choose "
            "better: extend it, or say why not. " + "; ".join(at_edge) + ".",
        ]
    lines += [
        "",
        "Grid runs per row (reached / pruned / budget / diverged / failed, of the settings in the grid):",
        "",
        "| Algorithms | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label in _labels(sweeps):
        cells = []
        for sweep in sweeps:
            tried = sweep["methods"].get(label, {}).get("tried")
            cells.append(
                ""
                if not tried
                else " / ".join(str(tried.get(s, 0)) for s in ("reached", "pruned", "budget", "diverged", "failed"))
                + (f" of {tried['planned']}" if "planned" in tried else "")
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _target_text(sweeps: list[dict[str, Any]]) -> str:
    gaps = {float(s["target_gap"]) for s in sweeps if s.get("target_gap") is not None}
    accs = {float(s["target_accuracy"]) for s in sweeps if s.get("target_accuracy") is not None}
    parts = [f"objective gap {g:g}" for g in sorted(gaps)] + [f"training accuracy {a:g}" for a in sorted(accs)]
    return " / ".join(parts) or "the target"


def _seed_text(sweeps: list[dict[str, Any]]) -> str:
    seeds = sorted({tuple(s.get("seeds", [])) for s in sweeps})
    return " / ".join("{" + ", ".join(map(str, s)) + "}" for s in seeds)


def write_csv(sweeps: list[dict[str, Any]], path: Path) -> None:
    rows = table_rows(sweeps)
    fields = [
        "label",
        "sweep",
        "median_rounds",
        "min_rounds",
        "max_rounds",
        "seeds_reached",
        "seeds",
        "speedup",
        "eval_every",
        "settings",
        "edges",
    ]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            settings = json.dumps(row["settings"]) if row["settings"] else ""
            writer.writerow({**row, "settings": settings, "edges": " ".join(row["edges"])})


def _drawn(sweep: dict[str, Any]) -> list[tuple[str, dict[str, Any], Path]]:
    """(label, best.json entry, metrics file) of each row the figures draw: its chosen run, else its closest."""
    out = []
    for label, info in sweep["methods"].items():
        if (run_dir := drawn_run_dir(info)) is not None:
            out.append((label, info, sweep["_dir"] / run_dir / "metrics.jsonl"))
    return out


def warn_missing_runs(sweeps: list[dict[str, Any]]) -> None:
    """One warning for each drawn run whose metrics are missing: an archived sweep keeps results.jsonl and
    best.json, not its runs, and ``stlsgd replay`` draws them again."""
    for sweep in sweeps:
        for label, _, path in _drawn(sweep):
            if not path.is_file():
                log.warning(
                    "%s: missing: row %r is not drawn (stlsgd replay %s reruns the runs the figures draw)",
                    path,
                    label,
                    sweep["_dir"],
                )


def sparse_runs(sweeps: list[dict[str, Any]]) -> dict[Path, list[str]]:
    """Sweep directory -> the rows whose drawn run skipped evaluations (a sweep evaluates only where a run could
    reach the target, so their curves are a few points near it); sweeps with none left out."""
    sparse: dict[Path, list[str]] = {}
    for sweep in sweeps:
        for label, _, path in _drawn(sweep):
            try:
                evaluation = json.loads((path.parent / "summary.json").read_text()).get("evaluation") or {}
            except (OSError, ValueError, AttributeError):
                continue  # a missing or foreign summary: warn_missing_runs or the curves say what is wrong
            if isinstance(evaluation, dict) and evaluation.get("skipped"):
                sparse.setdefault(sweep["_dir"], []).append(label)
    return sparse


def sparse_note(sweeps: list[dict[str, Any]], sparse: dict[Path, list[str]]) -> str:
    """The figures' line above the curves when some of them come from sparsely evaluated runs ("" when none)."""
    titles = [sweep_title(sweep) for sweep in sweeps if sweep["_dir"] in sparse]
    if not titles:
        return ""
    return (
        f"{', '.join(titles)}: runs evaluated only where they could reach the target "
        "(stlsgd replay draws every evaluation)"
    )


def warn_sparse_runs(sparse: dict[Path, list[str]]) -> None:
    """One warning for each sweep whose drawn runs skipped evaluations (:func:`sparse_runs`)."""
    for directory, labels in sparse.items():
        log.warning(
            "%s: %d drawn run(s) evaluated only where they could reach the target (%s): their curves are those "
            "points; stlsgd replay %s reruns them with every evaluation",
            directory,
            len(labels),
            ", ".join(labels),
            directory,
        )


def _panels(sweeps: list[dict[str, Any]], x_key: str) -> list[Panel]:
    panels = []
    for sweep in sweeps:
        has_gap = sweep.get("target_gap") is not None
        panel = Panel(
            sweep_title(sweep),
            "objective gap f(x) - f*" if has_gap else "training loss",
            target=sweep.get("target_gap") if has_gap else None,
        )
        for label, info, path in _drawn(sweep):
            if not path.is_file():  # warned of once by warn_missing_runs
                continue
            rows = []
            for lineno, row in read_jsonl_numbered(path):
                if (
                    not isinstance(row, dict)
                    or isinstance(row.get("round"), bool)
                    or not isinstance(row.get("round"), (int, float))
                ):
                    raise StlsgdError(
                        f"{path}:{lineno}: not a metrics line (no number 'round'); rerun that run, or remove the line"
                    )
                rows.append(row)
            if not rows:
                continue
            y_key = "gap" if has_gap and rows[0].get("gap") is not None else "objective"
            try:
                xs = [_x(r, x_key, sweep) for r in rows]
            except (KeyError, TypeError, ValueError) as err:  # a foreign line: one line, not a traceback
                raise StlsgdError(
                    f"{path}: a metrics line without a number {err}: cannot place it on the {x_key} axis; "
                    "rerun that run"
                ) from None
            reached = bool(info.get("run_dir"))
            panel.curves.append(Curve(label, xs, [r.get(y_key) for r in rows], info.get("method") or "", reached))
        panels.append(panel)
    return panels


def _x(row: dict[str, Any], key: str, sweep: dict[str, Any]) -> float:
    if key == "round":
        return float(row["round"])
    if "epochs" in row:
        return float(row["epochs"])
    # Runs written without a sample count: every round so far had this round's batch.
    return row["iteration"] * row["batch"] * sweep["num_clients"] / sweep["num_samples"]


def usage_section(sweeps: list[dict[str, Any]]) -> str:
    """Computation and communication to the target: median client-steps and MiB one client sent, per row."""
    names = [s["sweep"] for s in sweeps]
    usages = {s["sweep"]: {r.label: r for r in row_usages(s)} for s in sweeps}
    lines = [
        "",
        "Computation and communication to the target (median over the seeds that reached it): client-steps "
        "(samples one client processed) / MiB one client sent:",
        "",
        "| Algorithms | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label in _labels(sweeps):
        cells = []
        for n in names:
            row = usages[n].get(label)
            cells.append(
                ""
                if row is None
                else "—"
                if row.usage is None
                else f"{row.usage.client_steps:.3g} / {row.usage.bytes_per_client / 2**20:.3g}"
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def time_section(sweeps: list[dict[str, Any]], network: Network, select: str) -> str:
    """Predicted time to target on ``network`` (median usage of the rounds-chosen setting, or with
    ``select="time"`` the grid run with the least predicted time), and the crossover latencies."""
    names = [s["sweep"] for s in sweeps]
    if select == "time":
        cells = {s["sweep"]: time_selected(s, read_results(s["_dir"]), network) for s in sweeps}
        what = "the grid run (seed 0) with the least predicted time"
    else:
        cells = {s["sweep"]: time_cells(s, network) for s in sweeps}
        what = "the rounds-chosen setting, median usage over its seeds"
    lines = [
        "",
        f"Predicted time to target on {network.name} (latency {network.latency_s:g} s a round, bandwidth "
        f"{network.bandwidth_Bps:g} B/s, step {_step_text(network)}; {what}):",
        "",
        "| Algorithms | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label in _labels(sweeps):
        lines.append(f"| {label} | " + " | ".join(cells[n].get(label, "") for n in names) + " |")
    lines += [
        "",
        "Crossover latencies (STL-SGD rows against Local SGD, SyncSGD and LB-SGD, at this bandwidth and step cost):",
        "",
    ]
    for s in sweeps:
        lines += [f"- {s['sweep']}: {line}" for line in crossovers(s, network)]
    notes = [f"{s['_dir'] / BEST}: {reason}" for s in sweeps if (reason := unpriced_reason(s)) is not None]
    for note in notes:  # a "—" must never go unexplained
        log.warning("%s", note)
    if notes:
        lines += ["", *(f"Note: {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def _step_text(network: Network) -> str:
    return "not given" if network.step_s is None else f"{network.step_s:g} s a client-step"


def write_report(
    dirs: list[Path], out: Path, prefix: str = "table", *, network: Network | None = None, select: str = "rounds"
) -> list[Path]:
    """Write NAME.md (with the computation and communication to the target), NAME.csv, NAME_rounds.png,
    NAME_epochs.png and NAME_compute.png (rounds against client-steps), and with a ``network`` the predicted time
    to target (in NAME.md) and NAME_latency.png (time against latency); returns their paths."""
    if select not in ("rounds", "time"):
        raise StlsgdError(f"--select: rounds or time, got {select!r}")
    if select == "time" and network is None:
        raise StlsgdError("--select time: needs --network (the times are predicted by the cost model)")
    if not dirs:
        raise StlsgdError("report: give at least one sweep directory")
    if not prefix or "/" in prefix or "\\" in prefix or prefix in (".", "..") or not prefix.isprintable():
        raise StlsgdError(f"--prefix: a plain file name prefix (no '/', no control characters), got {prefix!r}")
    sweeps = [load_sweep_dir(Path(d)) for d in dirs]
    for sweep in sweeps:
        if not read_results(sweep["_dir"]):
            raise StlsgdError(f"{sweep['_dir'] / 'results.jsonl'}: no results")
    if out.exists() and not out.is_dir():
        raise StlsgdError(f"{out}: exists and is not a directory; choose another --out")
    if network is not None:
        for s in sweeps:
            check_profile_matches(network, {"dataset": s["dataset"]})
    # Everything above only read; from here the report is built aside and moved in whole (module docstring).
    target = Path(os.path.realpath(out)) if out.is_symlink() else out
    created = _make_parents(target.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".report-tmp", dir=target.parent))
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; the report is shared like any other folder
    except OSError as err:
        _remove_empty(created)
        raise StlsgdError(f"{out}: cannot create the output directory ({err.strerror or err})") from None
    try:
        names = _build(sweeps, tmp, prefix, network, select)
        _swap_in(tmp, target, prefix, names)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise
    return [out / name for name in names]


def _build(sweeps: list[dict[str, Any]], into: Path, prefix: str, network: Network | None, select: str) -> list[str]:
    """Write every file of the report into the folder ``into``; return their names."""
    md, csv_path = into / f"{prefix}.md", into / f"{prefix}.csv"
    text = markdown(sweeps) + usage_section(sweeps)
    if network is not None:
        text += time_section(sweeps, network, select)
    md.write_text(text)
    write_csv(sweeps, csv_path)
    warn_missing_runs(sweeps)
    sparse = sparse_runs(sweeps)
    note = sparse_note(sweeps, sparse)
    rounds = panels_figure(
        _panels(sweeps, "round"), "communication rounds", into / f"{prefix}_rounds.png", log_x=True, note=note
    )
    epochs = panels_figure(
        _panels(sweeps, "epochs"),
        "epochs (samples by all clients / n)",
        into / f"{prefix}_epochs.png",
        log_x=True,
        note=note,
    )
    written = [md, csv_path, rounds, epochs, compute_figure(sweeps, into / f"{prefix}_compute.png", network)]
    if network is not None:
        written.append(latency_figure(sweeps, network, into / f"{prefix}_latency.png"))
    warn_sparse_runs(sparse)  # once everything is written: a report that fails says only why
    return [p.name for p in written]


def _swap_in(tmp: Path, target: Path, prefix: str, names: list[str]) -> None:
    """The finished report in ``tmp`` becomes ``target``: renamed whole when there is no ``target`` yet, else
    file by file (``os.replace`` replaces a link itself, never its target), and this prefix's files that the
    new report does not have are removed."""
    if not target.exists():
        os.replace(tmp, target)
        return
    for name in names:
        os.replace(tmp / name, target / name)
    for suffix in REPORT_FILES:
        stale = target / f"{prefix}{suffix}"
        if f"{prefix}{suffix}" not in names and (stale.is_symlink() or stale.is_file()):
            stale.unlink()
    tmp.rmdir()


def _make_parents(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing parents; return those created, deepest first."""
    missing = []
    probe = directory
    while not probe.exists() and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StlsgdError(f"{directory}: cannot create the output directory ({err.strerror or err})") from None
    return missing


def _remove_empty(created: list[Path]) -> None:
    """Remove the folders a failed report created (deepest first), if still empty."""
    for directory in created:
        try:
            directory.rmdir()
        except OSError:
            return
