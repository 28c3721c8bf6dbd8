"""The stored Table 2+ rows of ``algorithm.auto`` are what today's code runs.

``auto`` has no grid setting in its record's key: the method, lr, period and stage ends come from its rules, from
the data and (Non-IID) from the objectives fed back to its plan. A change to those rules keeps the key, so a sweep
would keep the stale record and the docs its figure. Here the seed-0 run of each a9a column's auto row runs again
as its sweep ran it and must give the stored outcome; a rule change that moves it must rerun that row
(docs/results/schedules.md says how).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from stored import stored_run, sweep_config

from stlsgd.experiments.sweeps.worker import run_task

LABEL = "STL-SGD^sc auto (no grid)"
OUTCOME = ("status", "rounds_to_target", "iterations_to_target", "rounds", "iterations")


@pytest.mark.parametrize("column", ["table2plus_a9a_noniid", "table2plus_a9a_iid"])
def test_the_stored_auto_run_is_what_todays_code_runs(column: str, shared_data: Path, tmp_path: Path) -> None:
    stored = stored_run("table2plus_data", column, LABEL, {}, 0)
    config = sweep_config(column, LABEL, {}, 0)
    summary = run_task({"config": config, "slots": [0]}, tmp_path / "run", str(shared_data), lambda _: 2**62)
    assert {key: summary[key] for key in OUTCOME} == {key: stored[key] for key in OUTCOME}
    assert summary["final"]["objective"] == stored["final_objective"]
