"""Time to target from finished sweeps: what each row's runs computed and communicated, priced by a network.

For every row of a sweep (its chosen setting, every seed that reached the target) the usage at the target is
(rounds, bytes one client sent, samples one client processed). Sweeps recorded by this stlsgd carry those in
``best.json``; for older ones they are rebuilt from the sweep file: the plan is replayed to the recorded round
(client-steps), and rounds times the model's size gives the bytes (twice with drift correction). The cost
model (:mod:`stlsgd.costmodel`) turns a usage into seconds; the crossover latency of two rows is the round
latency at which they take the same time.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stlsgd.costmodel import Network, Usage, crossover_latency, predict
from stlsgd.errors import StlsgdError
from stlsgd.experiments.build import model_bytes_for, plan_context
from stlsgd.experiments.config import Experiment, read_raw
from stlsgd.experiments.plots import Curve, Panel, Point, PointPanel, duration, panels_figure, points_figure
from stlsgd.experiments.sweeps.results import sweep_file_of


@dataclass(frozen=True)
class RowUsage:
    """A row's median usage at the target over the seeds that reached it (None: no seed reached it)."""

    label: str
    method: str
    usage: Usage | None
    seeds: int
    unpriced: int = 0  # seeds that reached the target but whose client-steps and bytes are neither recorded nor rebuilt


def _rebuilt(best: dict[str, Any], label: str, info: dict[str, Any], seed: str, rec: dict[str, Any]) -> Usage | None:
    """Client-steps and bytes of one seed run rebuilt from its sweep file (sweeps of an older stlsgd)."""
    from stlsgd.experiments.sweeps import load_sweep

    source = sweep_file_of(best)
    if source is None:
        return None
    spec = next((s for s in load_sweep(source).grid if s.label == label and s.settings == info["settings"]), None)
    if spec is None:
        return None
    exp = Experiment.model_validate({**spec.config, "run": {**spec.config["run"], "seed": int(seed)}})
    size = model_bytes_for(exp)
    if size is None:
        return None
    n = best["num_samples"]
    lam = exp.problem.lam or (1.0 / n if exp.problem.kind == "logistic" else None)
    plan = exp.algorithm.plan(plan_context(exp, n, lam))
    rounds = int(rec["rounds_to_target"])
    steps = 0
    for rnd in plan.rounds():
        if rnd.index >= rounds:
            break
        steps += rnd.steps * rnd.batch
    drift = 2 if getattr(exp.algorithm, "drift", False) else 1
    return Usage(rounds, rounds * size * drift, steps)


def row_usages(best: dict[str, Any]) -> list[RowUsage]:
    """Every row of a sweep's best.json with its median usage at the target."""
    out = []
    for label, info in best["methods"].items():
        usages = []
        unpriced = 0
        for seed, rec in (info.get("seeds") or {}).items():
            if rec.get("status") != "reached":
                continue
            if rec.get("client_steps") is not None and rec.get("bytes_per_client") is not None:
                usages.append(Usage(rec["rounds_to_target"], rec["bytes_per_client"], rec["client_steps"]))
            else:
                rebuilt = _rebuilt(best, label, info, seed, rec)
                if rebuilt is not None:
                    usages.append(rebuilt)
                else:
                    unpriced += 1
        median = Usage(*(statistics.median(u[i] for u in usages) for i in range(3))) if usages else None
        out.append(RowUsage(label, info.get("method") or "", median, len(usages), unpriced))
    return out


def unpriced_reason(best: dict[str, Any]) -> str | None:
    """Why rows whose seeds reached the target have no usage (so a time cell shows "—"), in one line; None when
    every such seed is priced."""
    rows = [r.label for r in row_usages(best) if r.unpriced]
    if not rows:
        return None
    which = f"{len(rows)} row{'s' if len(rows) > 1 else ''} ({', '.join(rows[:3])}{', ...' if len(rows) > 3 else ''})"
    named = best.get("config") or "(none recorded)"
    if sweep_file_of(best) is None:
        return (
            f"{which} record no client-steps or bytes (a sweep of an older stlsgd) and the sweep file it names, "
            f"{named}, is not found under the working directory or any folder above the sweep, so they cannot be "
            f"rebuilt and their times show as —; run the report from the folder that holds {named}"
        )
    return (
        f"{which} record no client-steps or bytes and their settings are not in the sweep file {named} any more, "
        "so they cannot be rebuilt and their times show as —"
    )


def time_cells(best: dict[str, Any], network: Network) -> dict[str, str]:
    """Per row: predicted time to target (latency + transfer + compute) as a table cell."""
    cells = {}
    for row in row_usages(best):
        if row.usage is None:
            cells[row.label] = "—"
            continue
        b = predict(*row.usage, network)
        cells[row.label] = (
            f"{_seconds(b.total_s)} ({_seconds(b.latency_s)} latency + {_seconds(b.transfer_s)} "
            f"transfer + {_seconds(b.compute_s)} compute)"
        )
    return cells


def crossovers(
    best: dict[str, Any], network: Network, against: tuple[str, ...] = ("local_sgd", "sync_sgd", "lb_sgd")
) -> list[str]:
    """Lines 'row A vs row B: A is faster above alpha*' for every STL-SGD row against the baseline methods."""
    rows = [(r, r.usage) for r in row_usages(best) if r.usage is not None]
    lines = []
    for a, ua in rows:
        if not a.method.startswith("stl"):
            continue
        for b, ub in rows:
            if b.method not in against:
                continue
            alpha = crossover_latency(ua, ub, network)
            faster = ua.rounds < ub.rounds
            if alpha is None:
                winner = a.label if predict(*ua, network).total_s <= predict(*ub, network).total_s else b.label
                lines.append(f"{a.label} vs {b.label}: {winner} is faster at every latency")
            else:
                fewer, more = (a.label, b.label) if faster else (b.label, a.label)
                lines.append(
                    f"{a.label} vs {b.label}: {fewer} is faster above {_seconds(alpha)} per round, {more} below"
                )
    return lines


def time_selected(best: dict[str, Any], records: list[dict[str, Any]], network: Network) -> dict[str, str]:
    """Per row, the grid run (seed 0) that reached the target in the least predicted time, as a table cell.

    The seed reruns of a sweep are of each row's rounds-best setting, so a time-chosen setting has one seed."""
    cells = {}
    for label in best["methods"]:
        timed = []
        for r in records:
            if r["label"] != label or r["phase"] != "grid" or r["status"] != "reached":
                continue
            usage: Usage | None
            if r.get("client_steps") is not None and r.get("bytes_per_client") is not None:
                usage = Usage(r["rounds_to_target"], r["bytes_per_client"], r["client_steps"])
            else:
                usage = _rebuilt(best, label, {"settings": r["settings"]}, str(r["seed"]), r)
            if usage is not None:
                timed.append((predict(*usage, network).total_s, r, usage))
        if not timed:
            cells[label] = "—"
            continue
        total, r, usage = min(timed, key=lambda t: t[0])
        where = ", ".join(f"{k}={v}" for k, v in r["settings"].items())
        cells[label] = f"{_seconds(total)}: {usage.rounds:g} rounds, {usage.client_steps:.3g} client-steps ({where})"
    return cells


# What the paper calls its datasets (Section 5); a name not here is shown as it is.
DATASET_NAMES = {
    "a9a": "a9a",
    "mnist49": "MNIST 4 vs 9",
    "mnist10": "MNIST",
    "cifar10": "CIFAR-10",
    "cifar10-png200": "CIFAR-10 (200 images)",
    "digits49": "digits 4 vs 9",
}
PARTITION_NAMES = {
    "shared": "IID",
    "split": "IID, fixed split",
    "noniid": "Non-IID",
    "dirichlet": "Non-IID, Dirichlet",
}


def default_title(dataset: str | None, partition: str | None) -> str:
    """'a9a (IID)', 'MNIST 4 vs 9 (Non-IID)': the dataset and partition as the paper names its columns."""
    name = DATASET_NAMES.get(dataset or "", Path(dataset).stem if dataset else "sweep")
    return f"{name} ({PARTITION_NAMES.get(partition or '', partition)})" if partition else name


def sweep_title(best: dict[str, Any]) -> str:
    """A sweep's panel title: best.json's ``title``, else the ``title`` of its sweep file (when that file is
    found and still names this sweep), else :func:`default_title` of its dataset and partition."""
    if best.get("title"):
        return str(best["title"])
    source = sweep_file_of(best)
    if source is not None:
        try:
            raw = read_raw(source)
        except (StlsgdError, OSError):
            raw = {}
        title = raw.get("title")
        if raw.get("name") == best.get("sweep") and isinstance(title, str) and title.strip():
            return title.strip()
    return default_title(best.get("dataset"), best.get("partition"))


def latency_figure(sweeps: list[dict[str, Any]], network: Network, path: Path) -> Path:
    """Predicted time to target against the round latency, one column of panels per sweep, one line per row
    (log-log), the network's own latency marked."""
    latencies = [10 ** (e / 4) for e in range(-24, 5)]  # 1 us .. 10 s
    panels = []
    for best in sweeps:
        panel = Panel(sweep_title(best), "time to target (s)")
        for row in row_usages(best):
            if row.usage is None:
                continue
            ys = [predict(*row.usage, Network(a, network.bandwidth_Bps, network.step_s)).total_s for a in latencies]
            panel.curves.append(Curve(row.label, latencies, ys, row.method))
        panels.append(panel)
    note = (
        f"Predicted time to target at bandwidth {network.bandwidth_Bps * 8 / 1e9:g} Gbit/s and "
        f"{duration(network.step_s or 0)} a client-step (lower is faster)"
    )
    vline = (network.latency_s, f"{network.name} latency ({duration(network.latency_s)})")
    return panels_figure(panels, "latency per round (s)", path, log_x=True, vline=vline, note=note)


def compute_figure(sweeps: list[dict[str, Any]], path: Path, network: Network | None = None) -> Path:
    """Rounds to target against client-steps to target (the computation each saved round costs), log-log,
    each row a labelled point, the Pareto front drawn; with a ``network`` (and its step cost) each row's
    predicted time and the lines of equal predicted time, rounds * (alpha + model bytes / beta) + steps * c."""
    return points_figure(compute_panels(sweeps, network), path)


def compute_panels(sweeps: list[dict[str, Any]], network: Network | None = None) -> list[PointPanel]:
    """The panels of :func:`compute_figure`: one per sweep, one point per row that reached the target."""
    panels = []
    for best in sweeps:
        panel = PointPanel(sweep_title(best))
        rows = [r for r in row_usages(best) if r.usage is not None]
        priced = network is not None and network.step_s is not None
        for row in rows:
            assert row.usage is not None
            t = predict(*row.usage, network).total_s if priced and network is not None else None
            panel.points.append(
                Point(row.label, row.usage.client_steps, row.usage.rounds, row.method, t, duration(t) if t else "")
            )
        if priced and network is not None and rows:
            # One line serves every row: a round costs the model's bytes (rows with drift correction send twice
            # that, so their point lies a little optimistic against the lines; their label holds their own time).
            per_round = min(r.usage.bytes_per_client / r.usage.rounds for r in rows if r.usage and r.usage.rounds)
            panel.round_s = network.latency_s + per_round / network.bandwidth_Bps
            panel.step_s = network.step_s
            panel.network = f"{network.name} (step {duration(network.step_s or 0)})"
        panels.append(panel)
    return panels


def _seconds(s: float) -> str:
    if s == 0 or not math.isfinite(s):
        return f"{s:g} s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"
