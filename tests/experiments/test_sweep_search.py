"""``search = "descent"``: the walk through each row's grid, by hand and end to end on a9a (../shared/data)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stlsgd.cli import main
from stlsgd.experiments.sweeps import load_sweep, read_results
from stlsgd.experiments.sweeps.search import Descent, neighbours


def test_neighbours_by_hand() -> None:
    grid = {"lr": [3.2, 32, 0.32], "k": [800, 400, 1600, 3200], "drift": [True, False]}
    # Inside both number lists: 3 x 3 x 2 settings around, less the setting itself.
    around = neighbours({"lr": 3.2, "k": 800, "drift": True}, grid)
    assert len(around) == 3 * 3 * 2 - 1
    assert {"lr": 32, "k": 400, "drift": False} in around  # a diagonal: all three lists moved at once
    assert {"lr": 32, "k": 3200, "drift": True} not in around  # k two steps away, by value not list order
    # At the ends of both number lists only one way is open: 2 x 2 x 2 - 1.
    corner = neighbours({"lr": 32, "k": 3200, "drift": False}, grid)
    assert len(corner) == 7 and {"lr": 3.2, "k": 1600, "drift": True} in corner
    assert neighbours({"lr": 3.2}, {"lr": [3.2]}) == []


def _walk(tmp_path: Path, grid: dict[str, list[Any]], rounds: Any) -> tuple[Descent, list[dict[str, Any]]]:
    """Walk a one-row sweep whose runs reach the target in ``rounds(settings)`` rounds (an int) or end their
    budget at that final gap (a float), with no run started: records as the scheduler makes them."""
    path = tmp_path / "walk.toml"
    values = ", ".join(f"{k} = {json.dumps(v)}" for k, v in grid.items())
    path.write_text(f'name = "walk"\nsearch = "descent"\n[[methods]]\nmethod = "local_sgd"\ngrid = {{ {values} }}\n')
    sweep = load_sweep(path)
    records: list[dict[str, Any]] = []
    walk = Descent(sweep, records)
    ran: list[dict[str, Any]] = []
    while specs := walk.next_runs(set()):
        for spec in specs:
            r = rounds(spec.settings)
            status = "reached" if isinstance(r, int) else "budget"
            records.append(
                {
                    "label": spec.label,
                    "phase": "grid",
                    "settings": spec.settings,
                    "status": status,
                    "rounds_to_target": r if status == "reached" else None,
                    "iterations_to_target": 0,
                    "order": spec.order,
                    "final_gap": None if status == "reached" else r,
                    "final_objective": 1.0,
                }
            )
            ran.append(spec.settings)
    return walk, ran


def test_the_walk_crosses_a_plateau_and_stops_at_a_setting_better_than_its_neighbours(tmp_path: Path) -> None:
    lrs, ks = [0.1, 0.2, 0.4, 0.8, 1.6], [10, 20, 40, 80, 160, 320]
    # Rounds by hand: 11 on a plateau along lr = 0.1 (where the walk starts), 6 at (0.2, 160), 9 around it;
    # everything else 20.
    table = {(0.1, k): 11 for k in ks} | {(0.2, 160): 6, (0.2, 80): 9, (0.4, 160): 9, (0.2, 320): 9}

    def rounds(s: dict[str, Any]) -> int:
        return table.get((s["lr"], s["k"]), 20)

    walk, ran = _walk(tmp_path, {"lr": lrs, "k": ks}, rounds)
    assert walk.centres("local_sgd") == [{"lr": 0.2, "k": 160}]
    # Every neighbour of the choice ran; far corners never did.
    keys = [json.dumps(s, sort_keys=True) for s in ran]
    assert len(keys) == len(set(keys))  # no setting twice
    for s in neighbours({"lr": 0.2, "k": 160}, {"lr": lrs, "k": ks}):
        assert s in ran
    assert {"lr": 1.6, "k": 10} not in ran and len(ran) < len(lrs) * len(ks)


def test_a_row_that_never_reaches_walks_towards_the_lowest_gap(tmp_path: Path) -> None:
    lrs = [0.001, 0.01, 0.1, 1.0, 10.0]
    # No run reaches: the final gap falls towards lr = 1, rises after it.
    walk, ran = _walk(tmp_path, {"lr": lrs}, lambda s: abs(float(s["lr"]) - 1.0) + 0.001)
    assert walk.centres("local_sgd") == [{"lr": 1.0}]
    assert ran == [{"lr": 0.001}, {"lr": 0.01}, {"lr": 0.1}, {"lr": 1.0}, {"lr": 10.0}]


SWEEP = """
name = "ci_walk_a9a"
seeds = [0, 1]
search = "{search}"

[base.data]
dataset = "a9a"
num_clients = 8
partition = "shared"

[base.run]
target_gap = 1e-2
max_rounds = 600

[[methods]]
method = "local_sgd"
label = "Local SGD"
grid = {{ lr = [0.2, 0.4, 0.8, 1.6], k = [5, 10, 20, 40, 80] }}
fixed = {{ lr_decay = 1e-2 }}
"""


def test_a_walk_on_a9a_chooses_what_the_full_grid_chooses_with_fewer_runs(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen = {}
    for search in ("grid", "descent"):
        config = tmp_path / f"{search}.toml"
        config.write_text(SWEEP.format(search=search))
        out = tmp_path / search
        args = ["sweep", str(config), "--out", str(out), "--jobs", "2", "--quiet", "--data-dir", str(shared_data)]
        assert main(args) == 0
        best = json.loads((out / "best.json").read_text())
        assert best["search"] == search
        info = best["methods"]["Local SGD"]
        chosen[search] = (info["settings"], info["median"], info["seeds"])
        grid = [r for r in read_results(out) if r["phase"] == "grid"]
        if search == "grid":
            assert len(grid) == 20
        else:
            assert len(grid) < 20
            for s in neighbours(info["settings"], load_sweep(config).grids["Local SGD"]):
                assert s in [r["settings"] for r in grid]
            # The same command again walks the same path through the records: nothing runs.
            before = (out / "results.jsonl").read_text()
            assert main(args[:-3] + ["--data-dir", str(shared_data)]) == 0
            assert (out / "results.jsonl").read_text() == before
            assert "[1]" not in capsys.readouterr().out
    assert chosen["descent"] == chosen["grid"]
