"""The schedules beyond the paper, against periods worked out by hand, and their resume across a period change."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from stlsgd.algorithms import (
    QSR,
    STLSGD,
    AdaComm,
    Cosine,
    Cursor,
    Feedback,
    InverseTime,
    LRCoupled,
    PostLocalSGD,
    StepDecay,
    STLSGDStationary,
)
from stlsgd.algorithms.driver import PlanDriver
from stlsgd.algorithms.registry import PlanContext
from stlsgd.experiments.config import Experiment
from stlsgd.experiments.runner import run_experiment


def take(plan, n, feedback=None):
    return list(itertools.islice(plan.rounds(feedback=feedback or Feedback()), n))


def test_post_local_sgd_is_synchronous_for_its_warm_up_then_local() -> None:
    rounds = take(PostLocalSGD(lrs=InverseTime(1.0, 0.5), k=3, warmup=2), 5)
    assert [(r.start_iteration, r.steps) for r in rounds] == [(0, 1), (1, 1), (2, 3), (5, 3), (8, 3)]
    np.testing.assert_allclose(rounds[2].learning_rates(), [1 / 2, 1 / 2.5, 1 / 3])  # 1/(1 + 0.5 t), t = 2, 3, 4


def test_lr_coupled_keeps_eta_times_k_constant_on_its_own_schedule() -> None:
    # eta_t = 0.4 halved every 10 steps; k_1 = 2 at eta_1 = 0.4: k = 2 while eta = 0.4 (steps 0-9), 4 at 0.2
    # (the round starting at step 10), 8 at 0.1 (the round starting at step 22: 0.4 * 0.5^2), 16 at 0.05 (step 30).
    plan = LRCoupled(lrs=StepDecay(0.4, 10, 0.5), k1=2, lr1=0.4)
    assert [(r.start_iteration, r.steps) for r in take(plan, 8)] == [
        (0, 2),
        (2, 2),
        (4, 2),
        (6, 2),
        (8, 2),
        (10, 4),
        (14, 4),
        (18, 4),
    ]
    assert [(r.start_iteration, r.steps) for r in take(plan, 10)][8:] == [(22, 8), (30, 16)]


def test_lr_coupled_takes_eta_1_as_the_largest_lr_seen_when_not_given() -> None:
    plan = LRCoupled(k1=3)
    cursor = Cursor()
    rnd = plan.next_round(cursor, Feedback(lr=0.05))  # the optimizer's lr (the drop-in)
    assert rnd.steps == 3
    cursor = plan.advance(cursor, rnd, Feedback(lr=0.05))
    assert cursor.memo == (0.05,)
    assert plan.next_round(cursor, Feedback(lr=0.0125)).steps == 12  # 3 * 0.05 / 0.0125
    assert plan.next_round(cursor, Feedback(lr=0.0)).steps == 3  # a zero lr: k_1, never an unbounded period


def _periods(plan: LRCoupled, lrs: list[float]) -> list[int]:
    """The periods of successive rounds whose first steps use ``lrs`` (the optimizer's lr, fed back)."""
    driver = PlanDriver(plan)
    return [driver.take(Feedback(lr=lr)).steps for lr in lrs]


def test_lr_coupled_holds_k1_while_the_lr_rises_and_couples_once_it_falls() -> None:
    # eta_1 is the largest lr so far: 0 (a warm-up's start), rising 0.05 and 0.1: k_1 = 2 each time; falling to
    # 0.05 and 0.025: 2 * 0.1 / 0.05 = 4 and 8; a restart to 0.2 (above every lr before): 2; 0.1: 4; lr 0: 2.
    assert _periods(LRCoupled(k1=2), [0.0, 0.05, 0.1, 0.05, 0.025, 0.2, 0.1, 0.0]) == [2, 2, 2, 4, 8, 2, 4, 2]
    # With lr1 given, the warm-up still runs at k_1, and the decay couples to lr1: 2 * 0.1 / 0.05 = 4.
    assert _periods(LRCoupled(k1=2, lr1=0.1), [0.01, 0.05, 0.1, 0.05]) == [2, 2, 2, 4]


def _syncs(plan: LRCoupled, lr: Callable[[int], float], total: int) -> int:
    driver = PlanDriver(plan)
    while driver.iteration < total:
        driver.take(Feedback(lr=lr(driver.iteration)))
    return driver.cursor.index


@pytest.mark.parametrize("start", [0.0, 0.1], ids=["warm-up-from-0", "warm-up-from-0.1lr"])
def test_lr_coupled_syncs_as_often_with_a_linear_warm_up_as_without(start: float) -> None:
    # 6000 steps of cosine from 0.1 to 0, with and without a 600-step linear warm-up from start * lr first (the
    # cosine then spans the other 5400 steps). Before the fix: from 0 the first round was k_max = 2^20 steps
    # (one round, never averaged); from 0.1 lr eta_1 was 0.01 and nearly every step synchronised.
    lr, total, warm = 0.1, 6000, 600

    def cosine(t: int, length: int) -> float:
        return 0.5 * lr * (1 + math.cos(math.pi * t / length))

    def warmed(t: int) -> float:
        return lr * (start + (1 - start) * t / warm) if t < warm else cosine(t - warm, total - warm)

    plain = _syncs(LRCoupled(k1=4), lambda t: cosine(t, total), total)
    with_warm_up = _syncs(LRCoupled(k1=4), warmed, total)
    assert 100 < plain < 1500  # k_1 = 4 at the peak, growing as the lr falls
    assert abs(with_warm_up - plain) <= 0.1 * plain


def test_qsr_is_quadratic_in_one_over_eta_and_never_below_h_base() -> None:
    plan = QSR(lrs=Cosine(0.4, 100), h_base=2, alpha=0.2)
    # (0.2 / 0.4)^2 = 0.25 < 2 at the start; at t = 50 eta = 0.2 -> 1 < 2; near the end eta is small.
    assert plan.period_at(Cursor(iteration=0), Feedback()) == 2
    assert plan.period_at(Cursor(iteration=50), Feedback()) == 2
    eta_90 = 0.4 * 0.5 * (1 + np.cos(np.pi * 0.9))  # 0.00979
    assert plan.period_at(Cursor(iteration=90), Feedback()) == int((0.2 / eta_90) ** 2)  # 417
    assert plan.period_at(Cursor(), Feedback(lr=0.01)) == 400  # the optimizer's lr when fed back


def test_adacomm_shrinks_the_period_as_the_fed_back_loss_falls() -> None:
    plan = AdaComm(k0=16)
    cursor = Cursor()
    r0 = plan.next_round(cursor, Feedback())  # no loss yet: k0
    cursor = plan.advance(cursor, r0, Feedback())
    r1 = plan.next_round(cursor, Feedback(objective=0.64))  # the first loss becomes F_0: still k0
    cursor = plan.advance(cursor, r1, Feedback(objective=0.64))
    assert (r0.steps, r1.steps, cursor.memo) == (16, 16, (0.64, 0.0))
    assert plan.next_round(cursor, Feedback(objective=0.16)).steps == 8  # ceil(16 sqrt(0.16 / 0.64))
    assert plan.next_round(cursor, Feedback(objective=0.01)).steps == 2  # ceil(16 * 0.125)


def test_the_config_models_build_these_plans() -> None:
    ctx = PlanContext(num_samples=1000, num_clients=4, lam=None, iid=True, max_iterations=500)
    exp = Experiment.model_validate(
        {"algorithm": {"method": "qsr", "lr": 0.2, "alpha": 0.1, "h_base": 3, "lr_schedule": "cosine"}}
    )
    plan = exp.algorithm.plan(ctx)
    assert isinstance(plan, QSR) and plan.lrs == Cosine(0.2, 500)  # the cosine's length: the budget
    with pytest.raises(Exception, match="decay_every"):
        Experiment.model_validate({"algorithm": {"method": "lr_coupled", "lr_schedule": "step"}})


def drive(plan, objectives):
    """(stage, steps, lr) of each round, round i settled with ``objectives[i]``."""
    cursor, out = Cursor(), []
    for objective in objectives:
        feedback = Feedback(objective=objective)
        rnd = plan.next_round(cursor, feedback)
        out.append((rnd.stage, rnd.steps, rnd.lr))
        cursor = plan.advance(cursor, rnd, feedback)
    return out


def test_stationary_stages_end_when_the_objective_rises_over_five_rounds_and_grow_k_while_the_drop_holds() -> None:
    plan = STLSGDStationary(lr=1.0, T1=100, k1=2)
    # Round 0 has no objective yet: Algorithm 2's stage 1. Round 1's objective (10) is the first reference; rounds
    # 2-10 fall to 1; round 6 compares 5 with 10 (5 rounds on: no rise, 5 becomes the reference); round 11 sees 6 > 5:
    # stationary, stage 2 opens there at iteration 22 with eta/2 and, the first stage having dropped (10 -> 1), k x2.
    stage1 = [None, *[11.0 - i for i in range(1, 11)]]
    # Stage 2 is settled first by 6, then falls only to 0.6 (a drop of 1 - 0.6 = 0.4, under a quarter of stage 1's
    # 9): the drift part dominates, so stage 3 keeps k = 4 while eta halves again. Round 16 sees 6.5 > 6: it ends.
    stage2 = [6.0, 0.9, 0.8, 0.7, 0.6]
    rounds = drive(plan, [*stage1, *stage2, 6.5, 0.5])
    assert rounds == [(1, 2, 1.0)] * 11 + [(2, 4, 0.5)] * 5 + [(3, 4, 0.25)] * 2


def test_with_diminishing_k_a_stage_also_ends_once_its_returns_diminish() -> None:
    # Round 6 compares 5 with the reference 10: a fall of 5, not under a quarter of the stage's 10 - 5 = 5, so 5
    # becomes the reference. Round 11 sees 4.5: the window fell 0.5, under a quarter of the stage's 10 - 4.5 = 5.5
    # (1.375), so stage 2 opens there (eta/2; the first stage dropped, so k x2) though nothing rose.
    objectives = [None, 10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.9, 4.8, 4.7, 4.6, 4.5, 4.4]
    assert (
        drive(STLSGDStationary(lr=1.0, T1=100, k1=2, diminishing_k=2), objectives)
        == [(1, 2, 1.0)] * 11 + [(2, 4, 0.5)] * 2
    )
    # Off, or a period over diminishing_k: only a rise ends the stage.
    for plan in (STLSGDStationary(lr=1.0, T1=100, k1=2), STLSGDStationary(lr=1.0, T1=100, k1=2, diminishing_k=1)):
        assert drive(plan, objectives) == [(1, 2, 1.0)] * 13
    with pytest.raises(ValueError, match="diminishing_k"):
        STLSGDStationary(lr=1.0, T1=100, k1=2, diminishing_k=0)
    with pytest.raises(Exception, match='diminishing_k: only with stage_end = "stationary"'):
        Experiment.model_validate({"algorithm": {"method": "stl_sc", "lr": 0.5, "k": 2, "diminishing_k": 64}})
    exp = Experiment.model_validate(
        {"algorithm": {"method": "stl_sc", "lr": 0.5, "k": 2, "T1": 40, "stage_end": "stationary", "diminishing_k": 64}}
    )
    plan = exp.algorithm.plan(PlanContext(num_samples=100, num_clients=4, lam=None, iid=True, max_iterations=500))
    assert isinstance(plan, STLSGDStationary) and (plan.diminishing_k, plan.T1, plan.k1) == (64, 40, 2)


def test_with_halvings_eta_stops_halving_and_k_still_grows() -> None:
    # The first test's objectives and one more stage: stage 2 ends at round 16 (6.5 > 6.0) and stage 3 at round 21
    # (7.0 > 6.5). With halvings = 1, eta halves once (1 -> 0.5) and stages 3 and 4 keep 0.5; the periods are those of
    # the plan without it (stage 2 dropped 1.0 - 0.6 = 0.4, under a quarter of stage 1's 9: k stays 4 in stage 3; stage
    # 3 dropped 0.6 - 0.4 = 0.2, at least a quarter of 0.4: k doubles to 8 in stage 4). With halvings = 0, eta_1
    # throughout.
    stage1 = [None, *[11.0 - i for i in range(1, 11)]]
    objectives = [*stage1, 6.0, 0.9, 0.8, 0.7, 0.6, 6.5, 0.5, 0.4, 0.4, 0.4, 7.0, 0.3]
    free = drive(STLSGDStationary(lr=1.0, T1=100, k1=2), objectives)
    assert free == [(1, 2, 1.0)] * 11 + [(2, 4, 0.5)] * 5 + [(3, 4, 0.25)] * 5 + [(4, 8, 0.125)] * 2
    floored = drive(STLSGDStationary(lr=1.0, T1=100, k1=2, halvings=1), objectives)
    assert floored == [(1, 2, 1.0)] * 11 + [(2, 4, 0.5)] * 5 + [(3, 4, 0.5)] * 5 + [(4, 8, 0.5)] * 2
    assert {lr for _, _, lr in drive(STLSGDStationary(lr=1.0, T1=100, k1=2, halvings=0), objectives)} == {1.0}
    # A stage still never runs past T_s = 2^(s-1) T_1: stage 2 of T_1 = 10 (with k_1 = 2) ends after 20 steps.
    no_rise = [None, *[10.0 - 0.1 * i for i in range(1, 20)]]
    assert drive(STLSGDStationary(lr=1.0, T1=10, k1=2, halvings=0), no_rise)[:11] == [(1, 2, 1.0)] * 5 + [
        (2, 4, 1.0)
    ] * 5 + [(3, 8, 1.0)]
    with pytest.raises(ValueError, match="halvings"):
        STLSGDStationary(lr=1.0, T1=100, k1=2, halvings=-1)
    with pytest.raises(Exception, match='halvings: only with stage_end = "stationary"'):
        Experiment.model_validate({"algorithm": {"method": "stl_sc", "lr": 0.5, "k": 2, "halvings": 3}})
    exp = Experiment.model_validate(
        {"algorithm": {"method": "stl_sc", "lr": 0.5, "k": 2, "T1": 40, "stage_end": "stationary", "halvings": 3}}
    )
    plan = exp.algorithm.plan(PlanContext(num_samples=100, num_clients=4, lam=None, iid=True, max_iterations=500))
    assert isinstance(plan, STLSGDStationary) and plan.halvings == 3


def test_a_capped_period_keeps_the_stationarity_window_in_steps() -> None:
    # The first test's objectives with k_max = 3: stage 2's period would be 4, so its rounds are 3 steps and the test
    # compares objectives ceil(4 / 3) x 5 = 10 rounds apart. Round 16's rise (6.5 > 6.0, 5 rounds on) no longer ends
    # the stage; round 21's (7.0 > 6.0, 10 rounds on) does. Stage 2 dropped 1 -> 0.5, under a quarter of stage 1's 9:
    # stage 3 keeps the (uncapped) period 4, run as 3.
    stage1 = [None, *[11.0 - i for i in range(1, 11)]]
    stage2 = [6.0, 0.9, 0.8, 0.7, 0.6, 6.5, 0.5, 0.5, 0.5, 0.5]
    rounds = drive(STLSGDStationary(lr=1.0, T1=100, k1=2, k_max=3), [*stage1, *stage2, 7.0, 0.4])
    assert rounds == [(1, 2, 1.0)] * 11 + [(2, 3, 0.5)] * 10 + [(3, 3, 0.25)] * 2
    # Algorithm 2's fixed stages take the cap too: k_1 2^(s-1) = 2, 4, 8 -> 2, 3, 3.
    assert [STLSGD(lr=1.0, T1=10, k1=2, k_max=3).stage(s)[2] for s in (1, 2, 3)] == [2, 3, 3]


def test_stationary_stages_that_keep_falling_are_algorithm_2s() -> None:
    # Never a rise, each stage's drop at least a quarter of the last one's: stage lengths T_s and periods k_1 2^(s-1)
    # as the fixed-length plan gives them.
    objectives = [None, *[1.0 / (i + 1) for i in range(1, 20)]]
    fixed = [(r.stage, r.steps, r.lr) for r in itertools.islice(STLSGD(lr=1.0, T1=10, k1=2).rounds(), 20)]
    assert drive(STLSGDStationary(lr=1.0, T1=10, k1=2), objectives) == fixed
    assert [s for s, _, _ in fixed] == [1] * 5 + [2] * 5 + [3] * 5 + [4] * 5


@pytest.mark.parametrize(
    "algorithm",
    [
        # eta_t = 0.5/(1 + 0.05 t) doubles the period by t = 20
        {"method": "lr_coupled", "lr": 0.5, "lr_decay": 0.05, "k": 4},
        # the loss fed back shrinks the period
        {"method": "adacomm", "lr": 0.5, "lr_decay": 0.05, "k": 4},
        # stages end, and the period grows, on the objectives fed back
        {"method": "stl_sc", "lr": 0.5, "k": 2, "T1": 40, "stage_end": "stationary", "drift": True},
    ],
    ids=lambda a: a["method"],
)
def test_resume_across_a_period_change_is_bit_identical(tmp_path: Path, algorithm: dict) -> None:
    exp = Experiment.model_validate(
        {
            "data": {"dataset": "digits49", "num_clients": 4, "partition": "noniid"},
            "algorithm": algorithm,
            "run": {"target_gap": "none", "max_rounds": 30, "eval_every": 2},
        }
    )
    whole = run_experiment(exp, tmp_path / "whole", progress=False, checkpoint_every=4)
    periods = [json.loads(line)["period"] for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert len(set(periods)) > 1, periods  # the period did change

    def interrupt(state, rnd) -> None:
        if state.round == 14:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(exp, tmp_path / "cut", progress=False, checkpoint_every=4, on_round=interrupt)
    resumed = run_experiment(exp, tmp_path / "cut", progress=False, resume=True)
    assert (resumed["rounds"], resumed["iterations"]) == (whole["rounds"], whole["iterations"])
    with np.load(tmp_path / "whole" / "final_params.npz") as a, np.load(tmp_path / "cut" / "final_params.npz") as b:
        assert np.array_equal(a["w"], b["w"])
