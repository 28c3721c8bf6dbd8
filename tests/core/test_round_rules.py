"""Drift correction (SCAFFOLD, option II) and the outer step (DiLoCo) against plain NumPy loops written from
their papers, and their checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from simulation import simulate

from stlsgd.algorithms import LocalSGD
from stlsgd.data import make_partition
from stlsgd.executors import simulator
from stlsgd.executors.averaging import OuterNesterov
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import RoundRule, StopRule
from stlsgd.experiments.config import Experiment
from stlsgd.experiments.runner import run_experiment
from stlsgd.problems.logistic import LogisticRegression


def _grad(X: np.ndarray, y: np.ndarray, lam: float, w: np.ndarray, r: int) -> np.ndarray:
    return -y[r] / (1 + np.exp(y[r] * X[r] @ w)) * X[r] + lam * w


def test_one_drift_round_by_hand() -> None:
    # Two clients, one feature, one sample each, lam = 0; c_1 = 1, c_2 = -1 (so c = 0), lr 0.5 then 0.25 in the
    # round (the lr changes mid-round). Client 1 samples x = 1, y = +1 twice from w = 0:
    #   g = -1/(1 + e^0) = -0.5;        w1 = 0 - 0.5 (-0.5 - 1 + 0) = 0.75
    #   g = -1/(1 + e^0.75) = -0.32082;  w2 = 0.75 - 0.25 (-0.32082 - 1) = 1.080205
    # and its control variate becomes c_1 - c + (x_start - y)/(0.5 + 0.25) = 1 - 0 + (0 - 1.080205)/0.75.
    import scipy.sparse as sp

    problem = LogisticRegression(sp.csr_matrix(np.array([[1.0], [1.0]])), np.array([1.0, 1.0]), lam=1e-300)
    state = problem.init_state(2)
    rows = np.array([[[0], [1]], [[0], [1]]])
    lrs = np.array([0.5, 0.25])
    drift = {"w": np.array([[0.0 - 1.0], [0.0 + 1.0]])}  # c - c_i
    problem.local_steps(state, rows, lrs, None, drift)
    g2 = -1.0 / (1.0 + np.exp(0.75))
    assert state["w"][0, 0] == pytest.approx(0.75 - 0.25 * (g2 - 1.0), rel=1e-14)
    assert state["w"][0, 0] == pytest.approx(1.0802045, rel=1e-6)
    g2b = -1.0 / (1.0 + np.exp(-0.25))  # client 2: 0 - 0.5 (-0.5 + 1) = -0.25, then its second step
    assert state["w"][1, 0] == pytest.approx(-0.25 - 0.25 * (g2b + 1.0), rel=1e-14)


def _scaffold_reference(
    ds,
    problem,
    partition,
    plan,
    rounds: int,
    seed: int,
    outer: OuterNesterov | None,
    window: int | dict[int, int] | None = None,
):
    """SCAFFOLD option II with full participation (and optionally DiLoCo's outer step), one client at a time;
    with ``window``, each c_i from the client's model after the round's first ``window`` steps (a dict: by the
    round's length)."""
    X, y, lam = ds.X.toarray(), ds.y, problem.lam
    n_clients, d = partition.num_clients, X.shape[1]
    sampler = Sampler(partition, seed)
    x = np.zeros(d)
    c_i = np.zeros((n_clients, d))
    c = np.zeros(d)
    m = np.zeros(d)
    for rnd in plan.rounds():
        if rnd.index == rounds:
            break
        rows = sampler.draw(rnd.steps, rnd.batch)
        lrs = rnd.learning_rates()
        ys = np.tile(x, (n_clients, 1))
        m_steps = (
            len(lrs) if window is None else window[len(lrs)] if isinstance(window, dict) else min(window, len(lrs))
        )
        for t, lr in enumerate(lrs):
            for i in range(n_clients):
                ys[i] -= lr * (_grad(X, y, lam, ys[i], rows[t, i, 0]) - c_i[i] + c)
            if t + 1 == m_steps:
                at_window = ys.copy()
        c_i = c_i - c + (x - at_window) / lrs[:m_steps].sum()
        c = c_i.mean(axis=0)
        avg = ys.mean(axis=0)
        if outer is None:
            x = avg
        else:
            delta = x - avg
            m = outer.momentum * m + delta
            x = x - outer.lr * (delta + outer.momentum * m)
    return x


def _simulate(plan, problem, partition, rounds: int, seed: int, rule: RoundRule):
    """The simulator's run of ``plan`` for ``rounds`` rounds from x_0 = 0 on the partition's clients."""
    return simulate(problem, partition, plan, StopRule(max_rounds=rounds), seed, rule=rule)[0]


@pytest.mark.parametrize(
    ("outer", "window", "chunk_samples"),
    [
        (None, None, None),
        (OuterNesterov(lr=0.7, momentum=0.9), None, None),
        (None, 3, None),  # c_i from the first 3 of every round's 5 steps
        (None, 3, 8),  # and with the round drawn in slices of 2 steps (8 samples / 4 clients): 2 + 1 | 2
    ],
    ids=["drift", "drift+outer", "drift window", "drift window, sliced round"],
)
def test_the_round_loop_is_scaffold_and_diloco(
    digits, monkeypatch, outer: OuterNesterov | None, window: int | None, chunk_samples: int | None
) -> None:
    if chunk_samples is not None:
        monkeypatch.setattr(simulator, "SAMPLES_PER_CHUNK", chunk_samples)
    ds, problem = digits
    partition = make_partition(ds.y, 4, "noniid", seed=0, s=0)
    plan = LocalSGD(lr=0.5, k=5, lr_decay=0.05)  # the lr changes within every round
    state = _simulate(plan, problem, partition, 6, 7, RoundRule(drift=True, drift_window=window, outer=outer))
    want = _scaffold_reference(ds, problem, partition, plan, 6, 7, outer, window)
    np.testing.assert_allclose(state.clients["w"][0], want, rtol=1e-10, atol=1e-13)
    assert np.abs(state.control["w"]).max() > 1e-3  # the control variates are doing something
    assert state.bytes == 6 * 2 * 4 * 64 * 8 * 2  # a round sends the model and the control variate


def test_the_first_drift_round_is_plain_local_sgd(digits) -> None:
    ds, problem = digits
    partition = make_partition(ds.y, 4, "split", seed=0)
    plan = LocalSGD(lr=0.5, k=5)
    out = [
        _simulate(plan, problem, partition, 1, 1, rule).clients["w"] for rule in (RoundRule(), RoundRule(drift=True))
    ]
    assert np.array_equal(out[0], out[1])  # c = c_i = 0 at the start


def test_stl_with_drift_grows_k_by_two_and_resumes_across_a_period_change_bit_for_bit(tmp_path: Path) -> None:
    exp = Experiment.model_validate(
        {
            "data": {"dataset": "digits49", "num_clients": 6, "partition": "noniid", "s": 20},
            "algorithm": {
                "method": "stl_sc",
                "lr": 0.5,
                "k": 3,
                "T1": 24,
                "drift": True,
                "outer_lr": 0.8,
                "outer_momentum": 0.5,
            },
            "run": {"target_gap": "none", "max_rounds": 40, "eval_every": 2},
        }
    )
    whole = run_experiment(exp, tmp_path / "whole", progress=False, checkpoint_every=5)
    assert whole["plan"]["iid"] is True  # the Non-IID partition would give x sqrt 2 without drift correction
    assert whole["bytes_per_client"] == 40 * 64 * 8 * 2

    def interrupt(state, rnd) -> None:
        if state.round == 12:  # stage 2 (period 6) began at round 8; the checkpoint of round 10 is in it
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(exp, tmp_path / "cut", progress=False, checkpoint_every=5, on_round=interrupt)
    run_experiment(exp, tmp_path / "cut", progress=False, resume=True)
    with np.load(tmp_path / "whole" / "final_params.npz") as a, np.load(tmp_path / "cut" / "final_params.npz") as b:
        assert np.array_equal(a["w"], b["w"])
    assert (tmp_path / "whole" / "metrics.jsonl").read_text().count("\n") == 20


def test_a_drift_window_changes_the_control_variates_only() -> None:
    """From a window as long as the round, the control variates are option II's; a shorter one changes them, and
    the models only through them (the round's samples and steps are the same)."""
    from stlsgd.data import load_dataset

    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    partition = make_partition(ds.y, 4, "noniid", seed=0, s=0)
    plan = LocalSGD(lr=0.5, k=6)

    def one(rule: RoundRule, rounds: int):
        return _simulate(plan, problem, partition, rounds, 3, rule)

    whole, same = one(RoundRule(drift=True), 3), one(RoundRule(drift=True, drift_window=6), 3)
    assert np.array_equal(whole.clients["w"], same.clients["w"]) and np.array_equal(
        whole.control["w"], same.control["w"]
    )
    first = [one(RoundRule(drift=True, drift_window=w), 1) for w in (None, 2)]
    # Round 1 has no correction yet; its steps are drawn in two calls of the kernel, whose L2 shrink (a running
    # scale) is then applied in another order: the same models to the last bits.
    np.testing.assert_allclose(first[0].clients["w"], first[1].clients["w"], rtol=1e-12, atol=1e-15)
    assert np.abs(first[0].control["w"] - first[1].control["w"]).max() > 1e-3
    assert RoundRule(drift=True, drift_window=2).control_steps(6) == 2 and RoundRule(drift=True).control_steps(6) == 6


def test_a_drift_share_takes_the_control_variates_from_that_share_of_each_round(digits) -> None:
    """Rounds of 2, 4 and 8 steps (Algorithm 2's stages): with a share of a half, c_i from their first 1, 2 and 4
    steps, as the one-client-at-a-time reference computes it."""
    from stlsgd.algorithms import STLSGD

    ds, problem = digits
    partition = make_partition(ds.y, 4, "noniid", seed=0, s=0)
    plan = STLSGD(lr=0.5, T1=8, k1=2.0)  # stages of 4 rounds: 2, 4, then 8 steps
    rule = RoundRule(drift=True, drift_share=0.5)
    state = _simulate(plan, problem, partition, 12, 7, rule)
    want = _scaffold_reference(ds, problem, partition, plan, 12, 7, None, {2: 1, 4: 2, 8: 4})
    np.testing.assert_allclose(state.clients["w"][0], want, rtol=1e-10, atol=1e-13)
    option_ii = _scaffold_reference(ds, problem, partition, plan, 12, 7, None)
    assert np.abs(want - option_ii).max() > 1e-3  # the share is not option II
    # floor(share x steps), at least one step; a window is steps, and the whole round without either
    assert [rule.control_steps(k) for k in (1, 2, 3, 7, 8)] == [1, 1, 1, 3, 4]
    assert RoundRule(drift=True, drift_share=0.25).control_steps(23040) == 5760
    assert RoundRule(drift=True, drift_share=0.29).control_steps(100) == 29  # not floating point's 28.999...
    assert RoundRule(drift=True, drift_share=1.0).control_steps(5) == 5


def test_a_drift_share_needs_drift_a_share_in_0_1_and_no_window() -> None:
    from stlsgd.errors import StlsgdError

    for kwargs in ({"drift_share": 0.5}, {"drift": True, "drift_share": 0.0}, {"drift": True, "drift_share": 1.5}):
        with pytest.raises(StlsgdError, match=r"drift_share: needs drift=True, a share in \(0, 1\]"):
            RoundRule(**kwargs)
    with pytest.raises(StlsgdError, match="no drift_window beside it"):
        RoundRule(drift=True, drift_window=4, drift_share=0.5)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ("drift_window = 4", "algorithm.drift_window: .*set drift = true beside it"),
        ("drift = true\ndrift_window = 0", "algorithm.drift_window: .*greater than or equal to 1"),
        ("drift_share = 0.25", "algorithm.drift_share: .*set drift = true beside it"),
        ("drift = true\ndrift_share = 2", "algorithm.drift_share: .*less than or equal to 1"),
        ("drift = true\ndrift_window = 4\ndrift_share = 0.25", "algorithm.drift_share: give drift_window .* not both"),
    ],
)
def test_a_drift_window_without_drift_is_refused_in_one_line(tmp_path: Path, fields: str, message: str) -> None:
    from stlsgd.errors import ConfigError
    from stlsgd.experiments.config import load_config

    path = tmp_path / "c.toml"
    path.write_text(f'[data]\ndataset = "digits49"\n[algorithm]\nmethod = "local_sgd"\nlr = 0.5\nk = 4\n{fields}\n')
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert "\n" not in str(err.value)
