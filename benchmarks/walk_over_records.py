"""What ``search = "descent"`` would choose on a grid already run in full, without running anything.

    .venv/bin/python benchmarks/walk_over_records.py SWEEP_FILE SWEEP_DIR

Feeds each row's walk (``experiments/sweeps/search.py``) the records of ``SWEEP_DIR/results.jsonl`` as if its
runs had just ended, and prints per row the full grid's best run (seed 0) against the walk's, the runs the walk
needed and their summed run time. A record the full grid pruned is read as it stands, though in a walk whose
best is worse it would have run on: the rows where that may have changed the walk are listed at the end.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stlsgd.experiments.sweeps import best_of, current_records, load_sweep, read_results
from stlsgd.experiments.sweeps.search import Descent
from stlsgd.experiments.sweeps.spec import settings_key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_file")
    parser.add_argument("sweep_dir")
    args = parser.parse_args()
    sweep = load_sweep(args.sweep_file)
    grid = [r for r in current_records(sweep, read_results(Path(args.sweep_dir))) if r["phase"] == "grid"]
    recorded = {(r["label"], settings_key(r["settings"])) for r in grid}
    walk = Descent(sweep, grid)
    while runs := walk.next_runs(set()):
        missing = [s for s in runs if (s.label, settings_key(s.settings)) not in recorded]
        if missing:
            raise SystemExit(f"{args.sweep_dir}: no record of {missing[0].label} {missing[0].settings}")
    walked = grid_runs = 0
    walked_s = grid_s = 0.0
    doubtful = []
    for label in sweep.labels:
        row = [r for r in grid if r["label"] == label]
        ran = [r for r in row if settings_key(r["settings"]) in walk.visited[label]]
        full, chosen = best_of(row, label), best_of(ran, label)
        walked, grid_runs = walked + len(ran), grid_runs + len(row)
        walked_s += sum(r["wall_s"] or 0.0 for r in ran)
        grid_s += sum(r["wall_s"] or 0.0 for r in row)

        def said(r: dict | None) -> str:
            return "not reached" if r is None else f"{r['rounds_to_target']} rounds with {r['settings']}"

        print(f"{label}: grid {said(full)}; walk {said(chosen)}; {len(ran)} of {len(row)} runs")
        if chosen is not None and any(
            r["status"] == "pruned" and r["rounds"] < chosen["rounds_to_target"] for r in ran
        ):
            doubtful.append(label)
    print(f"runs {walked} of {grid_runs}; summed run time {walked_s / 3600:.2f} h of {grid_s / 3600:.2f} h")
    if doubtful:
        print("pruned by the full grid below the walk's best (a walk would have run them on): " + ", ".join(doubtful))


if __name__ == "__main__":
    main()
