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
from stored import stored_run, sweep_config

from stlsgd.experiments.build import build
from stlsgd.experiments.config import Experiment
from stlsgd.experiments.runner import run_experiment
from stlsgd.experiments.sweeps.worker import _built_for, run_task
from stlsgd.files import cache_dir
from stlsgd.problems.bounds import floor_for

# (column, label, settings, seed): fast settings of the stored sweeps covering IID and Non-IID, reached and
# pruned, Local SGD, STL-SGD^sc, LB-SGD (fused k = 1 rounds).
CASES = [
    ("table2_a9a_iid", "Local SGD", {"lr": 3.2, "lr_decay": 0.001, "k": 1600}, 1),
    ("table2_a9a_iid", "STL-SGD^sc", {"lr": 32, "k": 100}, 0),
    ("table2_a9a_noniid", "LB-SGD", {"lr": 32, "lr_decay": 0.01, "batch": 80}, 0),
    ("table2_a9a_noniid", "Local SGD", {"lr": 0.32, "lr_decay": 0.001, "k": 10}, 0),
]


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
    stored = stored_run("table2_data", column, label, settings, seed)
    config = sweep_config(column, label, settings, seed)
    # A stored pruned run stopped at round R: a bound of R prunes it there again (a run still going at its
    # bound's round is pruned).
    bound = stored["rounds"] if stored["status"] == "pruned" else 2**62
    sparse = run_task({"config": config, "slots": [0]}, tmp_path / "sparse", str(shared_data), lambda _: bound)
    exp = Experiment.model_validate(config)

    def on_round(st: Any, rnd: Any) -> str | None:
        return "pruned" if st.round >= bound else None

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


def _digits(algorithm: dict[str, Any], run: dict[str, Any]) -> Experiment:
    return Experiment.model_validate(
        {"name": "h", "data": {"dataset": "digits49", "num_clients": 8}, "algorithm": algorithm, "run": run}
    )


def _dense_and_sparse(exp: Experiment, data: Path, out: Path, keep: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both runs of ``exp``; checks that they agree (outcome, last line, final model, the kept lines)."""
    runs = {}
    for name, sparse_eval in (("dense", None), ("sparse", keep)):
        runs[name] = run_experiment(exp, out / name, data_dir=str(data), progress=False, sparse_eval=sparse_eval)
    dense, sparse = runs["dense"], runs["sparse"]
    assert dense is not None and sparse is not None
    for key in OUTCOME:
        assert sparse[key] == dense[key], key
    _same_line(sparse["final"], dense["final"])
    final = [np.load(out / name / "final_params.npz")["w"] for name in ("sparse", "dense")]
    assert np.array_equal(final[0], final[1])
    dense_lines = {line["round"]: line for line in _lines(out / "dense" / "metrics.jsonl")}
    sparse_lines = _lines(out / "sparse" / "metrics.jsonl")
    for line in sparse_lines:
        _same_line(line, dense_lines[line["round"]])
    assert sparse["evaluation"]["skipped"] == len(dense_lines) - len(sparse_lines) > 0
    return dense, sparse


def test_target_crossed_between_kept_points_same_round(shared_data: Path, tmp_path: Path) -> None:
    """Kept lines every 7 rounds; the target is crossed at round 51, between two of them, as a dense run finds."""
    exp = _digits({"method": "local_sgd", "lr": 0.5, "k": 10}, {"target_gap": 1e-3, "max_rounds": 3000})
    dense, sparse = _dense_and_sparse(exp, shared_data, tmp_path, keep=7)
    assert (dense["status"], dense["rounds_to_target"], dense["iterations_to_target"]) == ("reached", 51, 510)
    assert sparse["evaluation"]["kept_every_rounds"] == 7
    kept = [line["round"] for line in _lines(tmp_path / "sparse" / "metrics.jsonl")]
    assert kept[-2:] == [49, 51]  # round 50 (gap 3e-3) was skipped: its gap was proved above 1e-3


def test_due_by_iterations_same_round(shared_data: Path, tmp_path: Path) -> None:
    """STL-SGD^sc with evaluations due every 30 iterations (rounds grow): a skipped point moves the mark."""
    run = {"target_gap": 1e-3, "max_rounds": 3000, "eval_every": 1000, "eval_every_iterations": 30}
    dense, _ = _dense_and_sparse(_digits({"method": "stl_sc", "lr": 0.5, "k": 4}, run), shared_data, tmp_path, keep=7)
    assert (dense["status"], dense["rounds_to_target"], dense["iterations_to_target"]) == ("reached", 128, 512)


def test_budget_end_same_outcome(shared_data: Path, tmp_path: Path) -> None:
    exp = _digits({"method": "local_sgd", "lr": 0.5, "k": 10}, {"target_gap": 1e-5, "max_rounds": 333, "eval_every": 2})
    dense, _ = _dense_and_sparse(exp, shared_data, tmp_path, keep=7)
    assert (dense["status"], dense["rounds"], dense["final"]["round"]) == ("budget", 333, 333)


def test_diverging_run_same_outcome(shared_data: Path, tmp_path: Path) -> None:
    """lr * lambda > 2: the model grows 10x a step; the objective overflows first (a model past the bound's norm
    is never skipped), then the model itself."""
    exp = _digits({"method": "local_sgd", "lr": 1e5, "k": 3}, {"target_gap": 1e-3, "max_rounds": 3000})
    dense, _ = _dense_and_sparse(exp, shared_data, tmp_path, keep=7)
    assert (dense["status"], dense["rounds"]) == ("diverged", 21)


def test_adaptive_plan_evaluates_every_due_point(shared_data: Path, tmp_path: Path) -> None:
    """AdaComm reads each objective: sparse evaluation does not apply and the run writes every line."""
    exp = _digits({"method": "adacomm", "lr": 0.5, "k": 8}, {"target_gap": 1e-3, "max_rounds": 40})
    summary = run_experiment(exp, tmp_path, data_dir=str(shared_data), progress=False, sparse_eval=7)
    assert summary is not None and "evaluation" not in summary
    assert [line["round"] for line in _lines(tmp_path / "metrics.jsonl")] == list(range(1, summary["rounds"] + 1))


def test_psi_hand_computed() -> None:
    from stlsgd.problems.bounds import _psi

    # (exp(-s) + s - 1) / s^2: 1/2 at 0, e^-1 at 1, (e^-2 + 1) / 4 at 2.
    assert _psi(0.0) == 0.5
    assert _psi(1.0) == pytest.approx(np.exp(-1.0), rel=1e-15)
    assert _psi(2.0) == pytest.approx((np.exp(-2.0) + 1.0) / 4.0, rel=1e-15)
    # Either side of the switch to the series, both agree with the series taken one term further.
    for s in (0.99e-4, 1.01e-4):
        assert _psi(s) == pytest.approx(0.5 - s / 6 + s * s / 24 - s**3 / 120, rel=1e-12)


@pytest.mark.parametrize("dataset", ["digits49", "a9a"])
def test_floor_below_the_gap(dataset: str, shared_data: Path) -> None:
    """The bound never exceeds the gap, from next to x* (quadratic regime) to far away (linear regime)."""
    exp = Experiment.model_validate({"name": "f", "data": {"dataset": dataset, "num_clients": 4}, "algorithm": {}})
    problem = build(exp, str(shared_data)).problem
    floor = floor_for(problem, cache_dir())
    assert floor_for(problem, cache_dir()) is floor
    rng = np.random.default_rng(0)
    checked = 0
    for radius in np.logspace(-4, 2, 13):
        for _ in range(4):
            u = rng.standard_normal(problem.dim)
            w = floor.w + radius * u / np.linalg.norm(u)
            gap = problem.loss(w) - floor.fstar
            assert floor.lower(w) <= gap + 1e-12
            checked += floor.excludes(w, 1e-4)
    assert 0 < checked < 13 * 4  # near x* nothing is excluded, far from it the bound proves the gap
    assert not floor.excludes(floor.w, 0.0) and not floor.excludes(np.full(problem.dim, 1e101), 1e-4)
