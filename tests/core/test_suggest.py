"""stlsgd suggest and algorithm.auto: estimates against direct computations, the proposal's rules, and every
failure as one line or a stated fallback."""

from __future__ import annotations

import dataclasses
import itertools
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import yaml

from stlsgd.algorithms.baselines import LocalSGD, LocalSGDConfig
from stlsgd.algorithms.registry import PlanContext
from stlsgd.algorithms.schedules import LRCoupledConfig
from stlsgd.algorithms.stl_sgd import STLSGD, STLSCConfig, STLSGDStationary
from stlsgd.cli import main
from stlsgd.costmodel import Network, parse_network
from stlsgd.data import load_dataset, make_partition
from stlsgd.experiments import suggest
from stlsgd.experiments.build import build
from stlsgd.experiments.config import Experiment
from stlsgd.experiments.runner import run_experiment
from stlsgd.experiments.suggest import (
    IID_K1_STAGES,
    MIN_K1,
    ONE_ROUND_MARGIN,
    R_NONIID,
    AtOptimum,
    ClientsAtOptimum,
    Estimates,
    drift_rounds,
    estimate,
    fewest_median_rounds,
    method_config,
    model_gap,
    noise_dof,
    one_round,
    plan_rounds,
    propose,
    round_in_steps,
    stl_rounds,
)
from stlsgd.problems.logistic import LogisticRegression


def test_the_estimates_are_the_definitions_computed_directly() -> None:
    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    partition = make_partition(ds.y, 4, "noniid", seed=0, s=0)
    e = estimate(problem, partition)
    X, y, n = ds.X.toarray(), ds.y, ds.n
    H = X.T @ X / (4 * n) + problem.lam * np.eye(X.shape[1])
    assert e.L == pytest.approx(np.linalg.eigvalsh(H).max(), rel=1e-9)
    assert e.L_max == pytest.approx((X * X).sum(axis=1).max() / 4 + problem.lam)
    G = -0.5 * y[:, None] * X  # single-sample gradients at x_0 = 0
    g = G.mean(axis=0)
    assert e.sigma2 == pytest.approx(np.mean(np.sum((G - g) ** 2, axis=1)), rel=1e-9)
    clients = np.array([G[partition.client_rows(c)].mean(axis=0) for c in range(4)])
    assert e.zeta2 == pytest.approx(np.mean(np.sum((clients - g) ** 2, axis=1)), rel=1e-9)
    p = propose(e)
    assert p["lr"] == pytest.approx(4 / (2 * e.L)) and p["T1"] == math.ceil(1 / (e.mu * p["lr"]))
    assert p["drift"] is True  # label-sorted shards differ
    rule = p["T1"] // math.ceil(R_NONIID * math.sqrt(1 + 4 * e.zeta2 / e.sigma2))
    assert p["k"] == max(rule, min(MIN_K1, p["T1"] // 2)) and p["stage_end"] == "stationary"
    shared = propose(estimate(problem, make_partition(ds.y, 4, "shared", seed=0)))
    assert (shared["method"], shared["drift"], shared["k"]) == ("lr_coupled", False, IID_K1_STAGES * shared["T1"])


def _estimates(**changes: float) -> Estimates:
    base = dict(n=10_000, d=10, num_clients=32, L=2.0, L_max=4.0, mu=1e-5, sigma2=1.0, zeta2=0.0)
    return Estimates(**{**base, **changes})  # type: ignore[arg-type]


def test_iid_proposal_is_lr_coupled_stl_on_a_one_over_mu_t_decay_without_drift_correction() -> None:
    # eta_1 = N/(2L) = 32/4 = 8; T_1 = 1/(mu eta_1) = 1/(1e-4 * 8) = 1,250; eta_t = 8 / (1 + 8e-4 t);
    # k_1 = 256 T_1 = 320,000.
    p = propose(_estimates(mu=1e-4))
    assert (p["method"], p["lr"], p["lr_decay"], p["T1"], p["k"], p["drift"]) == (
        "lr_coupled",
        8.0,
        8e-4,
        1_250,
        320_000.0,
        False,
    )
    alg = method_config(STLSCConfig(auto=True, batch=2, outer_lr=0.7), p)  # what auto runs: batch and outer step kept
    assert isinstance(alg, LRCoupledConfig)
    assert (alg.lr, alg.lr_decay, alg.k, alg.drift, alg.batch, alg.outer_lr) == (8.0, 8e-4, 320_000.0, False, 2, 0.7)
    # its rounds: k_t = k_1 eta_1 / eta_t, eta_t = eta_1 / (1 + mu eta_1 t): 320,000, then 320,000 (1 + 256) =
    # 82,240,000, held at the plans' cap on a period, 2^20
    plan = alg.plan(PlanContext(num_samples=10_000, num_clients=32, lam=1e-4, iid=True, max_iterations=10**7))
    first, second = itertools.islice(plan.rounds(), 2)
    assert (first.steps, second.steps) == (320_000, 2**20)
    # mu = 1e-5: T_1 = 12,500 and 256 T_1 = 3,200,000 is past that cap, so the proposal says the 2^20 that runs
    assert propose(_estimates())["k"] == 2**20


# A model at x* worked by hand: one direction of curvature 1/2 holding 0.1 of f(x_0) - f*, sigma*^2 = 0.8, N = 4
# clients; with L = 2 a single client's step is 1/(2L) = 0.25.
_MODEL = AtOptimum(target_gap=3e-3, sigma2=0.8, curvatures=(0.5,), weights=(0.1,))


def test_the_one_round_model_gap_by_hand() -> None:
    e = _estimates(num_clients=4, mu=1e-2, optimum=_MODEL)
    # c = 2, 8 steps at lr 0.25: D = 1 + 0.25 x 8 / 2 = 2; bias 0.1 x 2^(-2 x 2 x 0.5) = 0.025; noise at the last lr
    # 0.25 / 2 over 4 clients: 0.125 x 0.8 / 16 = 0.00625
    assert model_gap(e, 0.25, 2.0, 8) == pytest.approx(0.025 + 0.00625, rel=1e-15)
    assert model_gap(e, 0.25, 2.0, 8, batch=5) == pytest.approx(0.025 + 0.00625 / 5, rel=1e-15)


def test_one_round_takes_the_fewest_steps_over_the_decay_constants() -> None:
    e = _estimates(num_clients=4, mu=1e-2, optimum=_MODEL)
    goal = _MODEL.target_gap / ONE_ROUND_MARGIN  # 1e-3
    # c = 1/mu = 100 halved while c h >= 1: 100, ..., 3.125. With c >= 6.25 the bias is gone by D = 12.5 and
    # the noise 0.0125 / D needs D >= 12.5: K = 11.5 c / 0.25 = 46 c (288 steps at c = 6.25); at c = 3.125 the bias
    # 0.1 D^(-3.125) needs D of about 12.97, about 150 steps: the fewest.
    c, steps = one_round(e, 0.25)
    assert c == 3.125 and 140 < steps < 160
    assert model_gap(e, 0.25, c, steps) <= goal < model_gap(e, 0.25, c, steps - 1)
    assert model_gap(e, 0.25, 6.25, 288) <= goal < model_gap(e, 0.25, 6.25, 287)
    # A budget under those 150 steps: all of it, at the c whose model gap after it is least.
    c100, steps100 = one_round(e, 0.25, max_steps=100)
    gaps = {c: model_gap(e, 0.25, c, 100) for c in (100 / 2**j for j in range(6))}
    assert steps100 == 100 and gaps[c100] == min(gaps.values()) > goal
    assert one_round(e, 0.25, max_steps=1_000) == (c, steps)  # a budget over them changes nothing


def test_with_a_target_alike_clients_get_one_round_of_local_sgd_sized_by_the_model() -> None:
    e = _estimates(num_clients=4, mu=1e-2, optimum=_MODEL)
    c, steps = one_round(e, 0.25)
    p = propose(e)
    assert (p["method"], p["lr"], p["lr_decay"], p["k"], p["drift"]) == ("local_sgd", 0.25, 0.25 / c, steps, False)
    assert p["model_gap"] == model_gap(e, 0.25, c, steps) and p["fallback"] is None
    alg = method_config(STLSCConfig(auto=True, batch=2), p)
    assert isinstance(alg, LocalSGDConfig) and (alg.lr, alg.lr_decay, alg.k, alg.batch) == (0.25, 0.25 / c, steps, 2)
    # a larger batch averages its noise: fewer steps (the batch auto runs with is passed in)
    assert propose(e, batch=4)["k"] < steps
    # clients that differ keep the Non-IID rule
    assert propose(_estimates(num_clients=4, mu=1e-2, zeta2=0.75, optimum=_MODEL))["method"] == "stl_sc"
    # a budget shorter than the round: one round of all of it, and the proposal says so
    short = propose(e, max_iterations=100)
    assert (short["method"], short["k"]) == ("local_sgd", 100.0) and short["fallback"].startswith("the budget, 100")
    assert propose(e, max_iterations=1_000) == p
    # A direction whose bias no allowed decay removes (curvature 1e-12 holding 1.0): no round reaches the target.
    # With no budget to fill, the rule that needs no target (LR-coupled STL), and it says why.
    flat = AtOptimum(target_gap=3e-3, sigma2=0.8, curvatures=(1e-12, 0.5), weights=(1.0, 0.1))
    fallback = propose(_estimates(num_clients=4, mu=1e-2, optimum=flat))
    assert fallback["method"] == "lr_coupled" and "no round up to" in fallback["fallback"]


def test_auto_on_alike_clients_reaches_the_target_in_its_one_round(tmp_path: Path) -> None:
    # digits 4/9, 4 clients sampling the whole set, the 1e-4 gap: the round the model sizes reaches it (seeds 0-2
    # measured: gaps 3.8e-5, 2.1e-5, 7.0e-5 after 24,836 steps)
    exp = Experiment.model_validate(
        {"data": {"dataset": "digits49", "num_clients": 4}, "algorithm": {"method": "stl_sc", "auto": True}}
    )
    summary = run_experiment(exp, tmp_path / "run", progress=False)
    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    p = propose(estimate(problem, make_partition(ds.y, 4, "shared", seed=0), target_gap=1e-4))
    assert (summary["plan"]["name"], summary["plan"]["k"], summary["plan"]["lr_decay"]) == (
        "local_sgd",
        p["k"],
        p["lr_decay"],
    )
    assert (summary["status"], summary["rounds_to_target"]) == ("reached", 1)


def test_auto_on_clients_of_unequal_shares_reaches_the_clients_mean_optimum(tmp_path: Path) -> None:
    # digits 4/9 dealt to 8 clients in Dirichlet(0.5) shares (5 to 127 rows): the equal average of the clients'
    # models converges to the minimum of their mean objective, whose f* the gap is measured against, and auto reaches
    # the 1e-4 target there (seeds 0-2 measured: 10, 15, 10 rounds). The samples' mean would be 2.2e-3 from it.
    exp = Experiment.model_validate(
        {
            "data": {"dataset": "digits49", "num_clients": 8, "partition": "dirichlet", "alpha": 0.5},
            "algorithm": {"method": "stl_sc", "auto": True},
            "run": {"max_iterations": 2_000_000, "eval_every": 5},
        }
    )
    summary = run_experiment(exp, tmp_path / "run", progress=False)
    assert summary["status"] == "reached" and summary["final"]["gap"] <= 1e-4
    ds = load_dataset("digits49")
    partition = make_partition(ds.y, 8, "dirichlet", seed=0, alpha=0.5)
    weighted = LogisticRegression(ds.X, ds.y, weights=partition.row_weights(ds.n))
    assert summary["fstar"] == pytest.approx(weighted.optimum(), rel=1e-14)
    plain = LogisticRegression(ds.X, ds.y)
    assert plain.loss(weighted.minimizer()) - plain.optimum() > 1e-3
    # stlsgd suggest says which objective it is (weights 361 / (8 n_c): 0.355 for 127 rows, 9.03 for 5)
    e = estimate(weighted, partition)
    assert e.row_weights == pytest.approx((361 / (8 * 127), 361 / (8 * 5)), rel=1e-12)
    assert "objective: the clients' mean, 1/N sum_c f_c (their shares differ: row weights 0.355 to 9.03)" in (
        suggest.report(e, propose(e))
    )


def test_the_models_at_the_optimum_are_built_only_with_a_target(tmp_path: Path) -> None:
    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    alike = estimate(problem, make_partition(ds.y, 4, "shared", seed=0), target_gap=1e-4, cache_dir=tmp_path)
    assert alike.optimum is not None and len(alike.optimum.curvatures) == ds.X.shape[1] and alike.clients is None
    # clients that differ: each client's model instead (N eigendecompositions), which chooses their plan
    partition = make_partition(ds.y, 4, "noniid", seed=0)
    differ = estimate(problem, partition, target_gap=1e-4, cache_dir=tmp_path)
    assert differ.zeta2 > 1e-3 * differ.sigma2 and differ.optimum is None and differ.clients is not None
    m = differ.clients
    # the clients' Hessians and gradients at x* are Eq. 8 on their rows: weighted by their sizes, f's; a client's
    # basis spans its rows' curvature (digits' always-blank pixels leave 57 of 64 directions), lam elsewhere
    d, r = ds.X.shape[1], m.curvatures.shape[1]
    assert r < d and m.bases.shape == (4, d, r) and m.lam == problem.lam
    for c in range(4):
        U, h = m.bases[c], m.curvatures[c]
        Hc = U @ np.diag(h - m.lam) @ U.T + m.lam * np.eye(d)
        rows = partition.client_rows(c)
        assert Hc == pytest.approx(LogisticRegression(ds.X[rows], ds.y[rows], lam=problem.lam).hessian(m.x), abs=1e-12)
    assert np.abs(partition.sizes @ m.gradients / partition.sizes.sum()).max() < 1e-9  # grad f(x*) = 0
    assert propose(differ)["drift"] is True
    # with a network auto does not consult them (it prices time): proposal_for asks for none
    unasked = estimate(problem, partition, target_gap=1e-4, cache_dir=tmp_path, client_models=False)
    assert unasked.clients is None and unasked.zeta2 == differ.zeta2
    for no_target in (estimate(problem, make_partition(ds.y, 4, "shared", seed=0)), estimate(problem, partition)):
        assert no_target.optimum is None and no_target.clients is None


def _digits49_plans() -> tuple[list[LocalSGD], list[int | None]]:
    """Three Local SGD + drift plans for digits 4/9's 8 label-sorted clients (lr 1 / (2L): L = 2.65), and their
    windows: the first and the last read their control variates from each round's first 256 steps."""
    return [LocalSGD(lr=0.19, k=k, lr_decay=1e-3) for k in (64, 1024, 16384)], [256, None, 256]


def _digits49_clients(cache_dir: Path) -> ClientsAtOptimum:
    """The clients' models of digits 4/9 on 8 label-sorted clients."""
    ds = load_dataset("digits49")
    partition = make_partition(ds.y, 8, "noniid", seed=0)
    m = estimate(LogisticRegression(ds.X, ds.y), partition, target_gap=1e-4, cache_dir=cache_dir).clients
    assert m is not None
    return m


def test_the_clients_thin_bases_move_as_their_full_eigenbases(tmp_path: Path) -> None:
    # 8 label-sorted clients of digits 4/9: about 45 rows each against d = 64, so each basis is thinner than d. The
    # same model with every client's whole d x d eigenbasis (numpy's eigh of its Hessian) moves the same and
    # counts the same rounds for every plan, windowed or not, with the control variates' noise drawn.
    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    partition = make_partition(ds.y, 8, "noniid", seed=0)
    thin = estimate(problem, partition, target_gap=1e-4, cache_dir=tmp_path).clients
    assert thin is not None and thin.bases.shape[2] <= max(partition.sizes) < ds.X.shape[1]
    full_h, full_V = zip(
        *(np.linalg.eigh(problem.hessian(thin.x, partition.client_rows(c))) for c in range(8)), strict=True
    )
    full = dataclasses.replace(thin, curvatures=np.array(full_h), bases=np.array(full_V))
    rng = np.random.default_rng(0)
    e, g = rng.standard_normal((2, 64)), rng.standard_normal((8, 2, 64))
    # S1, S2, S3 and the largest lr: 30 lands the steeper directions on their fixed points (h >= 1/30), in both
    sums = np.array([[3.0, 40.0], [0.1, 2.0], [0.01, 0.5], [0.1, 30.0]])
    moves = []
    for m in (thin, full):  # e and g in each client's basis, as drift_rounds passes them
        ue, ug = (np.einsum("ndr,npd->npr", m.bases, v) for v in (np.broadcast_to(e[None], g.shape), g))
        moves.append(suggest._moved(m, e, g, ue, ug, sums))
    assert moves[0] == pytest.approx(moves[1], rel=1e-9, abs=1e-12)
    plans, windows = _digits49_plans()
    rounds = [_rounds(m, plans, windows, every=5, max_rounds=200, seeds=1) for m in (thin, full)]
    assert rounds[0] == rounds[1] and all(r is not None for r in rounds[0])


def test_plans_of_several_seeds_in_chunks_count_as_each_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # digits 4/9's 8 label-sorted clients, the control variates' noise drawn: three plans at three seeds in one
    # call, two plans a chunk, count the rounds each plan counts at its seed alone; a plan that reaches or stops
    # early leaves the others as they were.
    m = _digits49_clients(tmp_path)
    assert m.spreads
    plans, windows = _digits49_plans()
    alone = {s: _rounds(m, plans, windows, every=5, max_rounds=200, seeds=s) for s in (0, 1, 2)}
    assert all(r is not None for rounds in alone.values() for r in rounds)
    assert len({tuple(rounds) for rounds in alone.values()}) > 1  # the seeds' draws differ
    built = plan_rounds(m, plans, windows)
    pairs = [(j, s) for s in (2, 0, 1) for j in range(3)]
    monkeypatch.setattr(suggest, "CHUNK_ENTRIES", 2 * 8 * 64)
    together = drift_rounds(m, [built[j] for j, _ in pairs], every=5, max_rounds=200, seeds=[s for _, s in pairs])
    assert together == [alone[s][j] for j, s in pairs]
    # ended by ``stop`` at the first evaluation where it holds: what reached by then, and None for the rest
    first = min(r for rounds in alone.values() for r in rounds if r is not None)
    seen: list[int] = []

    def stop(r: int, reached: list[int | None]) -> bool:
        seen.append(r)
        return any(v is not None for v in reached)

    ended = drift_rounds(
        m, [built[j] for j, _ in pairs], every=5, max_rounds=200, seeds=[s for _, s in pairs], stop=stop
    )
    assert seen == list(range(5, first + 1, 5))
    assert ended == [r if r == first else None for r in together]


def test_noise_drawn_where_the_run_is_counts_in_chunks_as_each_plan_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same digits 4/9 clients with the window's noise drawn at each plan's averaged model: each chunk's arrays
    # and the round's draws are held from round to round, so plans in chunks of two, some leaving on the way, must
    # count what each counts at its seed alone. At seeds 1 and 2 the draws there move the counts from those at x*.
    m = _digits49_clients(tmp_path)
    assert m.signed_rows
    plans, windows = _digits49_plans()
    kw = {"every": 5, "max_rounds": 200}
    alone = {
        s: [_rounds(m, [p], [w], seeds=s, noise_where="iterate", **kw)[0] for p, w in zip(plans, windows, strict=True)]
        for s in (1, 2)
    }
    assert all(r is not None for rounds in alone.values() for r in rounds)
    assert all(alone[s] != _rounds(m, plans, windows, seeds=s, **kw) for s in (1, 2))
    pairs = [(j, s) for s in (2, 1) for j in range(3)]
    monkeypatch.setattr(suggest, "CHUNK_ENTRIES", 2 * 8 * 64)
    built = plan_rounds(m, plans, windows)
    together = drift_rounds(m, [built[j] for j, _ in pairs], seeds=[s for _, s in pairs], noise_where="iterate", **kw)
    assert together == [alone[s][j] for j, s in pairs]


def test_clients_models_too_large_to_build_are_skipped_and_the_fallback_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    partition = make_partition(ds.y, 4, "noniid", seed=0)
    size = 64 * (64 + 4 * 64)  # d (d + sum_c min(n_c, d)) = 20,480: every client has more than d = 64 rows
    assert min(partition.sizes) > 64
    monkeypatch.setattr(suggest, "CLIENT_MODEL_SIZE", size)  # at the cap: built
    assert estimate(problem, partition, target_gap=1e-4, cache_dir=tmp_path).clients is not None
    monkeypatch.setattr(suggest, "CLIENT_MODEL_SIZE", size - 1)
    over = estimate(problem, partition, target_gap=1e-4, cache_dir=tmp_path)
    assert over.clients is None and over.clients_skipped is not None and "= 2.05e+04 is over" in over.clients_skipped
    p = propose(over, max_iterations=10**6, eval_every=5)
    assert p["method"] == "stl_sc" and p["stage_end"] == "stationary" and p["fallback"] == over.clients_skipped
    # alike clients, no target, or a network: nothing to skip, nothing said
    assert (
        estimate(
            problem, make_partition(ds.y, 4, "shared", seed=0), target_gap=1e-4, cache_dir=tmp_path
        ).clients_skipped
        is None
    )
    assert estimate(problem, partition).clients_skipped is None
    assert (
        estimate(problem, partition, target_gap=1e-4, cache_dir=tmp_path, client_models=False).clients_skipped is None
    )


def _clients(
    h: float | list[float],
    gradients: list[float],
    x: float = 1.0,
    noise: float = 0.0,
    target: float = 1e-3,
    spread: float | None = None,
):
    """Hand-made 1-D clients' models at x* = ``x``: curvature h each (or one per client), their gradients at x*,
    and with ``spread`` each client's single-sample gradient standard deviation (the control variates' noise)."""
    n = len(gradients)
    hs = np.broadcast_to(np.asarray(h, dtype=float), (n,))
    return ClientsAtOptimum(
        target_gap=target,
        x=np.array([x]),
        hessian=np.array([[hs.mean()]]),
        curvatures=hs[:, None].copy(),
        bases=np.ones((n, 1, 1)),
        lam=float(hs.min()),
        gradients=np.array(gradients, dtype=float)[:, None],
        noise=noise,
        spreads=() if spread is None else tuple(np.array([[spread]]) for _ in range(n)),
    )


def _rounds(
    m: ClientsAtOptimum, plans: list, windows: list | None = None, budget: int | None = None, **kw: int
) -> list[int | None]:
    """:func:`drift_rounds` of ``plans`` (with ``windows``, within ``budget``) in the clients' models ``m``."""
    return drift_rounds(m, plan_rounds(m, plans, windows, budget=budget), **kw)


def test_the_clients_model_rounds_by_hand() -> None:
    # One client, h = 0.5, x* = 1 (x_0 = 0: error -1), lr 0.1, k = 10 steps, no decay: S1 = 1, S2 = 0.1, S3 = 0.01,
    # a round multiplies the error by s = exp(-0.5 - 0.25 * 0.1 / 2 - 0.125 * 0.01 / 3) = 0.598737 (= 0.95^10 to
    # 6 digits). The gap 0.25 s^(2r) <= 1e-3 from r >= ln(0.004) / (2 ln s) = 5.38: round 6, or the evaluation at 10.
    one = _clients(0.5, [0.0])
    local = LocalSGD(lr=0.1, k=10)
    assert _rounds(one, [local], every=1, max_rounds=100) == [6]
    assert _rounds(one, [local], every=5, max_rounds=100) == [10]
    assert _rounds(one, [local], every=1, max_rounds=5) == [None]  # not within max_rounds
    assert _rounds(one, [local], every=1, max_rounds=100, budget=59) == [None]  # 5 rounds of 10
    # A step with lr h >= 1 lands on the client's fixed point along h (the quadratic's 1 - lr h would overshoot; the
    # logistic loss's bounded gradients saturate instead): lr 2 (lr h = 1), or lr 40 falling under 1/h within the
    # round (eta_t = 40 / (1 + t)), reaches x* = the one client's fixed point in round 1.
    assert _rounds(one, [LocalSGD(lr=2.0, k=10), LocalSGD(lr=40.0, k=10, lr_decay=40.0)], every=1, max_rounds=9) == [
        1,
        1,
    ]
    assert _rounds(one, [LocalSGD(lr=1e-7, k=2**20 + 1)], every=1, max_rounds=100) == [None]  # over the cap
    # plans run side by side, each as alone: a round of 20 steps squares s (round 3: 0.25 s^12 = 5.3e-4)
    assert _rounds(one, [local, LocalSGD(lr=0.1, k=20)], every=1, max_rounds=100) == [6, 3]
    # Noise: the averaged last step's eta noise / (4 N) = 0.1 * 0.05 / 4 = 1.25e-3 > 1e-3, never without a decay.
    # STL-SGD^sc (T_1 = 20, k_1 = 10) halves eta every two rounds at S1 = 1 a round: -ln s = 0.512917 (rounds 1-2),
    # 0.506354 (3-4: S2 = 0.05, S3 = 0.0025), 0.503151 (5-6); after round 6 the bias is 0.25 exp(-2 x 3.044843) =
    # 5.67e-4 and the noise 0.025 * 0.05 / 4 = 3.1e-4: 8.8e-4, under the target (after round 5: 1.55e-3 + 3.1e-4).
    noisy = _clients(0.5, [0.0], noise=0.05)
    stl = STLSGD(lr=0.1, T1=20, k1=10)
    assert _rounds(noisy, [local, stl], every=1, max_rounds=1000) == [None, 6]
    # The last lr each evaluation sees, with which drift_rounds leaves out a plan whose noise alone stays over the
    # target (local's 0.1 x 0.05 / 4 = 1.25e-3 at every round): STL's rounds end at 0.1, 0.1, 0.05, 0.05, 0.025,
    # 0.025 (iterations 10, 20, 40, 60, 100, 140); every 4th round: round 4's; every 5th: none within 3 rounds;
    # within a budget of 80 steps, none from round 5 (it would cross it).
    local_rounds, stl_rounds_ = plan_rounds(noisy, [local, stl])
    assert local_rounds.lasts(3, 1).tolist() == [0.1, 0.1, 0.1]
    assert stl_rounds_.lasts(6, 1).tolist() == [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
    assert stl_rounds_.lasts(6, 4).tolist() == [0.05] and stl_rounds_.lasts(3, 5).tolist() == []
    assert np.array_equal(
        plan_rounds(noisy, [stl], budget=80)[0].lasts(6, 1), [0.1, 0.1, 0.05, 0.05, np.nan, np.nan], equal_nan=True
    )
    # Two clients with the same curvature and opposite gradients at x*: each round's fixed points and the control
    # variates move symmetrically, so their average runs as the one client does.
    assert _rounds(_clients(0.5, [0.3, -0.3]), [local], every=1, max_rounds=100) == [6]


def test_the_averaged_noise_lies_in_few_directions() -> None:
    # H = diag(1, 4) and Sigma = diag(2, 8) turned by 30 degrees: H P + P H = Sigma gives P = diag(2 / 2, 8 / 8) in
    # H's basis, and H^1/2 P H^1/2 / 2 = diag(0.5, 2): nu = 2.5^2 / (0.25 + 4) = 1.470588.
    c, s = math.cos(math.pi / 6), math.sin(math.pi / 6)
    R = np.array([[c, -s], [s, c]])
    H, Sigma = R @ np.diag([1.0, 4.0]) @ R.T, R @ np.diag([2.0, 8.0]) @ R.T
    assert noise_dof(H, Sigma) == pytest.approx(2.5**2 / 4.25)
    # Alike curvatures: P = Sigma / (2 h), so Sigma's own eigenvalues (3 and 1 of [[2, 1], [1, 2]]): 16 / 10.
    assert noise_dof(2.0 * np.eye(2), np.array([[2.0, 1.0], [1.0, 2.0]])) == pytest.approx(1.6)
    assert noise_dof(np.eye(3), np.eye(3)) == pytest.approx(3.0)
    assert noise_dof(np.eye(2), np.zeros((2, 2))) == math.inf  # no noise: its mean, 0, stands


def test_the_clients_model_counts_the_averaged_noise_at_each_evaluation_as_a_draw() -> None:
    # x_0 = x* = 0, no bias: only the averaged noise, lr noise / (4 N) = 0.1 noise / 4 in the mean every round, against
    # the 1e-3 target. As a mean (nu = inf) it reaches where that is under the target: noise 0.05 (1.25e-3) never,
    # 0.03 (7.5e-4) at round 1.
    local = LocalSGD(lr=0.1, k=10)
    assert _rounds(_clients(0.5, [0.0], x=0.0, noise=0.05), [local], every=1, max_rounds=50) == [None]
    assert _rounds(_clients(0.5, [0.0], x=0.0, noise=0.03), [local], every=1, max_rounds=50) == [1]
    # Along one direction (nu = 1) it is the mean times chi^2_1, under the target with a chance of
    # P(chi^2_1 <= 1e-3 / mean) at each evaluation, independently; reached once the chance of none so far is at most
    # a half. Mean 1.25e-3: P(chi^2_1 <= 0.8) = 0.6289, round 1. Mean 4e-3: P(chi^2_1 <= 0.25) = 0.3829, none by
    # round 1 0.617, by round 2 0.381: round 2. Mean 2e-2: P(chi^2_1 <= 0.05) = 0.1769, 0.8231^r <= 0.5 from r = 4.
    for noise, rounds in ((0.05, 1), (0.16, 2), (0.8, 4)):
        m = dataclasses.replace(_clients(0.5, [0.0], x=0.0, noise=noise), noise_dof=1.0)
        assert _rounds(m, [local], every=1, max_rounds=50) == [rounds]
    # Every 5th round: the same chances, one an evaluation (round 4 -> the fourth evaluation, round 20).
    m = dataclasses.replace(_clients(0.5, [0.0], x=0.0, noise=0.8), noise_dof=1.0)
    assert _rounds(m, [local], every=5, max_rounds=50) == [20]
    # A plan whose noise alone leaves it over the target with a chance over a half within max_rounds never enters:
    # within 3 rounds, mean 2e-2 (0.8231^3 = 0.558).
    assert _rounds(m, [local], every=1, max_rounds=3) == [None]


def test_the_clients_model_with_control_variates_from_a_rounds_first_steps() -> None:
    # A window as long as the round is option II: the same rounds (here the hand-computed 6 above).
    local = LocalSGD(lr=0.1, k=10)
    alike = _clients(0.5, [0.3, -0.3])
    assert _rounds(alike, [local, local, local], windows=[None, 10, 50], every=1, max_rounds=100) == [6, 6, 6]
    # Alike curvatures: the average of the clients' fixed points is x* - H^-1 mean_c (g_c + c - c_c) whatever the
    # control variates are (the corrections sum to zero), so even the noise of a one-step window cancels.
    noisy_alike = _clients(0.5, [0.3, -0.3], spread=10.0)
    assert _rounds(noisy_alike, [local, local], windows=[None, 1], every=1, max_rounds=100) == [6, 6]
    # Curvatures 0.5 and 2, x* = 1, gradients -0.2 and 0.2 at x*: rounds of 2,000 steps at lr 0.01 (S1 = 20) bring
    # each client to its corrected fixed point. Option II's c_c is then mostly the mean gradient there, the old
    # c_c - c, and the correction catches up with the average slowly; from a round's first steps (S1 = 0.01 or 0.2)
    # c_c is near the gradient at the averaged model, and the model reaches the target in fewer rounds.
    differ = _clients([0.5, 2.0], [-0.2, 0.2])
    long = LocalSGD(lr=0.01, k=2_000)
    one, twenty, plain = _rounds(differ, [long] * 3, windows=[1, 20, None], every=1, max_rounds=100)
    assert one is not None and twenty is not None and plain is not None and max(one, twenty) < plain
    # With the clients' sampling noise (standard deviation 10 a sample), a one-step window's control variates are
    # off by N(0, 100) each round; with curvatures apart that does not cancel: the average is off by
    # 0.375 (eps_2 - eps_1), about 5, and the gap stays over the target. Twenty samples, and option II's 2,000, still
    # reach it. Drawn from a fixed seed: the same answer twice.
    noisy = _clients([0.5, 2.0], [-0.2, 0.2], spread=10.0)
    rounds = _rounds(noisy, [long] * 3, windows=[1, 20, None], every=1, max_rounds=100)
    assert rounds[0] is None and rounds[1] is not None and rounds[2] is not None
    assert rounds == _rounds(noisy, [long] * 3, windows=[1, 20, None], every=1, max_rounds=100)
    # The plans' rounds built once (PlanRounds) and read by two calls, as the draws of median_rounds read them:
    # the same answer.
    built = plan_rounds(noisy, [long] * 3, windows=[1, 20, None])
    for _ in range(2):
        assert drift_rounds(noisy, built, every=1, max_rounds=100) == rounds
    # The draw is at WINDOW_NOISE (2) times Sigma_c / W: the same rounds as a standard deviation of 10 sqrt(2) at 1.
    louder = _clients([0.5, 2.0], [-0.2, 0.2], spread=10.0 * math.sqrt(2.0))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(suggest, "WINDOW_NOISE", 1.0)
        assert _rounds(louder, [long] * 3, windows=[1, 20, None], every=1, max_rounds=100) == rounds
        assert _rounds(noisy, [long] * 3, windows=[1, 20, None], every=1, max_rounds=100) != rounds


def test_the_windows_noise_drawn_where_the_run_is_by_hand(tmp_path: Path) -> None:
    # One client of two 1-D rows, y x = 1 and 3. At x = 0 each sample's loss gradient is -sigma(0) y x = -0.5 and
    # -1.5; standard normals (1, -1), centred (1, -1): (-0.5 + 1.5) / sqrt(2). At x = ln 3 the weights sigma(-y x x)
    # are 1/4 and 1/28: (-0.25 + 3/28) / sqrt(2).
    m = dataclasses.replace(_clients(0.5, [0.0]), signed_rows=(sp.csr_matrix([[1.0], [3.0]]),))
    x = np.array([[0.0], [math.log(3.0)]])
    got = suggest._draws_at(m, x, [np.array([[1.0, -1.0], [1.0, -1.0]])])
    assert got.shape == (1, 2, 1)  # (clients, points, d)
    assert got[0, :, 0] == pytest.approx([1.0 / math.sqrt(2.0), (-0.25 + 3.0 / 28.0) / math.sqrt(2.0)], rel=1e-12)
    # At x*, every client's draws have the covariance of the factor drawn from there (ClientsAtOptimum.spreads):
    # with the n_c unit vectors as the normals, D^T D = Sigma_c exactly (the centring is a projection).
    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    real = estimate(problem, make_partition(ds.y, 4, "noniid", seed=0), target_gap=1e-4, cache_dir=tmp_path).clients
    assert real is not None and len(real.signed_rows) == 4
    for Z, F in zip(real.signed_rows, real.spreads, strict=True):
        n_c = Z.shape[0]
        one = dataclasses.replace(real, signed_rows=(Z,))
        D = suggest._draws_at(one, np.tile(real.x, (n_c, 1)), [np.eye(n_c)])[0]
        assert D.T @ D == pytest.approx(F.T @ F, rel=1e-9, abs=1e-12)


def test_a_pick_that_does_not_reach_with_the_noise_where_the_run_is_is_chosen_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Scripted by where the window's noise is drawn: at x* candidate 0 reaches in 5 rounds and candidate 1 in 10 at
    # every draw; at each round's averaged model candidate 0 reaches at the draws of `late` (None: never) and
    # candidate 1 in `second`. Where some draw of candidate 0 still reaches there (in 15, under the bar of 20), it
    # stands, its rounds the model's at x*; where none does, the choice is made again with the noise drawn there:
    # candidate 1, in 12. Where nothing reaches there, the stationary stages.
    e = dataclasses.replace(_estimates(num_clients=2, L=1.0, zeta2=0.5), clients=_clients(0.5, [0.3, -0.3]))
    never = [None] * 5
    for late, second, chosen, rounds, where in (
        ([None, None, None, None, 15], [12] * 5, 0, 5, "optimum"),
        (never, [12] * 5, 1, 12, "iterate"),
        (never, never, None, None, None),
    ):
        script = {"optimum": {0: [5] * 5, 1: [10] * 5}, "iterate": {0: late, 1: second}}
        monkeypatch.setattr(suggest, "drift_rounds", _by_rank(script))
        p = propose(e, eval_every=1, max_iterations=10**9)
        if chosen is None:
            assert p["stage_end"] == "stationary" and p["fallback"].startswith("no Local SGD + drift")
            continue
        candidate = suggest.drift_candidates(e)[chosen]
        assert {k: p[k] for k in candidate} == candidate
        assert (p["model_rounds"], p["noise"]) == (rounds, where)


def _scripted(script: dict[int, list[int | None]]):
    """A ``run`` for :func:`fewest_median_rounds` that reads each (candidate, seed)'s rounds from ``script[seed]``
    (None: never) and, like :func:`drift_rounds`, goes round by round and ends where ``stop`` holds; its calls, with
    the round each ended at, are kept."""
    calls: list[tuple[list[tuple[int, int]], int, int]] = []

    def run(pairs: list[tuple[int, int]], cap: int, stop) -> list[int | None]:
        reached: list[int | None] = [None] * len(pairs)
        r = 0
        while r < cap and any(v is None for v in reached):
            r += 1
            reached = [script[s][j] if script[s][j] is not None and script[s][j] <= r else None for j, s in pairs]
            if stop(r, reached):
                break
        calls.append((pairs, cap, r))
        return reached

    return run, calls


def test_the_fewest_median_rounds_over_draws_stop_at_the_first_majority() -> None:
    # Scripted draws of five seeds for four candidates (None: never). Medians: 0 -> 30 (10, 20, 30, 40, 50);
    # 1 -> 12 (5, 12, None, 12, 90); 2 -> None (three Nones); 3 -> 12 (12, 12, 12, None, None). The fewest: 12, by
    # candidates 1 and 3.
    script = {
        0: [10, 5, None, 12],
        1: [20, 12, None, 12],
        2: [30, None, None, 12],
        3: [40, 12, 1, None],
        4: [50, 90, 2, None],
    }
    run, calls = _scripted(script)
    assert fewest_median_rounds(run, 4, max_rounds=100, draws=5) == (12, [1, 3])
    # seeds 0-2 end at round 12, where candidate 3 has reached in all three (the fewest medians are at most 12);
    # seeds 3 and 4 run for the candidates with a draw within 12 (not 2: none) and end at 12, where candidate 1
    # has its third draw in (5, 12 and 12) and candidate 3 its three of the first group
    first = [(j, s) for j in range(4) for s in range(3)]
    assert calls == [(first, 100, 12), ([(j, s) for j in (0, 1, 3) for s in (3, 4)], 12, 12)]
    # within a max_rounds of 12 the same; within 11, no candidate's median (a draw past it counts as never)
    run, calls = _scripted(script)
    assert fewest_median_rounds(run, 4, max_rounds=12, draws=5) == (12, [1, 3])
    run, calls = _scripted(script)
    assert fewest_median_rounds(run, 4, max_rounds=11, draws=5) is None
    # one draw: the fewest of seed 0's rounds
    run, calls = _scripted(script)
    assert fewest_median_rounds(run, 4, max_rounds=100, draws=1) == (5, [1]) and calls == [
        ([(j, 0) for j in range(4)], 100, 5)
    ]
    # rounds counted at evaluations every 10 rounds: 12 is seen at 20, where candidates 1 and 3 have their majority
    # and 0 (10, 20, then 30) not yet
    run, calls = _scripted({s: [None if v is None else -(-v // 10) * 10 for v in row] for s, row in script.items()})
    assert fewest_median_rounds(run, 4, max_rounds=100, draws=5) == (20, [1, 3])
    # Of a tie, the candidates with the most draws in by then: with seed 4's 90 for candidate 1 now 12, four of its
    # draws are in by round 12 against candidate 3's three
    run, calls = _scripted({**script, 4: [50, 12, 2, None]})
    assert fewest_median_rounds(run, 4, max_rounds=100, draws=5) == (12, [1])


def test_stl_rounds_count_the_halvings_down_to_the_noise() -> None:
    # N = 4, L = 1: eta_1 = 2; the noise's eta: 4 N target / (3 noise) = 16e-3 / 0.9 = 0.01778; log2(2 / 0.01778)
    # = 6.81: 7 stages of two windows of max(every, 5) rounds
    e = _estimates(num_clients=4, L=1.0)
    assert stl_rounds(e, 0.3, 1e-3, every=5) == 70 and stl_rounds(e, 0.3, 1e-3, every=10) == 140
    assert stl_rounds(e, 0.0, 1e-3, every=1) == 10  # no noise: one stage


def test_the_stationary_stages_stop_halving_where_the_noise_is_under_a_third_of_the_target() -> None:
    # N = 4, L = 1: eta_1 = 2; the clients' noise 0.3 at a 1e-3 target: eta 4 N target / (3 noise) = 0.01778, and
    # 2 / 0.01778 = 112.5 = 2^6.81: six halvings leave 0.03125, over it; seven 0.015625, under it.
    e = dataclasses.replace(_estimates(num_clients=4, L=1.0, zeta2=0.5), clients=_clients(0.5, [0.3, -0.3], noise=0.3))
    assert suggest.noise_lr(4, 0.3, 1e-3) == pytest.approx(0.016 / 0.9)
    assert suggest.stationary_halvings(e) == 7
    assert suggest.stationary_halvings(e, batch=8) == 4  # eta 8x higher: 112.5 / 8 = 2^3.81
    # no noise, or eta_1 already under it: eta_1 throughout; without the clients' models: no floor
    assert suggest.stationary_halvings(dataclasses.replace(e, clients=_clients(0.5, [0.3, -0.3]))) == 0
    assert suggest.stationary_halvings(dataclasses.replace(e, L=1e3)) == 0  # eta_1 = 0.002
    assert suggest.stationary_halvings(_estimates(num_clients=4, L=1.0, zeta2=0.5)) is None
    # what auto runs where the clients' model finds no plan (a budget of 10 steps: none fits), and with a network
    p = propose(e, eval_every=1, max_iterations=10)
    assert (p["stage_end"], p["halvings"]) == ("stationary", 7)
    alg = method_config(STLSCConfig(auto=True), p)
    assert isinstance(alg, STLSCConfig) and alg.halvings == 7
    plan = alg.plan(PlanContext(num_samples=10_000, num_clients=4, lam=1e-5, iid=False, max_iterations=10))
    assert plan.stage(8)[0] == plan.stage(9)[0] == 2.0 / 2**7 and plan.stage(7)[0] == 2.0 / 2**6
    assert "eta halves at most 7 times (halvings), down to 0.01562" in suggest.report(e, p)
    net = Network(1e-5, 3.2e6, 1e-6, "custom", "test")
    assert propose(e, net)["halvings"] is None


def test_clients_that_differ_get_the_models_choice_where_it_reaches_sooner_than_stationary_stages() -> None:
    # N = 2, L = 1: lr 1/(2L) = 0.5, h = 0.5; every candidate brings the model to the target in its first round
    # (16 steps at 0.5 already: 0.25 exp(-8)^2 ~ 3e-8); then the fewest steps: STL-SGD^sc + drift's k_1 = 16, with
    # T_1 = 0.03 / (mu lr) = 6,000 (the first of DRIFT_LR_T1).
    e = dataclasses.replace(_estimates(num_clients=2, L=1.0, zeta2=0.5), clients=_clients(0.5, [0.3, -0.3]))
    p = propose(e, eval_every=1)
    assert (p["method"], p["lr"], p["T1"], p["k"], p["drift"], p["stage_end"], p["model_rounds"], p["stl_rounds"]) == (
        "stl_sc",
        0.5,
        6_000,
        16.0,
        True,
        "length",
        1,
        10,
    )
    alg = method_config(STLSCConfig(auto=True, batch=2), p)
    assert isinstance(alg, STLSCConfig) and (alg.lr, alg.T1, alg.k, alg.drift, alg.batch) == (0.5, 6_000, 16.0, True, 2)
    assert not alg.auto and alg.stage_end == "length"
    # no candidate within the run (a budget of 10 steps: every candidate's first round is longer): the stationary
    # stages, and why
    q = propose(e, eval_every=1, max_iterations=10)
    assert (q["method"], q["stage_end"]) == ("stl_sc", "stationary")
    assert q["fallback"].startswith("no Local SGD + drift or STL-SGD^sc + drift schedule tried reaches the target")
    # with a network auto prices rounds and steps: the capped STL-SGD^sc plan, the model not consulted
    net = Network(1e-5, 3.2e6, 1e-6, "custom", "test")
    assert propose(e, net)["method"] == "stl_sc"


def test_the_models_choice_stands_up_to_twice_the_stationary_stages_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stationary stages' count is the least they spend (here 10: one stage, every = 1), so a candidate is taken
    # while the model gives it fewer than STATIONARY_SLACK (2) times that: scripted, every candidate reaches in R
    # rounds when R is within the max_rounds drift_pick allows.
    e = dataclasses.replace(_estimates(num_clients=2, L=1.0, zeta2=0.5), clients=_clients(0.5, [0.3, -0.3]))
    assert stl_rounds(e, e.clients.noise, e.clients.target_gap, every=1) == 10
    for reach in (15, 19, 20, 25):
        monkeypatch.setattr(
            suggest,
            "drift_rounds",
            lambda m, plans, *, every, max_rounds, seeds=0, stop=None, noise_where="optimum", start=None, r=reach: (
                [r if r <= max_rounds else None] * len(plans)
            ),
        )
        p = propose(e, eval_every=1)
        if reach < 20:
            assert (p["model_rounds"], p["stl_rounds"], p["fallback"]) == (reach, 10, None)
        else:
            assert p["stage_end"] == "stationary" and p["fallback"].endswith(
                "in fewer than 20 rounds (2 x the stationary stages' count, 10)"
            )


def test_a_plan_some_draw_of_which_misses_within_the_budget_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    # Scripted: candidate 0 reaches in 5 rounds at seeds 0-2 and not at all at seeds 3-4 (median 5), candidate 1 in
    # 10 at every seed, the rest never. A run that misses by its budget's end never reaches, so candidate 0 is passed
    # over for candidate 1; where candidate 0's last two draws reach too (in 15, under the bar: twice the stationary
    # stages' count of 10), it stands, median 5.
    e = dataclasses.replace(_estimates(num_clients=2, L=1.0, zeta2=0.5), clients=_clients(0.5, [0.3, -0.3]))
    for late, chosen, rounds in ((None, 1, 10), (15, 0, 5)):
        script = {0: [5, 5, 5, late, late], 1: [10] * 5}
        # the same draws wherever the window's noise is drawn
        monkeypatch.setattr(suggest, "drift_rounds", _by_rank(dict.fromkeys(("optimum", "iterate"), script)))
        p = propose(e, eval_every=1, max_iterations=10**9)
        candidate = suggest.drift_candidates(e)[chosen]
        assert {k: p[k] for k in candidate} == candidate and p["model_rounds"] == rounds


def _by_rank(script: dict[str, dict[int, list[int | None]]]):
    """A :func:`drift_rounds` stand-in scripted by rank: a plan's rank is the order it is first seen in (the first call
    has every candidate, in their order, so a candidate's rank is its index), and its draw at seed s, with the window's
    noise drawn at ``noise_where``, is ``script[noise_where][rank][s]`` (missing or None: never; over ``max_rounds``:
    never)."""
    rank: dict[tuple[str, int | None], int] = {}

    def run(m, plans, *, every, max_rounds, seeds=0, stop=None, noise_where="optimum", start=None):
        ranks = [rank.setdefault((repr(p._plan), p.window), len(rank)) for p in plans]
        got = [script[noise_where].get(j, [None] * 5)[s] for j, s in zip(ranks, seeds, strict=True)]
        return [g if g is not None and g <= max_rounds else None for g in got]

    return run


def _reaching_local(e: Estimates, reach: dict[tuple[int, float], int]):
    """A :func:`drift_rounds` stand-in: Local SGD + drift with option II's control variates reaches in
    ``reach[(k, lr_decay in mu lr)]`` rounds at every draw (within ``max_rounds``), every other plan never."""

    def run(m, plans, *, every, max_rounds, seeds=0, stop=None, noise_where="optimum", start=None):
        got = []
        for p in plans:
            plan = p._plan
            local = plan.name == "local_sgd" and p.window is None
            r = reach.get((plan.k, round(plan.lr_decay / (e.mu * plan.lr), 9))) if local else None
            got.append(r if r is not None and r <= max_rounds else None)
        return got

    return run


def test_each_candidate_period_takes_the_windows_shorter_than_itself() -> None:
    # Local SGD + drift at period k with each drift_window W < k (W in 256, 1,024, 4,096, 16,384: the last since the
    # sparse sets' grids chose it); Algorithm 2's stages with every window, their period growing past it.
    e = dataclasses.replace(_estimates(num_clients=2, L=1.0, zeta2=0.5), clients=_clients(0.5, [0.3, -0.3]))
    windows: dict[float, set[int]] = {}
    for c in suggest.drift_candidates(e):
        if c["method"] == "local_sgd" and c["lr_decay"] == 0.0:
            windows.setdefault(c["k"], set()).add(c.get("drift_window"))
    assert windows == {
        256.0: {None},
        1024.0: {None, 256},
        4096.0: {None, 256, 1024},
        16384.0: {None, 256, 1024, 4096},
        **{float(k): {None, 256, 1024, 4096, 16384} for k in (65_536, 262_144, 1_048_576)},
    }
    stagewise = {c.get("drift_window") for c in suggest.drift_candidates(e) if c["method"] == "stl_sc"}
    assert stagewise == {None, 256, 1024, 4096, 16384}


def test_a_local_sgd_pick_is_chosen_again_among_the_plans_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Scripted by (period, lr_decay in mu lr), option II: Local SGD + drift reaches in 10 rounds at k 65,536 and a
    # decay of mu lr (among drift_candidates), in 8 at 131,072 and in 9 at 32,768 (powers of two between the
    # candidates' powers of four: only neighbours has those), the rest never. The first pick is 65,536 at 10; among
    # it and its neighbours, 131,072 at 8; where 65,536 at half the decay (only neighbours has it) reaches in 7,
    # that one.
    e = dataclasses.replace(_estimates(num_clients=2, L=1.0, zeta2=0.5), clients=_clients(0.5, [0.3, -0.3]))
    for extra, chosen in (({}, (131_072.0, 1.0, None, 8)), ({(65_536, 0.5): 7}, (65_536.0, 0.5, None, 7))):
        reach = {(65_536, 1.0): 10, (131_072, 1.0): 8, (32_768, 1.0): 9, **extra}
        monkeypatch.setattr(suggest, "drift_rounds", _reaching_local(e, reach))
        p = propose(e, eval_every=1, max_iterations=10**9)
        units = p["lr_decay"] / (e.mu * p["lr"])
        assert (p["method"], p["k"], pytest.approx(units), p.get("drift_window"), p["model_rounds"]) == (
            "local_sgd",
            *chosen,
        )
    local = [c for c in suggest.drift_candidates(e) if c["method"] == "local_sgd"]
    assert {c["k"] for c in local}.isdisjoint({131_072, 32_768})
    assert all(not math.isclose(c["lr_decay"], 0.5 * e.mu * c["lr"]) for c in local)
    # the neighbours without a decay: half and twice the period, every decay, each window shorter than the period
    near = suggest.neighbours(e, {"k": 65_536.0, "lr": 0.5, "lr_decay": 0.0})
    assert {c["k"] for c in near} == {32_768.0, 131_072.0}
    assert len(near) == 2 * len(suggest.DRIFT_DECAYS) * (1 + len(suggest.DRIFT_WINDOWS))
    # with a decay of mu lr: half of it (twice, 2 mu lr, is among DRIFT_DECAYS) at all three periods too
    near = suggest.neighbours(e, {"k": 65_536.0, "lr": 0.5, "lr_decay": e.mu * 0.5})
    assert len(near) == (2 * (len(suggest.DRIFT_DECAYS) + 1) + 1) * (1 + len(suggest.DRIFT_WINDOWS))
    # at the plans' cap on a period no longer one is tried
    assert max(c["k"] for c in suggest.neighbours(e, {"k": float(2**20), "lr": 0.5, "lr_decay": 0.0})) == 2.0**20 / 2


def test_a_local_sgd_pick_takes_a_first_step_of_n_over_2l_where_the_model_gives_it_fewer_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # N = 2, L = 1: one client's step 1/(2L) = 0.5, N/(2L) = 1. Scripted by (period, first lr), option II: Local SGD
    # + drift at k 65,536 and a decay of 4 mu lr (2 mu) reaches in 10 rounds from lr 0.5, and from lr 1 at the same
    # late schedule (lr / lr_decay = 1 / (4 mu) kept: lr_decay 4 mu) in 7: that plan. From lr 1 in 10: a tie keeps
    # the pick.
    e = dataclasses.replace(_estimates(num_clients=2, L=1.0, zeta2=0.5), clients=_clients(0.5, [0.3, -0.3]))
    late = 1.0 / (4.0 * e.mu)

    def reaching(large: int):
        def run(m, plans, *, every, max_rounds, seeds=0, stop=None, noise_where="optimum", start=None):
            got = []
            for p in plans:
                plan = p._plan
                kept = plan.name == "local_sgd" and p.window is None and plan.k == 65_536
                kept = kept and math.isclose(plan.lr, late * plan.lr_decay)
                r = {0.5: 10, 1.0: large}.get(plan.lr) if kept else None
                got.append(r if r is not None and r <= max_rounds else None)
            return got

        return run

    for large, chosen in ((7, (1.0, 4.0, 7)), (10, (0.5, 2.0, 10))):
        monkeypatch.setattr(suggest, "drift_rounds", reaching(large))
        p = propose(e, eval_every=1, max_iterations=10**9)
        assert (p["method"], p["k"], p["lr"], pytest.approx(p["lr_decay"] / e.mu), p["model_rounds"]) == (
            "local_sgd",
            65_536.0,
            *chosen,
        )
    pick = {"method": "local_sgd", "lr": 0.5, "lr_decay": 2 * e.mu, "k": 65_536.0, "drift": True}
    assert suggest.first_step(e, pick) == [{**pick, "lr": 1.0, "lr_decay": pytest.approx(4 * e.mu)}]
    # no such plan at a constant lr, for Algorithm 2's stages, or with one client (N/(2L) is 1/(2L))
    assert suggest.first_step(e, {**pick, "lr_decay": 0.0}) == []
    assert suggest.first_step(e, {**pick, "method": "stl_sc"}) == []
    assert suggest.first_step(dataclasses.replace(e, num_clients=1), pick) == []


def test_the_first_rounds_on_the_clients_true_objectives_by_hand() -> None:
    # Two 1-D clients of one row each, their signed rows z = 1 and 0.5, lambda = 0.1: L_0 = 1/4 + 0.1 = 0.35, blocks
    # of up to 1 / 0.35 = 2.86 of lr. Local SGD + drift at lr 0.5, k = 2 (option II): a round's two steps are one
    # block, a gradient step of 1.0. Round 1 from x_0 = 0, where client c's gradient is -sigma(0) z_c = -z_c / 2:
    # y = 0.5, 0.25, x = 0.375, control variates (x_0 - y_c) / 1.0 = -0.5, -0.25. Round 2 from x with the corrections
    # delta_c = mean(control) - control_c = 0.125, -0.125. With x* = 1 and H = 0.2, the gap 0.1 (x - 1)^2 is 0.039
    # after round 1 and 0.012 after round 2: with the target 2e-3 (within 10x it: 0.02) the start is round 2's.
    m = dataclasses.replace(
        _clients(0.2, [0.0, 0.0], target=2e-3), lam=0.1, signed_rows=(np.array([[1.0]]), np.array([[0.5]]))
    )
    sigma = lambda t: 1.0 / (1.0 + math.exp(-t))  # noqa: E731
    x1, control1 = 0.375, np.array([-0.5, -0.25])
    delta = control1.mean() - control1
    y = [x1 - (-sigma(-z * x1) * z + 0.1 * x1 + dc) for z, dc in zip((1.0, 0.5), delta, strict=True)]
    x2 = sum(y) / 2
    control2 = control1 - control1.mean() + (x1 - np.array(y)) / 1.0
    assert 0.1 * (x1 - 1) ** 2 > 0.02 >= 0.1 * (x2 - 1) ** 2
    start = suggest.true_start(m, plan_rounds(m, [LocalSGD(lr=0.5, k=2)]))[0]
    assert start is not None and start.rounds == 2
    assert start.x == pytest.approx([x2], abs=1e-12) and start.control[:, 0] == pytest.approx(control2, abs=1e-12)
    # a far target: round 1's; one never met within TRUE_ROUNDS rounds, or a plan that stops first: none
    far = suggest.true_start(dataclasses.replace(m, target_gap=1.0), plan_rounds(m, [LocalSGD(lr=0.5, k=2)]))[0]
    assert (
        far is not None
        and far.rounds == 1
        and far.x == pytest.approx([x1])
        and far.control[:, 0] == pytest.approx(control1)
    )
    near = dataclasses.replace(m, target_gap=1e-12)
    assert suggest.true_start(near, plan_rounds(near, [LocalSGD(lr=0.5, k=2)])) == [None]
    assert suggest.true_start(near, plan_rounds(near, [LocalSGD(lr=0.5, k=2)], budget=6)) == [None]
    # the blocks: steps of 0.125 merged where the running sum passes each multiple of 0.3 (0.375, 0.625, 1.0) and
    # at the window's end (2 steps): sums 0.25, 0.125, 0.25, 0.375; the window ends with block 0, its sum 0.25
    rnd = LocalSGD(lr=0.125, k=8).next_round(suggest.Cursor())
    sums, last, s1 = suggest._blocks(rnd, 2, 0.3)
    assert sums.tolist() == [0.25, 0.125, 0.25, 0.375] and (last, s1) == (0, 0.25)
    assert suggest._blocks(LocalSGD(lr=5.0, k=3).next_round(suggest.Cursor()), None, 0.3)[0].tolist() == [5.0] * 3


def test_the_clients_model_goes_on_from_a_start_as_from_its_rounds() -> None:
    # One client, h = 0.5, x* = 1, lr 0.1, k = 10: a round multiplies the error by s = 0.598737 and the gap 0.25 s^2r
    # is under 1e-3 from round 6 (test_the_clients_model_rounds_by_hand). From round 3's state (error -s^3) it still
    # reaches at 6; from x_0 as a start, as without one; from x* after round 3, at round 4.
    one = _clients(0.5, [0.0])
    s = math.exp(-0.5 - 0.25 * 0.1 / 2 - 0.125 * 0.01 / 3)
    no_control = np.zeros((1, 1))
    for start, rounds in (
        (suggest.Start(3, np.array([1.0 - s**3]), no_control), 6),
        (suggest.Start(0, np.zeros(1), no_control), 6),
        (suggest.Start(3, np.ones(1), no_control), 4),
    ):
        assert _rounds(one, [LocalSGD(lr=0.1, k=10)], every=1, max_rounds=100, start=start) == [rounds]


def test_a_local_sgd_pick_is_weighed_against_faster_decays_on_the_true_objectives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    e = dataclasses.replace(_estimates(num_clients=2, L=1.0, zeta2=0.5), clients=_clients(0.5, [0.3, -0.3]))
    m = dataclasses.replace(e.clients, signed_rows=(np.ones((1, 1)), np.ones((1, 1))))
    pick = {"method": "local_sgd", "lr": 0.5, "lr_decay": 1e-3, "k": 65_536.0, "drift": True}
    # beside it: half, 1.5, twice and four times its period, and each at half and a quarter of lr / lr_decay
    beside = suggest.true_variants(pick)
    periods = (32_768.0, 65_536.0, 98_304.0, 131_072.0, 262_144.0)
    assert [(c["k"], c["lr_decay"]) for c in beside] == [
        *((k, 1e-3) for k in periods if k != 65_536.0),
        *((k, decay) for decay in (2e-3, 4e-3) for k in periods),
    ]
    assert [c["k"] for c in suggest.true_variants({**pick, "lr_decay": 0.0})] == [
        32_768.0,
        98_304.0,
        131_072.0,
        262_144.0,
    ]
    assert max(c["k"] for c in suggest.true_variants({**pick, "k": float(2**20)})) == 2.0**20
    # wider, with a window W: also each period over 4 W at its decay with the window four times as long (at most the
    # longest of DRIFT_WINDOWS), less of the window's noise in the control variates
    windowed = {**pick, "k": 4096.0, "drift_window": 1024}
    assert [(c["k"], c["drift_window"]) for c in suggest.true_variants(windowed, wider=True)][-3:] == [
        (6144.0, 4096),
        (8192.0, 4096),
        (16384.0, 4096),
    ]
    assert len(suggest.true_variants(windowed, wider=True)) == len(suggest.true_variants(windowed)) + 3 == 17
    assert all(c["drift_window"] == 16384 for c in suggest.true_variants({**windowed, "drift_window": 16384}, True))

    def scripted(script: dict[tuple[int, float], list[int | None]]):
        # each plan's five draws by (period, lr_decay); every plan goes on from round 1, whatever its start
        def run(m, plans, *, every, max_rounds, seeds=0, stop=None, noise_where="optimum", start=None):
            assert start is not None and start.rounds == 1
            return script.get((plans[0]._plan.k, plans[0]._plan.lr_decay), [None] * 5)

        return run

    monkeypatch.setattr(suggest, "true_start", lambda m, plans: [suggest.Start(1, m.x, np.zeros((2, 1)))] * len(plans))
    choose = partial(suggest.true_choice, e, m, bar=100, batch=1, max_iterations=None, eval_every=1)
    # The pick takes 10 rounds from its start; at half its decay constant it takes 8 at four draws of five and misses
    # at one (passed over: a run that misses by its budget's end never reaches); at a quarter and twice the period, 7.
    script = {(65_536, 1e-3): [10] * 5, (65_536, 2e-3): [8, 8, 8, None, 8], (131_072, 4e-3): [7] * 5}
    monkeypatch.setattr(suggest, "drift_rounds", scripted(script))
    assert choose((pick, 12)) == ({**pick, "lr_decay": 4e-3, "k": 131_072.0, "true_rounds": 1}, 7)
    # a tie with the pick's rounds keeps the pick (even at fewer steps); of plans tied under it, the fewer steps
    monkeypatch.setattr(suggest, "drift_rounds", scripted({(65_536, 1e-3): [10] * 5, (32_768, 4e-3): [10] * 5}))
    assert choose((pick, 12)) == ({**pick, "true_rounds": 1}, 10)
    tied = {(65_536, 1e-3): [10] * 5, (131_072, 4e-3): [7] * 5, (65_536, 2e-3): [7] * 5}
    monkeypatch.setattr(suggest, "drift_rounds", scripted(tied))
    assert choose((pick, 12)) == ({**pick, "lr_decay": 2e-3, "true_rounds": 1}, 7)
    # a pick at the first evaluation: the plans beside it are not started (the pick's start, alone, is the one call)
    calls: list[int] = []

    def counted(m, plans):
        calls.append(len(plans))
        return [suggest.Start(1, m.x, np.zeros((2, 1)))] * len(plans)

    monkeypatch.setattr(suggest, "true_start", counted)
    monkeypatch.setattr(suggest, "drift_rounds", scripted({(65_536, 1e-3): [1] * 5, (32_768, 2e-3): [1] * 5}))
    assert (choose((pick, 12)), calls) == (({**pick, "true_rounds": 1}, 1), [1])
    # a pick whose median is the first evaluation but not every draw's: the plans beside it run, and one with more
    # draws in there replaces it (a run's better chance to be in by then), the most draws, then the fewest steps
    calls.clear()
    split = {(65_536, 1e-3): [1, 1, 2, 2, 1], (32_768, 2e-3): [1, 1, 1, 1, 2], (262_144, 1e-3): [1] * 5}
    monkeypatch.setattr(suggest, "drift_rounds", scripted(split))
    assert (choose((pick, 12)), calls) == (({**pick, "k": 262_144.0, "true_rounds": 1}, 1), [1, 14])
    split[(131_072, 4e-3)] = [1] * 5
    assert choose((pick, 12)) == ({**pick, "lr_decay": 4e-3, "k": 131_072.0, "true_rounds": 1}, 1)
    # later, the draws in by then do not rank: of plans beside it under its median, the fewest steps
    later = {(65_536, 1e-3): [10] * 5, (131_072, 4e-3): [7] * 5, (65_536, 2e-3): [7, 7, 7, 9, 9]}
    monkeypatch.setattr(suggest, "drift_rounds", scripted(later))
    assert choose((pick, 12)) == ({**pick, "lr_decay": 2e-3, "true_rounds": 1}, 7)
    # nor against the pick: later, a plan beside it at the pick's median with more draws in does not replace it
    monkeypatch.setattr(suggest, "drift_rounds", scripted({(65_536, 1e-3): [7, 7, 7, 9, 9], (32_768, 1e-3): [7] * 5}))
    assert choose((pick, 12)) == ({**pick, "true_rounds": 1}, 7)
    monkeypatch.setattr(suggest, "true_start", lambda m, plans: [suggest.Start(1, m.x, np.zeros((2, 1)))] * len(plans))
    # a plan beside the pick that reaches only at the last evaluation its budget holds is passed over (the runs are
    # noisier than the true objectives' rounds): at a budget of 7 rounds of 131,072 steps, 7 is that evaluation
    monkeypatch.setattr(suggest, "drift_rounds", scripted(script))
    budget = partial(suggest.true_choice, e, m, bar=100, batch=1, eval_every=1)
    assert budget((pick, 12), max_iterations=7 * 131_072) == ({**pick, "true_rounds": 1}, 10)
    assert budget((pick, 12), max_iterations=8 * 131_072)[1] == 7
    # or where the budget holds BUDGET_ROOM times the steps it reaches in: evaluated every 5 rounds, a plan reaching
    # at round 5 of 131,072 steps (655,360) whose budget ends before round 10 is taken at 819,200 steps and more
    room = {(65_536, 1e-3): [10] * 5, (131_072, 4e-3): [5] * 5}
    monkeypatch.setattr(suggest, "drift_rounds", scripted(room))
    every5 = partial(suggest.true_choice, e, m, bar=100, batch=1, eval_every=5)
    faster = {**pick, "lr_decay": 4e-3, "k": 131_072.0, "true_rounds": 1}
    assert every5((pick, 12), max_iterations=819_200) == (faster, 5)
    assert every5((pick, 12), max_iterations=819_199) == ({**pick, "true_rounds": 1}, 10)
    # none reaches in every draw: the pick as it came; so too without the clients' rows, with more of them than
    # TRUE_OBJECTIVE_SIZE, or for Algorithm 2's stages
    monkeypatch.setattr(suggest, "drift_rounds", scripted({}))
    assert choose((pick, 12)) == (pick, 12)
    monkeypatch.setattr(suggest, "drift_rounds", scripted(script))
    assert suggest.true_choice(e, e.clients, (pick, 12), 100, 1, None, 1) == (pick, 12)
    stages = {**pick, "method": "stl_sc"}
    assert choose((stages, 12)) == (stages, 12)
    monkeypatch.setattr(suggest, "TRUE_OBJECTIVE_SIZE", 3)  # 2 clients x 1 row x 1 feature = 2 fits; 3 x ... not
    assert choose((pick, 12))[1] == 7
    monkeypatch.setattr(suggest, "TRUE_OBJECTIVE_SIZE", 1)
    assert choose((pick, 12)) == (pick, 12)


def test_of_plans_tied_in_rounds_and_steps_the_least_noisy_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    # Scripted: Local SGD + drift at k 65,536 (option II) reaches in 10 rounds in every draw at decays of mu lr and
    # 4 mu lr, the rest never: the same rounds, the same steps. The larger decay ends round 10 at the lower lr, where
    # the averaged noise's draw is the smaller: that one (the candidates' order has the smaller decay first).
    e = dataclasses.replace(_estimates(num_clients=2, L=1.0, zeta2=0.5), clients=_clients(0.5, [0.3, -0.3]))
    monkeypatch.setattr(suggest, "drift_rounds", _reaching_local(e, {(65_536, 1.0): 10, (65_536, 4.0): 10}))
    p = propose(e, eval_every=1, max_iterations=10**9)
    assert (p["k"], pytest.approx(p["lr_decay"] / (e.mu * p["lr"])), p["model_rounds"]) == (65_536.0, 4.0, 10)


def test_auto_on_clients_that_differ_runs_the_models_choice(tmp_path: Path) -> None:
    exp = Experiment.model_validate(
        {
            "data": {"dataset": "digits49", "num_clients": 4, "partition": "noniid"},
            "algorithm": {"method": "stl_sc", "auto": True},
            "run": {"eval_every": 5},
        }
    )
    summary = run_experiment(exp, tmp_path / "run", progress=False)
    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    e = estimate(problem, make_partition(ds.y, 4, "noniid", seed=0), target_gap=1e-4)
    p = propose(e, eval_every=5, max_iterations=exp.run.max_iterations)
    assert p["drift"] is True and "model_rounds" in p  # the model's choice, not the stationary stages
    ran = summary["plan"]
    assert (ran["name"], ran["lr"]) == (p["method"], p["lr"]) and ran.get("k", ran.get("k1")) == p["k"]
    assert summary["rule"]["drift"] is True and summary["status"] == "reached"
    assert summary["rule"]["drift_window"] == p.get("drift_window")  # summary.json says which control variates ran
    assert summary["rounds_to_target"] <= 1.5 * p["model_rounds"]  # the model was near: 15 rounds against 20
    assert summary["auto_model_rounds"] == p["model_rounds"]  # kept beside the rounds the run took


def test_stagewise_candidates_end_no_stage_on_a_round_of_under_a_quarter_period() -> None:
    # A last round of 3 steps (2,819 = 11 x 256 + 3) or of 44 (300 = 256 + 44) is dropped; one of 129 (641 = 2 x 256
    # + 129) is kept, as are a stage that would be left with no round (40 steps at k 256) and one of whole rounds.
    assert suggest.whole_rounds(2_819, 256) == 2_816
    assert suggest.whole_rounds(641, 256) == 641
    assert suggest.whole_rounds(300, 256) == 256 and suggest.whole_rounds(40, 256) == 40
    assert suggest.whole_rounds(512, 256) == 512
    # lr = 1/(2L) = 0.25, mu = 1e-5: T_1 = 0.1 / (mu lr) = 40,000 = 39 x 1,024 + 64 -> 39,936 at k_1 = 1,024 (64 < 256)
    # and 120,000 = 117 x 1,024 + 192 -> 119,808; 40,000 = 9 x 4,096 + 3,136 stays; so do 16, 64 and 256 (0 or >= k/4)
    stl = {(c["T1"], c["k"]) for c in suggest.drift_candidates(_estimates()) if c["method"] == "stl_sc"}
    assert {(39_936, 1024.0), (119_808, 1024.0), (40_000, 4096.0), (40_000, 256.0), (12_000, 64.0)} <= stl
    assert (40_000, 1024.0) not in stl and all(T % k == 0 or T % k >= k / 4 for T, k in stl)


def test_non_iid_proposal_switches_drift_correction_on_and_ends_stages_when_stationary() -> None:
    # eta_1 = 8, T_1 = 12,500 as IID; zeta^2/sigma^2 = 0.75: R = ceil(32 sqrt(1 + 3)) = 64, k_1 = floor(12,500/64)
    p = propose(_estimates(zeta2=0.75))
    assert (p["lr"], p["T1"], p["drift"], p["stage_end"], p["k"], p["rounds_per_stage"]) == (
        8.0,
        12_500,
        True,
        "stationary",
        195.0,
        65,
    )
    # without a budget no stage ends on diminishing returns; with one, while k is at most the budget / 256
    assert p["diminishing_k"] is None
    assert propose(_estimates(zeta2=0.75), max_iterations=2_560_000)["diminishing_k"] == 10_000
    # ... and not with a network: the rule buys rounds with steps, and the network prices the steps
    net = Network(1e-5, 3.2e6, 1e-6, "custom", "test")
    assert propose(_estimates(zeta2=0.75), net, max_iterations=2_560_000)["diminishing_k"] is None
    # the control variates from each round's first quarter; option II with a network (its periods stay short)
    assert p["drift_share"] == 0.25 and propose(_estimates(zeta2=0.75), net)["drift_share"] is None
    # zeta^2/sigma^2 = 0.0025 (just above the threshold): R = ceil(32 sqrt(1.01)) = 33, k_1 = 378
    assert propose(_estimates(zeta2=0.0025))["k"] == 378.0
    # a short first stage: T_1 / R would be a step or two; at least 64 steps (T_1 = 2,000, R = 64: 31 -> 64) ...
    assert propose(_estimates(mu=6.25e-5, zeta2=0.75))["k"] == 64.0
    # ... and at most half of T_1 (T_1 = ceil(1 / 0.08) = 13: k_1 = 6, three rounds in stage 1)
    tiny = propose(_estimates(mu=0.01, zeta2=0.75))
    assert (tiny["T1"], tiny["k"], tiny["rounds_per_stage"]) == (13, 6.0, 3)


def test_a_network_caps_the_non_iid_period_at_twice_a_rounds_cost_in_steps() -> None:
    # A round: 10 us + 2 x 8 x 10 bytes (x and the control variate) at 3.2 MB/s = 60 us; a client-step 1 us: q = 60,
    # k_max = 2 q = 120 < the 195 of the rule without a network; stage 1 then has ceil(12,500 / 120) = 105 rounds.
    net = Network(1e-5, 3.2e6, 1e-6, "custom", "test")
    assert round_in_steps(_estimates(), net) == pytest.approx(60.0)
    p = propose(_estimates(zeta2=0.75), net)
    assert (p["k"], p["k_max"], p["rounds_per_stage"]) == (120.0, 120, 105)
    assert propose(_estimates(zeta2=0.75))["k_max"] is None
    # A cap above the rule's k_1 leaves k_1 as it was (a step of 0.1 us: q = 600)
    assert propose(_estimates(zeta2=0.75), Network(1e-5, 3.2e6, 1e-7, "custom", "test"))["k"] == 195.0
    # Alike clients: the network changes nothing (a longer period removes rounds without adding steps)
    assert propose(_estimates(mu=1e-4), net) == propose(_estimates(mu=1e-4))


def test_the_iid_threshold_and_the_zero_noise_fallback() -> None:
    assert propose(_estimates(zeta2=1e-3))["drift"] is False  # zeta^2 / sigma^2 = 1e-3: counted as alike
    assert propose(_estimates(zeta2=1.001e-3))["drift"] is True
    flat = propose(_estimates(sigma2=0.0, zeta2=5.0))
    assert flat["drift"] is False and flat["fallback"].startswith("sigma^2 = 0")


def test_auto_runs_with_the_proposal_and_says_so(tmp_path: Path) -> None:
    exp = Experiment.model_validate(
        {
            "data": {"dataset": "digits49", "num_clients": 4, "partition": "noniid"},
            "algorithm": {"method": "stl_sc", "auto": True},
            "run": {"max_rounds": 3, "target_gap": "none"},
        }
    )
    summary = run_experiment(exp, tmp_path / "run", progress=False)
    ds = load_dataset("digits49")
    p = propose(estimate(LogisticRegression(ds.X, ds.y), make_partition(ds.y, 4, "noniid", seed=0)))
    assert (summary["plan"]["lr"], summary["plan"]["T1"], summary["plan"]["k1"]) == (p["lr"], p["T1"], p["k"])
    assert summary["rule"]["drift"] is True and summary["plan"]["iid"] is True
    assert summary["rule"]["drift_share"] == p["drift_share"] == 0.25 and summary["rule"]["drift_window"] is None
    # clients that differ: stages end when the objective stops falling
    assert (p["stage_end"], summary["plan"]["name"]) == ("stationary", "stl_sc")
    assert isinstance(build(exp, None).plan, STLSGDStationary)
    assert summary["auto_model_rounds"] is None  # not the clients' models' choice
    # config.yaml leaves to auto what auto decided (null), and it validates again as the same run
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["algorithm"]
    assert (saved["auto"], saved["drift"], saved["iid"], saved["stage_end"]) == (True, None, None, None)


def test_auto_with_a_network_runs_the_capped_plan(tmp_path: Path) -> None:
    network = "latency=10us,bandwidth=1Gbit,step=1us"
    exp = Experiment.model_validate(
        {
            "data": {"dataset": "digits49", "num_clients": 4, "partition": "noniid"},
            "algorithm": {"method": "stl_sc", "auto": True, "network": network},
            "run": {"max_rounds": 3, "target_gap": "none"},
        }
    )
    summary = run_experiment(exp, tmp_path / "run", progress=False)
    ds = load_dataset("digits49")
    e = estimate(LogisticRegression(ds.X, ds.y), make_partition(ds.y, 4, "noniid", seed=0))
    p = propose(e, parse_network(network))
    assert p["k_max"] < propose(e)["k"]  # the cap binds from the first stage
    assert (summary["plan"]["k1"], summary["plan"]["k_max"]) == (p["k"], p["k_max"])
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["algorithm"]
    assert (saved["network"], saved["k_max"]) == (network, None)  # as given; auto's cap is in summary.json


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_suggest_prints_the_estimates_and_the_proposal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _write(tmp_path, "c.toml", '[data]\ndataset = "digits49"\nnum_clients = 4\n')
    assert main(["suggest", str(config)]) == 0
    out = capsys.readouterr().out
    assert "L = " in out and "sigma^2 = " in out and "Theorem 2: eta_1 <= 1/(6L)" in out
    # the default target (1e-4) and clients that sample alike: one planned round of Local SGD
    assert "at x*: sigma*^2 = " in out and "proposal (algorithm.auto = true): Local SGD, one round planned" in out
    assert "drift = false" in out
    assert main(["suggest", str(config), "--set", "run.target_gap=none"]) == 0
    out = capsys.readouterr().out  # no target: no model at x*, and the rule that needs none
    assert "at x*" not in out and "proposal (algorithm.auto = true): LR-coupled STL, lr = " in out
    # a budget under the round the model asks for: the round is the budget, and the proposal says so
    assert main(["suggest", str(config), "--set", "run.max_iterations=50"]) == 0
    out = capsys.readouterr().out
    assert "k = 50: the run's budget, fewer steps than the quadratic model at x* needs for a gap of" in out
    assert "fallback: the budget, 50 steps, is shorter than the round the target needs" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[data]\nnum_clients = 0\n", "data.num_clients: Input should be greater than or equal to 1"),
        ('[data]\ndataset = "missing.svm"\n', "missing.svm: not found"),
        (
            '[data]\ndataset = "mnist10"\n[problem]\nkind = "net"\n[algorithm]\nmethod = "local_sgd"\n',
            "problem.kind: suggest estimates the constants of Eq. 8",
        ),
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\nk = 4\n', "algorithm.auto: sets k itself; remove it"),
        # auto chooses the k-growth and drift correction: a value given with it was silently overridden
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\niid = false\n', "algorithm.auto: sets iid itself; remove it"),
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\niid = true\n', "algorithm.auto: sets iid itself; remove it"),
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\ndrift = false\n', "algorithm.auto: sets drift itself"),
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\ndrift = true\n', "algorithm.auto: sets drift itself"),
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\nstage_end = "length"\n', "algorithm.auto: sets stage_end"),
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\nk_max = 64\n', "algorithm.auto: sets k_max itself"),
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\ndiminishing_k = 64\n', "algorithm.auto: sets diminishing_k"),
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\nhalvings = 3\n', "algorithm.auto: sets halvings itself"),
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\ndrift_share = 0.5\n', "algorithm.auto: sets drift_share"),
        ('[algorithm]\nmethod = "stl_sc"\nnetwork = "lan,step=1us"\n', "algorithm.network: only with auto = true"),
        (
            '[algorithm]\nmethod = "stl_sc"\nauto = true\nnetwork = "lan"\n',
            "algorithm.network: auto needs the time of a client-step too",
        ),
        ('[algorithm]\nmethod = "stl_sc"\nauto = true\nnetwork = "moon"\n', "algorithm.network: unknown preset"),
    ],
)
def test_suggest_on_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str, shared_data: Path
) -> None:
    config = _write(tmp_path, "c.toml", text)
    assert main(["suggest", str(config), "--data-dir", str(shared_data)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_suggest_for_a_network(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _write(tmp_path, "c.toml", '[data]\ndataset = "digits49"\nnum_clients = 4\npartition = "noniid"\n')
    assert main(["suggest", str(config), "--network", "latency=10us,bandwidth=1Gbit,step=1us"]) == 0
    out = capsys.readouterr().out
    assert "every period at most k_max = " in out and "a round costs q = " in out
    alike = _write(tmp_path, "alike.toml", '[data]\ndataset = "digits49"\nnum_clients = 4\n')
    assert main(["suggest", str(alike), "--network", "latency=10us,bandwidth=1Gbit,step=1us"]) == 0
    out = capsys.readouterr().out  # alike clients: one round whatever the network
    assert "Local SGD, one round planned" in out and "the network given changes nothing here" in out
    assert main(["suggest", str(config), "--network", "lan"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--network: lan: suggest needs the time of a client-step too" in err, err


def test_zero_gradient_variance_is_a_stated_fallback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # y_i x_i is the same for both samples: every single-sample gradient at x_0 is the same (sigma^2 = 0).
    data = _write(tmp_path, "same.svm", "+1 1:1\n-1 1:-1\n+1 1:1\n-1 1:-1\n")
    config = _write(tmp_path, "c.toml", f'[data]\ndataset = "{data}"\nnum_clients = 2\npartition = "split"\n')
    assert main(["suggest", str(config)]) == 0
    out = capsys.readouterr().out
    assert (
        "sigma^2 = 0 " in out
        and "fallback: sigma^2 = 0 (every sample's gradient at x_0 is the same): treated as IID" in out
    )
