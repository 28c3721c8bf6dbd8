"""The stored Table 2+ rows of ``algorithm.auto`` are what today's code runs.

``auto`` has no grid setting in its record's key: the method, lr, period and stage ends come from its rules, from
the data and (Non-IID) from the objectives fed back to its plan. A change to those rules keeps the key, so a sweep
would keep the stale record and the docs its figure. Here the seed-0 run of each a9a column's auto row runs again
as its sweep ran it and must give the stored outcome; a rule change that moves it must rerun that row
(docs/results/schedules.md says how).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stlsgd.experiments.sweeps.spec import load_sweep
from stlsgd.experiments.sweeps.worker import run_task

ROOT = Path(__file__).resolve().parents[2]
LABEL = "STL-SGD^sc auto (no grid)"
OUTCOME = ("status", "rounds_to_target", "iterations_to_target", "rounds", "iterations")


def _stored(column: str, seed: int) -> dict[str, Any]:
    path = ROOT / "docs" / "results" / "table2plus_data" / column / "results.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    (record,) = [r for r in records if r["label"] == LABEL and r["seed"] == seed]
    return record


@pytest.mark.parametrize("column", ["table2plus_a9a_noniid", "table2plus_a9a_iid"])
def test_the_stored_auto_run_is_what_todays_code_runs(column: str, shared_data: Path, tmp_path: Path) -> None:
    stored = _stored(column, 0)
    (spec,) = load_sweep(ROOT / "configs" / "paper" / f"{column}.toml", only=[LABEL]).grid
    config = json.loads(json.dumps(spec.config))
    config["run"]["seed"] = 0
    summary = run_task({"config": config, "slots": [0]}, tmp_path / "run", str(shared_data), lambda _: 2**62)
    assert {key: summary[key] for key in OUTCOME} == {key: stored[key] for key in OUTCOME}
    assert summary["final"]["objective"] == stored["final_objective"]
