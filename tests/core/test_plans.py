"""Plans against round, step and learning-rate counts worked out by hand from Algorithms 1-3."""

import itertools
import math

import numpy as np
import pytest

from stlsgd.algorithms import CRPSGD, LBSGD, STLSGD, LocalSGD, SyncSGD, first_stage_length


def take(plan, n):
    return list(itertools.islice(plan.rounds(), n))


def stage_steps(plan, stages):
    rounds = [r for r in itertools.takewhile(lambda r: r.stage <= stages, plan.rounds())]
    return [[r.steps for r in rounds if r.stage == s] for s in range(1, stages + 1)], rounds


def test_local_sgd_decaying_lr_and_period():
    r0, r1 = take(LocalSGD(lr=1.0, k=3, lr_decay=0.5), 2)
    assert (r0.start_iteration, r0.steps, r1.start_iteration, r1.steps) == (0, 3, 3, 3)
    np.testing.assert_allclose(r0.learning_rates(), [1.0, 1 / 1.5, 1 / 2.0])
    np.testing.assert_allclose(r1.learning_rates(), [1 / 2.5, 1 / 3.0, 1 / 3.5])


def test_sync_and_lb_sgd_average_every_step():
    rounds = take(SyncSGD(lr=2.0, lr_decay=0.1), 4)
    assert [r.steps for r in rounds] == [1, 1, 1, 1]
    assert [float(r.learning_rates()[0]) for r in rounds] == pytest.approx([2.0, 2 / 1.1, 2 / 1.2, 2 / 1.3])
    lb = take(LBSGD(lr=1.0, batch=400), 3)
    assert [(r.steps, r.batch) for r in lb] == [(1, 400)] * 3


def test_stl_sc_iid_doubles_everything():
    plan = STLSGD(lr=4.0, T1=10, k1=4, iid=True)
    steps, rounds = stage_steps(plan, 3)
    # T_s = 10, 20, 40 with k_s = 4, 8, 16: the last round of each stage is the remainder.
    assert steps == [[4, 4, 2], [8, 8, 4], [16, 16, 8]]
    assert [plan.stage(s) for s in (1, 2, 3)] == [(4.0, 10, 4), (2.0, 20, 8), (1.0, 40, 16)]
    assert [r.index for r in rounds] == list(range(9))
    assert [r.start_iteration for r in rounds][:4] == [0, 4, 8, 10]
    assert all(r.prox_gamma is None and not r.new_anchor for r in rounds)


def test_stl_sc_noniid_grows_by_sqrt2_and_counts_sum_of_ceilings():
    plan = STLSGD(lr=1.0, T1=100, k1=10, iid=False)
    periods = [plan.stage(s)[2] for s in range(1, 6)]
    assert periods == [10, 14, 20, 28, 40]  # floor(10 * sqrt(2)^(s-1))
    steps, rounds = stage_steps(plan, 5)
    assert [len(s) for s in steps] == [10, 15, 20, 29, 40]
    assert len(rounds) == sum(math.ceil(100 * 2 ** (s - 1) / p) for s, p in zip(range(1, 6), periods))
    assert steps[1][-1] == 200 - 14 * 14 and steps[3][-1] == 800 - 28 * 28


def test_period_is_at_least_one_and_k1_below_one_is_refused():
    from stlsgd.algorithms.plan import floor_period

    assert [floor_period(k) for k in (0.3, 1.0, 1.4142135623730951 * 2**0.5, 2.9999999999)] == [1, 1, 2, 3]
    with pytest.raises(ValueError, match=r"^k1: must be >= 1"):
        STLSGD(lr=1.0, T1=4, k1=0.3)


def test_stl_nc_option2_linear_schedule_and_anchors():
    plan = STLSGD(lr=1.0, T1=10, k1=2, iid=True, option=2, gamma=100.0, name="stl_nc")
    steps, rounds = stage_steps(plan, 3)
    assert steps == [[2] * 5, [4] * 5, [6] * 5]  # T_s = 10 s, k_s = 2 s
    assert [plan.stage(s)[0] for s in (1, 2, 3)] == pytest.approx([1.0, 0.5, 1 / 3])
    assert [r.index for r in rounds if r.new_anchor] == [0, 5, 10]  # x_s taken at each stage start
    assert all(r.prox_gamma == 100.0 for r in rounds)
    noniid = STLSGD(lr=1.0, T1=10, k1=2, iid=False, option=2, gamma=1.0)
    assert [noniid.stage(s)[2] for s in (1, 2, 3, 4)] == [2, 2, 3, 4]  # floor(2 sqrt(s))


def test_stl_nc_option1_matches_sc_schedule():
    sc = STLSGD(lr=0.8, T1=30, k1=5, iid=False)
    nc = STLSGD(lr=0.8, T1=30, k1=5, iid=False, option=1, gamma=10.0)
    assert [sc.stage(s) for s in range(1, 7)] == [nc.stage(s) for s in range(1, 7)]


def test_cr_psgd_per_step_growth_with_cap():
    rounds = take(CRPSGD(lr=1.0, rho=2.0, batch=1, max_batch=5), 5)
    assert [r.batch for r in rounds] == [1, 2, 4, 5, 5]
    assert all(r.steps == 1 for r in rounds)


def test_cr_psgd_per_epoch_growth():
    # Epoch = 10 samples; 2 clients of batch 2 see 4 samples a round: epochs end in rounds 2, 4 and 7.
    plan = CRPSGD(lr=1.0, rho=1.5, batch=2, max_batch=4, grow="epoch", samples_per_epoch=10, num_clients=2)
    assert [r.batch for r in take(plan, 8)] == [2, 2, 2, 3, 3, 4, 4, 4]


def test_first_stage_length_rule():
    # eta_1 T_1 = 1/lambda with lambda = 1/n (Section 5): T_1 = ceil(n / eta_1).
    assert first_stage_length(32.0, 1 / 32561) == 1018
    assert first_stage_length(3.2, 1 / 32561) == 10176
    assert first_stage_length(1.0, 0.5, scale=0.3) == 1


def test_rounds_resume_from_any_index():
    plan = STLSGD(lr=1.0, T1=7, k1=2, iid=False)
    every = take(plan, 30)
    assert list(itertools.islice(plan.rounds(start=13), 17)) == every[13:]


def test_cr_psgd_stays_capped_far_past_float_range():
    plan = CRPSGD(lr=1.0, rho=1.1, batch=1, max_batch=512)
    assert next(plan.rounds(start=20_000)).batch == 512  # 1.1**20000 overflows a float
    assert [r.batch for r in take(plan, 70)][64:] == [445, 490, 512, 512, 512, 512]  # floor(1.1^64), floor(1.1^65), cap
