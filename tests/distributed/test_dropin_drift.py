"""Drift correction in the drop-in is the simulator's SCAFFOLD (option II, and with a window): the same plan and
data give the same parameters, and a per-rank checkpoint in the middle of a round resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from dist_helpers import launch_worker
from simulation import simulate

from stlsgd.data import load_dataset, make_partition
from stlsgd.executors.rules import RoundRule
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import StopRule
from stlsgd.problems.logistic import LogisticRegression


def _simulate(drift: bool, window: int | None = None) -> np.ndarray:
    from dropin_drift_worker import PLAN, ROUNDS, SEED

    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    partition = make_partition(ds.y, 2, "noniid", seed=0, s=0)
    rule = RoundRule(drift=drift, drift_window=window)
    state, _ = simulate(problem, partition, PLAN, StopRule(max_rounds=ROUNDS), SEED, rule=rule)
    return state.clients["w"][0]


def test_drop_in_drift_is_the_simulators_and_resumes_exactly(tmp_path: Path) -> None:
    """2 ranks (gloo, started with torchrun's environment), plain SGD, the simulator's mini-batches and learning rates.

    Not bit for bit: the simulator's compiled kernel applies the L2 term as a running scale of the weights and
    touches only the sampled row's non-zeros, while the drop-in's autograd adds lambda w to the full gradient;
    the two orders of the same arithmetic differ in the last bits, so the parameters agree to rtol 1e-10 (the
    tolerance the simulator's own SCAFFOLD reference test uses). The resume is exact (same process order)."""
    result = launch_worker("dropin_drift_worker.py", tmp_path, timeout_s=240)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    drifted, plain = _simulate(True), _simulate(False)
    from dropin_drift_worker import WINDOW

    windowed = _simulate(True, WINDOW)
    for res in ranks:
        np.testing.assert_allclose(res["whole"], drifted, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(res["windowed"], windowed, rtol=1e-10, atol=1e-13)
        assert res["shared"] == res["windowed"]  # the same steps' control variates, bit for bit
        assert res["resumed"] == res["whole"]  # bit for bit
        assert max(res["control_max"]) > 1e-3  # the control variates are doing something
    assert np.abs(drifted - plain).max() > 1e-3  # and drift changes the result beyond the tolerance
    assert np.abs(drifted - windowed).max() > 1e-3  # as the window does
    # The model and the control variate ride in one all-reduce: 2 x 64 float64 values a round, 6 rounds.
    assert ranks[0]["bytes"] == 6 * 2 * 64 * 8


def test_each_of_fewer_than_four_clients_steps_on_its_own_rows() -> None:
    # The kernel's margins come four clients at a time; the trailing clients of a block (2 clients here) read
    # client 0's row before the fix, so the simulator's 2-client runs were not the drop-in's 2 processes.
    from dropin_drift_worker import PLAN

    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    rows = Sampler(make_partition(ds.y, 2, "noniid", seed=0, s=0), 3).draw(5, 1)
    lrs = next(PLAN.rounds()).learning_rates()
    both = problem.init_state(2)
    problem.local_steps(both, rows, lrs, None)
    for c in range(2):
        alone = problem.init_state(1)
        problem.local_steps(alone, rows[:, c : c + 1], lrs, None)
        assert np.array_equal(both["w"][c], alone["w"][0])
