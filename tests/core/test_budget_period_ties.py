"""The iteration budget as a hard cap, the actual period in metrics, ties in the logistic accuracy, and the
first-stage rule's overflow as one line."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from simulation import simulate

from stlsgd.algorithms import STLSGD, LocalSGD
from stlsgd.algorithms.registry import PlanContext
from stlsgd.algorithms.stl_sgd import STLSCConfig, first_stage_length
from stlsgd.data import make_partition
from stlsgd.errors import ConfigError
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import StopRule
from stlsgd.problems.logistic import LogisticRegression


def test_a_round_that_would_cross_the_budget_is_cut_at_it(digits):
    ds, problem = digits
    partition = make_partition(ds.y, 2, "shared", seed=0)
    state, metrics = simulate(problem, partition, LocalSGD(lr=0.1, k=10), StopRule(max_iterations=35))
    # Rounds of 10, 10, 10, then the fourth cut to the 5 steps left: 35 iterations, not 40.
    assert state.status == "budget" and (state.round, state.iteration) == (4, 35)
    assert [(m["round"], m["iteration"], m["period"]) for m in metrics] == [
        (1, 10, 10),
        (2, 20, 10),
        (3, 30, 10),
        (4, 35, 5),
    ]
    assert state.client_steps == 35


def test_the_cut_round_is_the_plans_round_shortened(digits):
    """The steps of the cut round are the first steps the uncut round would take: same samples, same lrs."""
    ds, problem = digits
    partition = make_partition(ds.y, 2, "split", seed=0)
    cut, _ = simulate(problem, partition, LocalSGD(lr=0.1, k=10, lr_decay=0.01), StopRule(max_iterations=7))
    sampler = Sampler(partition, 0)
    w = problem.init_state(2)
    rnd = next(LocalSGD(lr=0.1, k=10, lr_decay=0.01).rounds())
    problem.local_steps(w, sampler.draw(7, 1), rnd.learning_rates()[:7], None)
    w["w"][:] = w["w"].mean(axis=0)
    np.testing.assert_array_equal(cut.clients["w"], w["w"])


def test_period_in_metrics_is_the_rounds_actual_length(digits):
    ds, problem = digits
    partition = make_partition(ds.y, 2, "shared", seed=0)
    # Stage 1: T_1 = 25 iterations at period 10 -> rounds of 10, 10, 5; stage 2 (k x2): 20, 20, 10.
    _, metrics = simulate(problem, partition, STLSGD(lr=0.1, T1=25, k1=10), StopRule(max_rounds=6))
    assert [m["period"] for m in metrics] == [10, 10, 5, 20, 20, 10]
    assert [m["stage"] for m in metrics] == [1, 1, 1, 2, 2, 2]


def _problem(rows: list[list[float]], y: list[float]) -> LogisticRegression:
    return LogisticRegression(sp.csr_matrix(np.array(rows, dtype=float)), np.array(y))


def test_accuracy_sends_ties_to_the_majority_class():
    # Two all-zero rows (margin exactly 0 whatever the model), three labelled +1 of five: +1 is the majority.
    p = _problem([[0, 0], [0, 0], [1, 0], [0, 1], [1, 1]], [1, -1, 1, 1, -1])
    w = {"w": np.array([[1.0, -2.0]])}  # scores: 0, 0, 1, -2, -1 -> predicted +1 (tie), +1 (tie), +1, -1, -1
    assert p.evaluate(w).accuracy == pytest.approx(3 / 5)  # right: rows 0, 2, 4
    # At x_0 = 0 every margin is 0: every row is predicted +1, so accuracy is the majority's share.
    assert p.evaluate({"w": np.zeros((1, 2))}).accuracy == pytest.approx(3 / 5)


def test_accuracy_ties_with_a_negative_majority_and_balanced_classes():
    negative = _problem([[0, 0], [0, 0], [0, 0]], [-1, -1, 1])
    assert negative.evaluate({"w": np.zeros((1, 2))}).accuracy == pytest.approx(2 / 3)
    balanced = _problem([[0, 0], [0, 0]], [-1, 1])  # no majority: ties go to +1 (stated in the docstring)
    assert balanced.evaluate({"w": np.zeros((1, 2))}).accuracy == pytest.approx(1 / 2)


def test_the_first_stage_rule_that_overflows_is_one_line():
    ctx = PlanContext(num_samples=100, num_clients=4, lam=0.01, iid=True)
    for lr in (1e-320, 1e-300):
        with pytest.raises(ConfigError, match=r"^algorithm\.lr: .*T_1 = 1 / \(lr \* lambda\)"):
            STLSCConfig(lr=lr).plan(ctx)
    tiny = PlanContext(num_samples=100, num_clients=4, lam=1e-320, iid=True)
    with pytest.raises(ConfigError, match=r"^algorithm\.lr: "):
        STLSCConfig(lr=1.0).plan(tiny)
    assert first_stage_length(32.0, 1 / 32561) == 1018  # the rule itself is unchanged


@pytest.mark.parametrize("field", ["algorithm.lr=1e-320", "problem.lam=1e-320"])
def test_an_overflowing_first_stage_is_one_line_from_the_cli(tmp_path, capsys, field):
    from stlsgd.cli import main

    config = tmp_path / "c.toml"
    config.write_text('[data]\ndataset = "digits49"\nnum_clients = 2\n[algorithm]\nmethod = "stl_sc"\n')
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--set", field, "--set", "run.target_gap=none"]) == 2
    err = capsys.readouterr().err
    # The config's check (before anything is built) names the field and the overflowing T_1 in one line.
    assert err.count("\n") == 1 and err.startswith("stlsgd: error: ") and "T_1 = " in err, err
    assert f"{field.split('=')[0]}:" in err or "algorithm.lr:" in err, err
    assert not out.exists() or not any(out.iterdir())
