"""``stlsgd demo``: SyncSGD, Local SGD and STL-SGD^sc on the embedded digits (4 vs 9) data.

Needs no download: scikit-learn bundles the digits. 16 clients sample from the whole training set (IID
``shared``), batch 1, lambda = 1/n, target objective gap 1e-4 -- Table 2's protocol at toy scale, with one
good setting per method (eta_1 = N/10; alpha and k picked from the paper's grids by a small sweep).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stlsgd.errors import StlsgdError
from stlsgd.experiments.config import Experiment
from stlsgd.experiments.runner import run_experiment
from stlsgd.files import refuse_links

BASE = {
    "data": {"dataset": "digits49", "num_clients": 16, "partition": "shared"},
    "run": {"seed": 0, "target_gap": 1e-4, "max_iterations": 200_000},
}
METHODS: dict[str, dict[str, Any]] = {
    "SyncSGD": {"method": "sync_sgd", "lr": 1.6, "lr_decay": 1e-3},
    "Local SGD": {"method": "local_sgd", "lr": 1.6, "lr_decay": 1e-2, "k": 32},
    "STL-SGD^sc": {"method": "stl_sc", "lr": 1.6, "k": 32},
}


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse, before anything is written, an ``out`` that is a file, holds a symbolic link, or already holds
    one of the demo's runs (unless ``overwrite``): the demo replaces its runs, and asks first."""
    if out.exists() and not out.is_dir():
        raise StlsgdError(f"{out}: exists and is not a directory; choose another --out")
    if not out.is_dir():
        return
    refuse_links(out)
    if overwrite:
        return
    for algorithm in METHODS.values():
        run_dir = out / algorithm["method"]
        if run_dir.is_dir() and any(p.name != ".stlsgd.lock" for p in run_dir.iterdir()):
            raise StlsgdError(
                f"{run_dir}: already holds a run; pass --overwrite to replace the demo's runs, or choose another --out"
            )


def demo(out: Path, progress: bool = True, overwrite: bool = False) -> list[dict]:
    """Run the three methods, print a rounds-to-target table and write ``out/demo.png``.

    Runs already in ``out`` are replaced only with ``overwrite``; an ``out`` holding a symbolic link is refused.
    """
    check_out(out, overwrite)
    summaries = []
    for label, algorithm in METHODS.items():
        exp = Experiment.model_validate({**BASE, "name": f"demo-{algorithm['method']}", "algorithm": algorithm})
        summary = run_experiment(exp, out / algorithm["method"], overwrite=True, progress=progress)
        assert summary is not None  # one process: it writes and returns the summary
        summaries.append({"label": label, **summary})
    base = summaries[0]["rounds_to_target"]
    print(f"{'method':<12} {'rounds to gap 1e-4':>19} {'iterations':>11} {'speedup':>8}")
    for s in summaries:
        rounds = s["rounds_to_target"]
        speedup = f"{base / rounds:.1f}x" if rounds and base else "-"
        print(f"{s['label']:<12} {rounds if rounds else s['status']:>19} {s['iterations']:>11} {speedup:>8}")
    figure = _plot(out, summaries)
    print(f"plot: {figure}")
    return summaries


def _plot(out: Path, summaries: list[dict]) -> Path:
    from stlsgd.experiments.plots import Curve, Panel, panels_figure
    from stlsgd.files import read_jsonl

    panel = Panel("digits 4 vs 9, 16 clients (IID shared)", "objective gap f(x) - f*", target=1e-4)
    for s in summaries:
        points = read_jsonl(out / s["method"] / "metrics.jsonl")
        panel.curves.append(Curve(s["label"], [p["round"] for p in points], [p["gap"] for p in points]))
    # Drawn under a fresh name and renamed over demo.png: a link there is replaced, never written through.
    tmp = out / f".demo.{os.getpid()}.png"
    try:
        panels_figure([panel], "communication rounds", tmp, log_x=True)
        os.replace(tmp, out / "demo.png")
    finally:
        tmp.unlink(missing_ok=True)
    return out / "demo.png"
