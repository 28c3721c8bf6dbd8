"""Tuning-free STL-SGD^sc: the constants of the paper's theory estimated from the data, and a proposal.

``stlsgd suggest CONFIG`` estimates, for the config's logistic problem (Eq. 8) and partition:

- L: the largest eigenvalue of the Hessian at x_0 = 0, X^T X / (4n) + lambda I, by power iteration; and
  L_max = max_i ||x_i||^2 / 4 + lambda, the smoothness of the worst single sample (from the row norms);
- mu = lambda (Eq. 8 is lambda-strongly convex);
- sigma^2: the variance of single-sample gradients at x_0, E_i ||grad f_i(x_0) - grad f(x_0)||^2;
- zeta^2: the spread of the clients' gradients at x_0, 1/N sum_c ||grad f_c(x_0) - grad f(x_0)||^2 (the paper's
  zeta_f^* is taken at x*; x_0 needs no optimum and is where stage 1 starts).

It prints them with the values Theorem 2 prescribes (eta_1 <= 1/(6L), T_1 eta_1 = 6/mu, and k_1 = min{1/(6 eta_1
L N), 1/(9 eta_1 L)} IID or min{sigma / sqrt(6 eta_1 L N (sigma^2 + 4 zeta^2)), 1/(9 eta_1 L)} Non-IID), which are
too conservative to use (k_1 < 1: an average after every step), and the proposal ``algorithm.auto = true`` runs:

- eta_1 = N / (2L): the largest step 1/(2L) of one client, scaled by the N clients whose steps are averaged (the
  linear scaling the paper's eta_1 = N/10 follows);
- T_1 = 1 / (mu eta_1): the paper's experimental rule eta_1 T_1 = 1/lambda (Theorem 2's form, with 1 for 6);
- when the clients sample alike (zeta^2 / sigma^2 <= IID_SHARE) and the run has a target gap (so f* and x* are
  computed for it anyway): one round of Local SGD, no drift correction, sized by the quadratic model at x*
  (:func:`model_gap`, :func:`one_round`): each client runs alone until the round's end, at a single client's step
  eta_1 = 1/(2L) on eta_t = eta_1 / (1 + eta_1 t / c), and c and the round's K steps are the pair with the fewest
  steps for which the model's gap, the bias left in each Hessian direction plus the N clients' averaged noise
  eta_K sigma*^2 / (4N), is a third of the target (within the run's budget: where the budget is shorter, the round
  is all of it, at the c whose model gap after it is least). Every client samples the whole objective, so a round
  buys only the average of N runs: the fewest rounds are one long enough for the target;
- when the clients sample alike and there is no target: LR-coupled STL (the paper's eta k = constant on
  eta_t = eta_1 / (1 + mu eta_1 t), the 1/(mu t) decay of strongly convex SGD, where Algorithm 2 halves eta once a
  stage), k_1 = IID_K1_STAGES T_1 (at most the plans' cap, 2^20), no drift correction: each round is
  1 + IID_K1_STAGES times all the steps before it (up to that cap), and the lr falls smoothly inside it;
- otherwise drift correction on, and stages that end when the run is stationary (``stage_end = "stationary"``,
  :class:`~stlsgd.algorithms.stl_sgd.STLSGDStationary`: the objective is higher than five or more rounds before,
  at most T_s), and k_1 = T_1 / R, R = R_NONIID sqrt(1 + 4 zeta^2 / sigma^2) (Theorem 2's Non-IID factor), but at
  least MIN_K1 steps (at most T_1 / 2). With the stage ended online, R no longer has to be the rounds a stage.
  While the period is at most the budget / DIMINISHING_BUDGET (``diminishing_k``), a stage also ends once its fall
  over the test's window is under a quarter of its fall so far (not with a network: it buys rounds with steps).
  With a network given (``algorithm.network``, ``stlsgd suggest --network``), every period is capped at
  k_max = NETWORK_CAP q, q = (latency + the bytes a client sends a round / bandwidth) / step the cost of one round
  in client-steps: longer rounds would cut communication, already at most a third of a round's time, and add drift
  steps; in IID data the network changes nothing (a longer period removes rounds without adding steps there).

``auto`` sets lr, k, T1, iid, drift, stage_end, k_max and diminishing_k itself: any of them given beside it is refused (STLSCConfig).

Measured against each column's grid (docs/results/schedules.md, *Tuning-free default*): the fixed-length rule this
replaces (R = 64 sqrt(1 + 4 zeta^2/sigma^2) rounds a stage) spent 775 rounds on a9a Non-IID and 655 on MNIST
Non-IID; no static rule tried held on every column.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from stlsgd.algorithms.registry import MAX_STEPS, REGISTRY, MethodConfig
from stlsgd.algorithms.schedules import DEFAULT_K_MAX
from stlsgd.costmodel import Network
from stlsgd.data import Partition
from stlsgd.errors import ConfigError, StlsgdError
from stlsgd.files import cache_dir
from stlsgd.problems.logistic import LogisticRegression, _expit

# The first period under drift correction (Non-IID) is T_1 / R with R = R_NONIID sqrt(1 + 4 zeta^2 / sigma^2)
# (Theorem 2's Non-IID factor on a base measured on a9a and MNIST Non-IID: a9a took 145-160 rounds with R = 38,
# MNIST 245-290 with R = 40; with a fixed 64 or 128 steps, 130-195 and 325-415), but at least MIN_K1 steps (at most
# T_1 / 2): a small data set has a short T_1 and R would leave a step or two a round, over which five rounds move
# the objective less than its noise, so stages ended early (digits49: 1,530 rounds at k_1 = 2, 20-35 at 60).
R_NONIID = 32
MIN_K1 = 64
# Alike clients without a target gap: LR-coupled STL's first period, in units of T_1 = 1/(mu eta_1). Every client
# samples the whole objective, so a round buys only the average of N runs: a first round long enough for the
# 1/(mu t) decay to bring eta down 257-fold leaves one to three rounds. Medians of three seeds
# (docs/results/schedules.md), 8 -> 32 -> 256 T_1: a9a IID 6 -> 5 -> 3 rounds, MNIST IID 4 -> 3 -> 3, three small
# sets 2-3 -> 1-2 -> 1; 512 and 1,024 T_1 no fewer (on a9a and MNIST both are the plans' 2^20 cap on a period).
IID_K1_STAGES = 256
# Alike clients with a target gap: one round of Local SGD sized by the quadratic model at x* (:func:`one_round`) to
# reach ONE_ROUND_MARGIN times less than the target. On 60 one-round runs on a9a and MNIST (lr 0.05-10, c 1,000 to
# 1/mu, 100 k to 3.3 M steps), the model's gap was 0.7-1.7x the measured one in 33 of the 35 that ended under 3.5e-4
# (0.32x where the lr fell 16,000-fold, 0.56x at MNIST's 3.2e-4), and down to 0.09x in rounds that ended far from x*
# (gaps of 4e-4 to 3e-2: outside the quadratic model's reach, and not where a sized round ends). A round's gap is
# random (the last iterates of N runs): sized for half the target, 3 of 18 runs on six sets (seeds 0-2) ended their
# round 1.05-1.17x over it; for a third, 1 of 18 (digits 3/8, 1.38x; docs/results/schedules.md).
ONE_ROUND_MARGIN = 3.0
# Below this share of the gradient noise, the clients count as sampling alike (zeta^2 / sigma^2).
IID_SHARE = 1e-3
# With a network, no round longer than NETWORK_CAP times the client-steps one round's communication costs. Measured
# on a9a Non-IID, datacenter (0.5 ms a round, 446 ns a step: q = 1,121), seeds 0-2, predicted time to the target:
# uncapped 325, 392, 377 ms (stationary stages only, as with a network); capped at 2q 285, 285, 351 ms (at about
# 1q, when the cap was chosen: 373, 352, 326 ms against 2q's 278, 312, 358); MNIST (639 ns, 2q = 1,597) 1,569, 922,
# 1,328 -> 979, 912, 1,049 ms (docs/results/schedules.md).
NETWORK_CAP = 2
# Clients that differ: a stage also ends on diminishing returns while its period is at most the budget /
# DIMINISHING_BUDGET (STLSGDStationary.diminishing_k). Such stages are about ten rounds and k doubles each stage, so a
# stage at period k costs about 10 k steps and the ones after it twice as many each: at k = budget / 256 the next
# four would cost 10 k (2 + 4 + 8 + 16) = 300 k, more than the budget. MNIST Non-IID (budget 3.6 M, seeds 0-2): with
# the test at every period, the budget at every seed; up to 14,000 steps (3.6 M / 256), 150, 150, 160 rounds; up to
# 30,000, 130, 149, the budget (docs/results/schedules.md). Without a budget, or with a network (predicted time, not
# rounds), off.
DIMINISHING_BUDGET = 256


def _share(sigma2: float, zeta2: float) -> float:
    """zeta^2 / sigma^2, the clients' difference against the gradient noise; 0 when sigma^2 = 0 (every sample's
    gradient the same: no client can differ). Clients sample alike at most IID_SHARE."""
    return zeta2 / sigma2 if sigma2 > 0 else 0.0


@dataclass(frozen=True)
class AtOptimum:
    """The quadratic model of Eq. 8 at x* that sizes alike clients' one long round (:func:`one_round`)."""

    target_gap: float
    #: Single-sample gradient variance at x*, E_i ||grad f_i(x*)||^2.
    sigma2: float
    #: Eigenvalues h_i of the Hessian at x*, and w_i = h_i (v_i . x*)^2 / 2: what direction i holds of
    #: f(x_0) - f* in the model (x_0 = 0).
    curvatures: tuple[float, ...]
    weights: tuple[float, ...]


@dataclass(frozen=True)
class Estimates:
    n: int
    d: int
    num_clients: int
    L: float
    L_max: float
    mu: float
    sigma2: float
    zeta2: float
    #: With a target gap (f* known) and alike clients: the model at x* (else None).
    optimum: AtOptimum | None = None


def _sample_gradients(problem: LogisticRegression, w: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray, float]:
    """The per-sample loss gradients at ``w`` (one row each; the L2 term lam w, the same for every sample, left
    out), their mean, and sigma^2 = E_i ||grad f_i(w) - grad f(w)||^2, which that shared term does not change."""
    y = problem.y
    G = sp.diags(-y * _expit(-y * (problem.X @ w))) @ problem.X
    g = np.asarray(G.mean(axis=0)).ravel()
    return G, g, max(float(np.asarray(G.multiply(G).sum(axis=1)).mean() - g @ g), 0.0)


def at_optimum(problem: LogisticRegression, target_gap: float, cache_dir: Path | None = None) -> AtOptimum:
    """The model at x* (Newton's, or the one :meth:`LogisticRegression.optimum` cached for the target)."""
    w = problem.minimizer(cache_dir)
    sigma2 = _sample_gradients(problem, w)[2]
    h, V = np.linalg.eigh(problem.hessian(w))
    return AtOptimum(
        target_gap=target_gap,
        sigma2=sigma2,
        curvatures=tuple(h.tolist()),
        weights=tuple((0.5 * h * (V.T @ w) ** 2).tolist()),
    )


def estimate(
    problem: LogisticRegression,
    partition: Partition,
    iterations: int = 200,
    target_gap: float | None = None,
    cache_dir: Path | None = None,
) -> Estimates:
    """The constants of Theorem 2 for ``problem`` on ``partition`` (see the module docstring), and with a target
    gap the model at x* :func:`one_round` plans from."""
    X, lam, n = problem.X, problem.lam, problem.num_samples
    v = np.random.default_rng(0).standard_normal(X.shape[1])
    L = 0.0
    for _ in range(iterations):  # power iteration on H(0) = X^T X / (4n) + lam I
        v = X.T @ (X @ v) / (4 * n) + lam * v
        L = float(np.linalg.norm(v))
        if not (L > 0 and math.isfinite(L)):
            raise StlsgdError("suggest: the Hessian at x_0 is zero or not finite (no features?); cannot estimate L")
        v /= L
    rows = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    G, g, sigma2 = _sample_gradients(problem, np.zeros(X.shape[1]))  # at x_0 = 0
    clients = np.array(
        [np.asarray(G[partition.client_rows(c)].mean(axis=0)).ravel() for c in range(partition.num_clients)]
    )
    zeta2 = max(float(np.mean(np.sum((clients - g) ** 2, axis=1))), 0.0)
    return Estimates(
        n=n,
        d=X.shape[1],
        num_clients=partition.num_clients,
        L=L,
        L_max=float(rows.max() / 4 + lam),
        mu=lam,
        sigma2=sigma2,
        zeta2=zeta2,
        # The model at x* sizes only alike clients' one round (:func:`propose`): where clients differ its d x d
        # eigendecomposition is not paid.
        optimum=at_optimum(problem, target_gap, cache_dir)
        if target_gap is not None and _share(sigma2, zeta2) <= IID_SHARE
        else None,
    )


def theorem2(e: Estimates) -> dict[str, float]:
    """Theorem 2's values at its largest step eta_1 = 1/(6L), IID and Non-IID."""
    eta = 1.0 / (6.0 * e.L)
    k_iid = min(1.0 / (6 * eta * e.L * e.num_clients), 1.0 / (9 * eta * e.L))
    k_non = (
        min(
            math.sqrt(e.sigma2) / math.sqrt(6 * eta * e.L * e.num_clients * (e.sigma2 + 4 * e.zeta2)),
            1.0 / (9 * eta * e.L),
        )
        if e.sigma2 > 0
        else k_iid
    )
    return {"lr": eta, "T1": 6.0 / (e.mu * eta), "k1_iid": k_iid, "k1_noniid": k_non}


def _round_bytes(e: Estimates) -> int:
    """What a client sends a round with drift correction: x and its control variate, float64."""
    return 2 * 8 * e.d


def round_in_steps(e: Estimates, network: Network) -> float:
    """q: what one round's communication costs, in client-steps."""
    assert network.step_s is not None  # the config refuses a network without a step's time
    return (network.latency_s + _round_bytes(e) / network.bandwidth_Bps) / network.step_s


def model_gap(e: Estimates, lr: float, c: float, steps: int, batch: int = 1) -> float:
    """The gap f - f* after one round of ``steps`` steps from x_0 = 0 on eta_t = lr / (1 + lr t / c) (c / t once
    t >> c / lr), averaged over the N clients, in the quadratic model at x*: the bias sum_i w_i D^(-2 c h_i),
    D = 1 + lr steps / c = lr / eta_K (prod_t (1 - eta_t h) ~ exp(-h sum_t eta_t) = D^(-c h)), plus the N
    clients' averaged noise at the last lr, eta_K sigma*^2 / (4 N batch) (SGD's stationary spread on a quadratic,
    E[f - f*] = eta tr(Sigma) / 4)."""
    o = e.optimum
    assert o is not None
    D = 1.0 + lr * steps / c
    h, w = np.asarray(o.curvatures), np.asarray(o.weights)
    return float(np.sum(w * D ** (-2.0 * c * h))) + lr / D * o.sigma2 / (4.0 * e.num_clients * batch)


def one_round(e: Estimates, lr: float, batch: int = 1, max_steps: int = MAX_STEPS) -> tuple[float, int]:
    """(c, K): the decay constant of eta_t = lr / (1 + lr t / c) and the fewest steps K <= ``max_steps`` for which
    :func:`model_gap` is at most the target / ONE_ROUND_MARGIN, over c = 1/mu (every direction's bias falls at
    least as fast as 1/t^2) halved down to 1/h_max; when no K up to ``max_steps`` gets there, all of them at the c
    whose model gap after them is least."""
    o = e.optimum
    assert o is not None
    goal, cs = o.target_gap / ONE_ROUND_MARGIN, []
    c = 1.0 / e.mu
    while c * max(o.curvatures) >= 1.0:
        cs.append(c)
        c /= 2.0
    at_most = {c: model_gap(e, lr, c, max_steps, batch) for c in cs}  # the least each c can reach
    best: tuple[float, int] | None = None
    for c in cs:
        if at_most[c] <= goal:
            lo, hi = 0, max_steps  # model_gap falls with the steps: the fewest that reach the goal, by bisection
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if model_gap(e, lr, c, mid, batch) <= goal else (mid, hi)
            if best is None or hi < best[1]:
                best = (c, hi)
    return best if best is not None else (min(cs, key=at_most.__getitem__), max_steps)


def propose(
    e: Estimates, network: Network | None = None, batch: int = 1, max_iterations: int | None = None
) -> dict[str, Any]:
    """The settings ``algorithm.auto`` runs with (see the module docstring), and why; ``max_iterations`` is the
    run's budget, which the one round of alike clients fits in."""
    share = _share(e.sigma2, e.zeta2)
    # sigma^2 = 0: every sample has the same gradient at x_0, nothing to average away and no clients differ.
    fallback = "sigma^2 = 0 (every sample's gradient at x_0 is the same): treated as IID" if e.sigma2 <= 0 else None
    lr = e.num_clients / (2.0 * e.L)
    T1 = max(int(math.ceil(1.0 / (e.mu * lr))), 1)
    drift = share > IID_SHARE
    if not drift and e.optimum is not None:
        # Alike clients and a target: one round as long as the model says the target needs. No average happens
        # before its end, so each client runs at a single client's step, 1/(2L).
        lr1 = 1.0 / (2.0 * e.L)
        c, steps = one_round(e, lr1, batch, MAX_STEPS if max_iterations is None else max_iterations)
        gap = model_gap(e, lr1, c, steps, batch)
        short = gap > e.optimum.target_gap / ONE_ROUND_MARGIN
        if not short or max_iterations is not None:
            return {
                "method": "local_sgd",
                "lr": lr1,
                "lr_decay": lr1 / c,
                "k": float(steps),
                "drift": False,
                "model_gap": gap,
                # The budget is too short for the round the model asks for: the whole budget, at its best decay.
                "fallback": f"the budget, {steps} steps, is shorter than the round the target needs in the model "
                "at x*: one round of all of it"
                if short
                else fallback,
            }
        fallback = f"no round up to {MAX_STEPS} steps reaches the target in the model at x*"
    if not drift:
        # Alike clients: STL's eta k = constant on eta_t = eta_1 / (1 + mu eta_1 t), the 1/(mu t) decay of
        # strongly convex SGD, instead of halving eta once a stage (LR-coupled STL).
        return {
            "method": "lr_coupled",
            "lr": lr,
            "lr_decay": e.mu * lr,
            "k": float(min(IID_K1_STAGES * T1, DEFAULT_K_MAX)),  # the plans' cap on a period
            "T1": T1,
            "drift": False,
            "fallback": fallback,
        }
    k = max(T1 // math.ceil(R_NONIID * math.sqrt(1 + 4 * share)), min(MIN_K1, T1 // 2), 1)
    k_max = None
    if network is not None:
        k_max = max(math.ceil(NETWORK_CAP * round_in_steps(e, network) - 1e-9), 1)
        k = min(k, k_max)
    return {
        "method": "stl_sc",
        "lr": lr,
        "T1": T1,
        "k": float(k),
        "k_max": k_max,
        "drift": True,
        "iid": True,
        # Clients that differ: a stage ends when the run is stationary (at most T_s), not after a fixed R rounds,
        # and, while the period is short against the budget, once its returns diminish.
        "stage_end": "stationary",
        # Not with a network: that rule buys rounds with steps, which a priced step makes a loss (it spent MNIST's
        # budget at k_max = 2q on two seeds of three, and a9a took 321 ms instead of 285).
        "diminishing_k": None
        if network is not None or max_iterations is None
        else max(max_iterations // DIMINISHING_BUDGET, 1),
        "rounds_per_stage": math.ceil(T1 / k),
        "fallback": fallback,
    }


def method_config(auto: MethodConfig, proposal: dict[str, Any]) -> MethodConfig:
    """The method ``auto`` (an STL-SGD^sc config with ``auto = true``) runs: the proposal's method and settings,
    with the fields auto does not set (batch, the outer step) as given."""
    kept = auto.model_dump(include={"batch", "outer_lr", "outer_momentum"})
    fields = {k: v for k, v in proposal.items() if k not in ("T1", "rounds_per_stage", "fallback", "model_gap")}
    if proposal["method"] == "stl_sc":
        fields["T1"] = proposal["T1"]
    return REGISTRY[proposal["method"]].model_validate({**kept, **fields})


def report(e: Estimates, proposal: dict[str, Any], network: Network | None = None) -> str:
    t2 = theorem2(e)
    if proposal["method"] == "stl_sc":
        rule = (
            f"STL-SGD^sc, lr = {proposal['lr']:.6g} (N/(2L)), T1 = {proposal['T1']} (1/(mu lr)), k = "
            f"{proposal['k']:g} (at most {proposal['rounds_per_stage']} rounds a stage), drift = true, a stage ends "
            "when the objective stops falling (at most T_s), k x2 while each stage's drop holds"
        )
        if proposal["diminishing_k"] is not None:
            rule += (
                f"; while k <= diminishing_k = {proposal['diminishing_k']} (the budget / {DIMINISHING_BUDGET}), a "
                "stage also ends once its fall over five rounds is under a quarter of its fall so far"
            )
        if proposal["k_max"] is not None:
            rule += (
                f", every period at most k_max = {proposal['k_max']} ({NETWORK_CAP} x the client-steps a round's "
                "communication costs on the network given)"
            )
    elif proposal["method"] == "local_sgd":
        o = e.optimum
        assert o is not None
        goal = o.target_gap / ONE_ROUND_MARGIN
        sized = (
            "the fewest steps for which the quadratic model at x* gives"
            if proposal["model_gap"] <= goal
            else "the run's budget, fewer steps than the quadratic model at x* needs for"
        )
        rule = (
            f"Local SGD, one round planned to reach the target: lr = {proposal['lr']:.6g} (1/(2L)), lr_decay = "
            f"{proposal['lr_decay']:.6g} (eta_t = lr / (1 + lr_decay t)), k = {proposal['k']:.0f}: {sized} a gap "
            f"of {goal:.3g} (the target / {ONE_ROUND_MARGIN:g}; this k and lr_decay: {proposal['model_gap']:.3g}), "
            "drift = false"
        )
    else:
        rule = (
            f"LR-coupled STL, lr = {proposal['lr']:.6g} (N/(2L)), lr_decay = {proposal['lr_decay']:.6g} (mu lr: "
            f"eta_t = lr / (1 + mu lr t)), k = {proposal['k']:.0f} ({IID_K1_STAGES} T1, at most {DEFAULT_K_MAX}; "
            f"T1 = 1/(mu lr) = {proposal['T1']}), k_t = k eta_1 / eta_t, drift = false"
        )
    if proposal["method"] != "stl_sc" and network is not None:
        rule += "; the network given changes nothing here (alike clients: a longer period adds no steps)"
    lines = [
        f"n = {e.n}, d = {e.d}, N = {e.num_clients} clients",
        f"L = {e.L:.6g} (power iteration on the Hessian at x_0), L_max = {e.L_max:.6g} (row norms), "
        f"mu = lambda = {e.mu:.6g}",
        f"sigma^2 = {e.sigma2:.6g} (single-sample gradients at x_0), zeta^2 = {e.zeta2:.6g} (clients' gradients "
        f"at x_0; zeta^2 / sigma^2 = {e.zeta2 / e.sigma2 if e.sigma2 else 0:.3g})",
        *(
            [
                f"at x*: sigma*^2 = {e.optimum.sigma2:.6g}, Hessian eigenvalues {min(e.optimum.curvatures):.3g} to "
                f"{max(e.optimum.curvatures):.3g}, target gap {e.optimum.target_gap:g}"
            ]
            if e.optimum is not None
            else []
        ),
        f"Theorem 2: eta_1 <= 1/(6L) = {t2['lr']:.4g}, T_1 = 6/(mu eta_1) = {t2['T1']:.4g}, k_1 = "
        f"{t2['k1_iid']:.3g} (IID) / {t2['k1_noniid']:.3g} (Non-IID): under 1, an average every step",
        f"proposal (algorithm.auto = true): {rule}",
    ]
    if network is not None:
        lines.append(
            f"network: {network.name}, a round {network.latency_s * 1e3:.4g} ms + {_round_bytes(e)} B at "
            f"{network.bandwidth_Bps * 8 / 1e9:.4g} Gbit/s, a client-step {(network.step_s or 0) * 1e9:.4g} ns: "
            f"a round costs q = {round_in_steps(e, network):.4g} client-steps"
        )
    if proposal["fallback"]:
        lines.append(f"fallback: {proposal['fallback']}")
    return "\n".join(lines)


def estimates_for(built: Any, target_gap: float | None = None) -> Estimates:
    """Estimates of a built experiment (with its run's target gap: the model at x*, from the cached optimum the
    run measures its gap against); a one-line error where the problem is not Eq. 8."""
    if not isinstance(built.problem, LogisticRegression):
        raise ConfigError(
            "problem.kind: suggest estimates the constants of Eq. 8 (logistic regression); for "
            "networks, docs/distributed.md has measured guidance"
        )
    return estimate(built.problem, built.partition, target_gap=target_gap, cache_dir=cache_dir())


def proposal_for(exp: Any, built: Any, network: Network | None = None) -> tuple[Estimates, dict[str, Any]]:
    """The estimates of a built experiment and what ``auto`` runs on it: its run's target, batch and budget
    passed on, the same for ``algorithm.auto`` and ``stlsgd suggest``."""
    e = estimates_for(built, exp.run.target_gap)
    return e, propose(e, network, exp.algorithm.batch, exp.run.max_iterations)


__all__ = [
    "AtOptimum",
    "Estimates",
    "asdict",
    "estimate",
    "estimates_for",
    "model_gap",
    "one_round",
    "propose",
    "proposal_for",
    "report",
    "round_in_steps",
    "theorem2",
]
