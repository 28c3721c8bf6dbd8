"""A walk through each row's grid instead of all of it (``search = "descent"`` in a sweep file).

A full grid costs the product of its lists' lengths; a fair grid (periods doubled to 2^14 steps and beyond, every
lr's neighbours) costs hundreds of runs a row. The walk runs a row's first setting (each list's first value, the
likeliest as the file orders them) and its neighbours: every setting with each list's value kept or moved one
step (in a list of numbers, to the next value up or down; in any other list, to any value), diagonals included.
It then moves to the best settings run so far (fewest rounds to target, all of them when several tie, so that a
plateau of equal round counts is crossed; if none reached, the lowest final gap) and runs their neighbours not
yet run, until the best ones' neighbours have all run. The chosen setting is then as good as or better than each
of its neighbours -- what a fair grid asks of a chosen setting -- and, when it sits at the end of a list,
``best.json`` names the edge as it does for a full grid.

The walk is a local search: a grid with two separate valleys may hold a better setting it never reaches. Moving
one list at a time was not enough on Table 2+'s a9a grids (STL-SGD^sc + drift stopped at 10 and 95 rounds
where the grid's best is 6 and 70: the way there changes two lists at once), hence the diagonals.
Where it goes depends only on the records of the settings it ran, which are deterministic (pruning stops only
runs with more rounds than a finished run of their row, and those are never the best), so the same file walks
the same path on a local pool or a Dask cluster, and a killed sweep resumes along it.
"""

from __future__ import annotations

import itertools
from typing import Any

from stlsgd.experiments.sweeps.results import best_of, closest_record
from stlsgd.experiments.sweeps.spec import RunSpec, Sweep, is_number, settings_key


def neighbours(settings: dict[str, Any], grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The settings around ``settings`` in ``grid``: each list's value kept or moved one step (in a list of
    numbers, to the next value up or down; in any other list, to any value), at least one moved."""
    steps: list[list[Any]] = []
    for name, values in grid.items():
        here = settings[name]
        if all(is_number(v) for v in values):
            ordered = sorted(set(values))
            i = ordered.index(here)
            steps.append(ordered[max(i - 1, 0) : i + 2])
        else:
            steps.append(list(dict.fromkeys(values)))
    names = list(grid)
    around = (dict(zip(names, values)) for values in itertools.product(*steps))
    return [{**settings, **s} for s in around if any(s[n] != settings[n] for n in names)]


class Descent:
    """The walk of every row, fed to :meth:`Scheduler.run` as it goes (a row's next runs start as soon as its
    last ones end, whatever the other rows are doing)."""

    def __init__(self, sweep: Sweep, records: list[dict[str, Any]]) -> None:
        self.sweep = sweep
        self.records = records  # the scheduler's list of this sweep's records, appended to as runs end
        self.specs: dict[str, dict[str, RunSpec]] = {label: {} for label in sweep.labels}
        for spec in sweep.grid:
            self.specs[spec.label][settings_key(spec.settings)] = spec
        self.visited: dict[str, set[str]] = {label: set() for label in sweep.labels}

    def centres(self, label: str) -> list[dict[str, Any]]:
        """The best settings the row's walk has run: every one with the fewest rounds to target (a plateau of
        equal round counts is crossed, not stopped at), else the one with the lowest final gap."""
        seen = self.visited[label]
        ran = [
            r
            for r in self.records
            if r["label"] == label and r["phase"] == "grid" and settings_key(r["settings"]) in seen
        ]
        best = best_of(ran, label)
        if best is not None:
            return [
                r["settings"]
                for r in ran
                if r["status"] == "reached" and r["rounds_to_target"] == best["rounds_to_target"]
            ]
        closest = closest_record(ran)
        return [] if closest is None else [closest["settings"]]

    def next_runs(self, busy: set[str]) -> list[RunSpec]:
        """The runs the walk of each row not in ``busy`` (rows with runs still going) asks for next."""
        runs: list[RunSpec] = []
        for label, specs in self.specs.items():
            if label in busy or not specs:
                continue
            # Nothing run yet (or every run failed): start from the file's first setting.
            centres = self.centres(label) or [next(iter(specs.values())).settings]
            for centre in centres:
                for settings in [centre, *neighbours(centre, self.sweep.grids[label])]:
                    key = settings_key(settings)
                    if key in specs and key not in self.visited[label]:
                        self.visited[label].add(key)
                        runs.append(specs[key])
        return sorted(runs, key=lambda s: s.order)
