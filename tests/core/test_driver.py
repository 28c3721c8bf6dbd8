"""The plan driver: settle, count, finish; state in, state out; checked loads. And the round rules on tensors,
with numbers worked by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from stlsgd.algorithms import STLSGD, Feedback, LocalSGD, LRCoupled
from stlsgd.algorithms.driver import DriverState, PlanDriver, plan_identity
from stlsgd.errors import StlsgdError
from stlsgd.executors.averaging import OuterNesterov
from stlsgd.executors.rules import add_proximal, drift_correction, outer_step, update_control


def test_a_round_is_settled_once_counted_and_finished() -> None:
    driver = PlanDriver(LRCoupled(k1=2))
    rnd = driver.settle(Feedback(lr=0.1))
    assert (rnd.steps, driver.round) == (2, rnd)
    assert driver.settle(Feedback(lr=0.05)) is rnd  # settled: later feedback does not change it
    assert driver.count() is False and driver.count() is True
    assert (driver.step, driver.iteration) == (2, 2)
    assert driver.finish() is rnd
    assert (driver.step, driver.cursor.iteration, driver.cursor.index, driver.round) == (0, 2, 1, None)
    assert driver.take(Feedback(lr=0.05)).steps == 4  # 2 * 0.1 / 0.05
    with pytest.raises(RuntimeError, match="no round settled"):
        driver.count()


def test_the_state_is_json_and_resumes_mid_round_with_the_settling_feedback() -> None:
    plan = LRCoupled(k1=2)
    driver = PlanDriver(plan)
    driver.take(Feedback(lr=0.1))
    driver.settle(Feedback(lr=0.025))  # a round of 8 steps
    driver.count(3)
    saved = json.loads(json.dumps(driver.state_dict()))
    assert saved["plan"] == plan_identity(plan) and saved["step"] == 3
    again = PlanDriver(plan)
    again.load_state_dict(saved)
    assert again.round == driver.round and again.round.steps == 8 and again.step == 3
    assert PlanDriver(plan, DriverState.from_dict(saved)).state == driver.state


@pytest.mark.parametrize(
    "change, message",
    [
        ({"step": -1}, "step must be a whole number >= 0, got -1"),
        ({"step": 8}, "step 8 is outside round 1, which has 8 steps"),
        ({"plan": {"name": "LocalSGD"}}, "the state was taken with plan {'name': 'LocalSGD'}"),
        ({"cursor": None}, "cursor"),
    ],
)
def test_a_bad_state_is_refused_in_one_line(change: dict, message: str) -> None:
    plan = LRCoupled(k1=2)
    driver = PlanDriver(plan)
    driver.take(Feedback(lr=0.1))
    driver.settle(Feedback(lr=0.025))
    saved = {**driver.state_dict(), **change}
    if change.get("cursor", 0) is None:
        del saved["cursor"]
    with pytest.raises(StlsgdError) as err:
        PlanDriver(plan).load_state_dict(saved, who="X")
    assert str(err.value).startswith("X: ") and message in str(err.value) and "\n" not in str(err.value)


def test_every_plan_runs_the_same_through_the_driver_as_by_hand() -> None:
    for plan in (LocalSGD(lr=0.1, k=3), STLSGD(lr=0.4, T1=8, k1=2.0)):
        driver = PlanDriver(plan)
        assert [driver.take() for _ in range(6)] == [r for _, r in zip(range(6), plan.rounds())]


def test_the_round_rules_by_hand() -> None:
    # Proximal: g + (x - x_s)/gamma = 1 + (3 - 1)/0.5 = 5.
    g, x, anchor = torch.tensor([1.0]), torch.tensor([3.0]), torch.tensor([1.0])
    add_proximal([g], [x], [anchor], 0.5)
    assert g.item() == 5.0
    # Drift: c - c_i = 0.5 - 2 = -1.5; c_i <- (x_start - y)/sum(lr) - (c - c_i) = (1 - 0.25)/0.5 + 1.5 = 3.
    c_i, c = np.array([2.0]), np.array([0.5])
    (correction,) = drift_correction([c_i], [c])
    assert correction[0] == -1.5
    update_control([c_i], [np.array([1.0])], [np.array([0.25])], [correction], 0.5)
    assert c_i[0] == 3.0
    # Outer Nesterov (lr 0.5, mu 0.5) from x_start 1 to the average 0: Delta 1, m 1, x = 1 - 0.5 (1 + 0.5) = 0.25.
    averaged = np.array([0.0])
    momentum = outer_step(OuterNesterov(lr=0.5, momentum=0.5), [np.array([1.0])], [averaged], None)
    assert averaged[0] == 0.25 and momentum[0][0] == 1.0
