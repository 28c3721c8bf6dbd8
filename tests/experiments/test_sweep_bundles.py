"""A sweep's bundles: a row's runs take turns a round at a time in one worker, so when one reaches the target every
other stops at that round (the least any order of runs could spend), and each run is still the run it is alone."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from stlsgd.cli import main
from stlsgd.experiments import runner
from stlsgd.experiments.sweeps import read_results, worker
from stlsgd.experiments.sweeps.worker import NO_BOUND, run_bundle

CONFIG = {"data": {"dataset": "digits49", "num_clients": 4}, "algorithm": {"method": "local_sgd", "lr": 0.1}}


@pytest.fixture
def no_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs whose rounds a test plays itself (``runner.run_experiment`` replaced) need no data built."""
    monkeypatch.setattr(worker, "_built_for", lambda exp, data_dir: SimpleNamespace(dataset=SimpleNamespace(n=1)))


def test_runs_take_turns_by_rounds_and_stop_where_the_first_reaches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_data: None
) -> None:
    """Four runs of one row that would reach the target at rounds 12, 5, never (a budget of 40) and 8: the one at
    5 reaches, each other stops at round 5, and the rounds went 1, 1, 1, 1, 2, 2, ... in the bundle's order."""
    reach = {"a": 12, "b": 5, "c": None, "d": 8}
    log: list[tuple[str, int]] = []

    def fake_run(exp: Any, out: Path, *, on_round: Any, clock: Any, **_: Any) -> dict[str, Any]:
        name, began = out.name, clock()
        st = SimpleNamespace(round=0, status="running", rounds_to_target=None)
        while True:
            st.round += 1
            log.append((name, st.round))
            time.sleep(0.002)
            if st.round == reach[name]:
                st.status, st.rounds_to_target = "reached", st.round
            elif st.round == 40:
                st.status = "budget"
            verdict = on_round(st, None)
            if verdict:
                st.status = verdict
            if st.status != "running":
                return {"status": st.status, "rounds": st.round, "wall_s": clock() - began}

    monkeypatch.setattr(runner, "run_experiment", fake_run)
    tasks = [{"config": CONFIG, "key": name, "slots": [0]} for name in reach]
    lowered: list[tuple[list[int], int]] = []
    started = time.perf_counter()
    results = run_bundle(
        tasks, [tmp_path / name for name in reach], None, lambda slots: NO_BOUND, lambda s, r: lowered.append((s, r))
    )
    total = time.perf_counter() - started
    outcome = {name: (r["summary"]["status"], r["summary"]["rounds"]) for name, r in zip(reach, results)}
    assert outcome == {"a": ("pruned", 5), "b": ("reached", 5), "c": ("pruned", 5), "d": ("pruned", 5)}
    assert log == [(name, rnd) for rnd in range(1, 6) for name in reach]
    assert lowered == [([0], 5)]  # the pool's other workers hear of it at once
    # Each run's clock counted its own five rounds, not the others' turns.
    walls = [r["summary"]["wall_s"] for r in results]
    assert all(0.009 < w < total / 2 for w in walls), (walls, total)


def test_a_bundle_keeps_each_run_an_error_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_data: None
) -> None:
    """A run that raises ends alone: the others of its bundle go on, and the error comes back in its place."""

    def fake_run(exp: Any, out: Path, *, on_round: Any, clock: Any, **_: Any) -> dict[str, Any]:
        st = SimpleNamespace(round=0, status="running", rounds_to_target=None)
        for _ in range(3):
            st.round += 1
            if out.name == "bad" and st.round == 2:
                raise ValueError("boom")
            on_round(st, None)
        return {"status": "budget", "rounds": st.round}

    monkeypatch.setattr(runner, "run_experiment", fake_run)
    names = ["good", "bad", "also"]
    tasks = [{"config": CONFIG, "key": name, "slots": [0]} for name in names]
    results = run_bundle(tasks, [tmp_path / n for n in names], None, lambda slots: NO_BOUND)
    assert [r.get("summary", {}).get("rounds") for r in results] == [3, None, 3]
    assert "ValueError: boom" in results[1]["error"] and results[1]["input_error"] is False


SWEEP = """
name = "bundled"

[base.data]
dataset = "digits49"
num_clients = 4

[base.run]
target_gap = 1e-2
max_rounds = 400

[[methods]]
method = "local_sgd"
label = "Local SGD"
grid = { lr = [0.02, 0.05, 0.1, 0.2], k = [4, 16] }
fixed = { lr_decay = 1e-3 }
"""


def test_a_bundled_rows_runs_stop_at_its_best_round_and_its_best_is_the_run_alone(
    tmp_path: Path, shared_data: Path
) -> None:
    """One row's eight settings in one bundle (--jobs 1), evaluated every round: every pruned run stopped at the
    round the best one reached the target, and the best one is, bit for bit, ``stlsgd run`` of its config."""
    config = tmp_path / "bundled.toml"
    config.write_text(SWEEP)
    out = tmp_path / "sweep"
    assert (
        main(["sweep", str(config), "--out", str(out), "--jobs", "1", "--quiet", "--data-dir", str(shared_data)]) == 0
    )
    records = read_results(out)
    best = json.loads((out / "best.json").read_text())["methods"]["Local SGD"]
    first = best["seeds"]["0"]["rounds_to_target"]
    statuses = {r["status"] for r in records}
    assert statuses <= {"reached", "pruned"} and "pruned" in statuses
    assert all(r["rounds"] == first for r in records if r["status"] == "pruned")
    assert all(r["rounds_to_target"] >= first for r in records if r["status"] == "reached")

    alone = tmp_path / "alone"
    run_config = out / best["run_dir"] / "config.yaml"
    assert main(["run", str(run_config), "--out", str(alone), "--data-dir", str(shared_data)]) == 0
    summary = json.loads((alone / "summary.json").read_text())
    bundled = json.loads((out / best["run_dir"] / "summary.json").read_text())
    assert (summary["rounds_to_target"], summary["iterations"]) == (bundled["rounds_to_target"], bundled["iterations"])
    np.testing.assert_array_equal(
        np.load(alone / "final_params.npz")["w"], np.load(out / best["run_dir"] / "final_params.npz")["w"]
    )
