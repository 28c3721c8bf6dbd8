"""The simulator against a plain per-client loop, its stop rules, accounting and determinism."""

import numpy as np
import pytest
from simulation import simulate

from stlsgd.algorithms import CRPSGD, STLSGD, LocalSGD, SyncSGD
from stlsgd.data import make_partition
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import LOCAL, StopRule, Topology, init_run_state, run


def test_local_sgd_equals_a_plain_loop_over_clients(digits):
    ds, problem = digits
    partition = make_partition(ds.y, 4, "split", seed=3)
    plan = LocalSGD(lr=0.5, k=5, lr_decay=0.01)
    state, _ = simulate(problem, partition, plan, StopRule(max_rounds=6), seed=7)

    X, y, lam = ds.X.toarray(), ds.y, problem.lam
    sampler = Sampler(partition, 7)
    w = np.zeros((4, X.shape[1]))
    for rnd in plan.rounds():
        if rnd.index == 6:
            break
        rows = sampler.draw(rnd.steps, rnd.batch)
        for t, lr in enumerate(rnd.learning_rates()):
            for c in range(4):
                r = rows[t, c, 0]
                assert r in partition.client_rows(c)  # clients sample only their own data
                w[c] -= lr * (-y[r] / (1 + np.exp(y[r] * X[r] @ w[c])) * X[r] + lam * w[c])
        w[:] = w.mean(axis=0)
    np.testing.assert_allclose(state.clients["w"], w, rtol=1e-11, atol=1e-14)
    assert (state.round, state.iteration) == (6, 30)


def test_accounting_and_metrics_fields(digits):
    ds, problem = digits
    partition = make_partition(ds.y, 8, "shared", seed=0)
    state, metrics = simulate(
        problem, partition, LocalSGD(lr=0.1, k=3), StopRule(max_rounds=10, eval_every=4), fstar=problem.optimum()
    )
    assert [m["round"] for m in metrics] == [4, 8, 10]  # every 4 rounds, and the last one
    assert state.bytes == 10 * 2 * 8 * 64 * 8  # rounds x (send + receive) x clients x d float64s
    assert set(metrics[0]) >= {
        "round",
        "iteration",
        "stage",
        "lr",
        "period",
        "batch",
        "objective",
        "gap",
        "accuracy",
        "bytes",
        "wall_s",
    }
    assert metrics[-1]["gap"] == pytest.approx(metrics[-1]["objective"] - problem.optimum())
    assert state.status == "budget"


def test_stops_at_target_and_reports_rounds(digits):
    ds, problem = digits
    partition = make_partition(ds.y, 16, "shared", seed=0)
    fstar = problem.optimum()
    plan = STLSGD(lr=1.6, T1=226, k1=32)
    state, metrics = simulate(problem, partition, plan, StopRule(target_gap=1e-4, max_iterations=10**6), fstar=fstar)
    assert state.status == "reached"
    assert metrics[-1]["gap"] <= 1e-4 < min(m["gap"] for m in metrics[:-1])
    assert state.rounds_to_target == metrics[-1]["round"] == state.round
    assert state.stage > 1


def test_budget_by_iterations(digits):
    ds, problem = digits
    partition = make_partition(ds.y, 2, "shared", seed=0)
    state, metrics = simulate(problem, partition, LocalSGD(lr=0.1, k=10), StopRule(max_iterations=35))
    assert state.status == "budget" and state.iteration == 35 and metrics[-1]["iteration"] == 35  # cut at the budget


def test_divergence_is_its_own_status(digits):
    ds, problem = digits
    partition = make_partition(ds.y, 2, "shared", seed=0)
    plan = STLSGD(lr=1e308, T1=10, k1=2, gamma=1e-300, name="stl_nc")
    state, metrics = simulate(problem, partition, plan, StopRule(max_rounds=50))
    assert state.status == "diverged"
    assert all(np.isfinite(m["objective"]) for m in metrics)


def test_same_seed_same_bits_other_seed_differs(digits):
    ds, problem = digits
    partition = make_partition(ds.y, 8, "noniid", seed=0, s=50)
    plan = STLSGD(lr=1.0, T1=100, k1=4, iid=False)
    runs = [simulate(problem, partition, plan, StopRule(max_rounds=40), seed=s) for s in (5, 5, 6)]
    strip = lambda ms: [{k: v for k, v in m.items() if k not in ("wall_s", "compute_s", "comm_s")} for m in ms]
    assert np.array_equal(runs[0][0].clients["w"], runs[1][0].clients["w"])
    assert strip(runs[0][1]) == strip(runs[1][1])
    assert not np.array_equal(runs[0][0].clients["w"], runs[2][0].clients["w"])


def test_sampler_is_uniform_over_each_clients_rows(digits):
    ds, _ = digits
    partition = make_partition(ds.y, 3, "split", seed=1)
    rows = Sampler(partition, 0).draw(20000, 1)
    for c in range(3):
        own = partition.client_rows(c)
        counts = np.bincount(rows[:, c, 0], minlength=ds.n)[own]
        assert set(np.unique(rows[:, c, 0])) == set(own)
        assert counts.std() / counts.mean() < 0.2


@pytest.mark.parametrize("mode", ["shared", "split", "noniid"])
def test_sampler_draws_rows_start_plus_floor_u_times_size(digits, mode):
    # The stream every stored result rests on: client c's j-th sample at step t is
    # rows[starts[c] + floor(u * sizes[c])], u the generator's next uniform number in (t, c, j) order.
    ds, _ = digits
    partition = make_partition(ds.y, 5, mode, seed=2)
    sampler = Sampler(partition, 7)
    u = np.random.Generator(np.random.PCG64(np.random.SeedSequence([7, 0x5751]))).random((2 * 9, 5, 3))
    drawn = np.concatenate([sampler.draw(9, 3), sampler.draw(9, 3)])
    for t, c, j in np.ndindex(*u.shape):
        local = int(u[t, c, j] * int(partition.sizes[c]))
        assert drawn[t, c, j] == partition.rows[int(partition.starts[c]) + local]
    assert drawn.dtype == np.int64


def test_long_rounds_are_stepped_in_slices_with_the_same_samples(digits, monkeypatch):
    import stlsgd.executors.simulator as simulator

    ds, problem = digits
    partition = make_partition(ds.y, 4, "split", seed=0)
    plan = LocalSGD(lr=0.3, k=50)
    whole, _ = simulate(problem, partition, plan, StopRule(max_rounds=3))
    monkeypatch.setattr(simulator, "SAMPLES_PER_CHUNK", 4 * 7)  # 7 steps a slice: 50 = 7 * 7 + 1
    sliced, _ = simulate(problem, partition, plan, StopRule(max_rounds=3))
    assert whole.sampler_state == sliced.sampler_state  # exactly the same draws were consumed
    np.testing.assert_allclose(sliced.clients["w"], whole.clients["w"], rtol=1e-12)


@pytest.mark.parametrize("plan", [SyncSGD(lr=0.5, lr_decay=0.01), CRPSGD(lr=0.5, rho=1.2, max_batch=16)])
def test_fused_synchronous_rounds_equal_round_by_round(digits, plan):
    # k = 1 rounds are taken in groups by one sync_steps call; a Topology that does not hold every client
    # runs them one by one (local steps, then the mean), as the torch.distributed executor does. Both give
    # the same numbers bit for bit.
    ds, problem = digits
    partition = make_partition(ds.y, 4, "split", seed=1)
    stop = StopRule(max_rounds=40, eval_every=7)
    seen = {}
    for name, topology in (("fused", LOCAL), ("one by one", Topology(clients=slice(0, 4)))):
        sampler = Sampler(partition, 3)
        rounds = []
        state = run(
            plan,
            problem,
            sampler,
            stop,
            init_run_state(problem, sampler, 4, 3),
            progress=False,
            on_metrics=lambda m: None,
            on_round=lambda st, rnd, rounds=rounds: rounds.append(st.round),
            align=5,
            topology=topology,
        )
        seen[name] = (state, rounds)
    fused, one = seen["fused"][0], seen["one by one"][0]
    assert np.array_equal(fused.clients["w"], one.clients["w"])
    assert (fused.round, fused.iteration, fused.bytes, fused.sampler_state) == (
        one.round,
        one.iteration,
        one.bytes,
        one.sampler_state,
    )
    assert seen["one by one"][1] == list(range(1, 41))
    # Groups end at evaluations (every 7), checkpoint alignment (every 5) and the budget; CR-PSGD's also where
    # its batch grows.
    assert {r for r in range(1, 41) if r % 7 == 0 or r % 5 == 0} | {40} <= set(seen["fused"][1])
    if isinstance(plan, SyncSGD):
        assert seen["fused"][1] == sorted({r for r in range(1, 41) if r % 7 == 0 or r % 5 == 0} | {40})
