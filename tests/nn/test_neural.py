"""Vectorised NN clients (problems/neural.py) against a per-client loop of standard nn.Module + SGD."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stlsgd.executors.averaging import copy_state, mean_over_clients
from stlsgd.problems.nets import SmallCNN
from stlsgd.problems.neural import NeuralNetProblem, reproducible

N_SAMPLES, CLIENTS, BATCH = 64, 3, 8


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((N_SAMPLES, 1, 12, 12), dtype=np.float32), rng.integers(0, 10, N_SAMPLES)


def _problem(data, **kw) -> NeuralNetProblem:
    return NeuralNetProblem(SmallCNN(1, 10, 12, width=4), *data, device="cpu", eval_batch=20, **kw)


def _rows(steps: int = 2, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, N_SAMPLES, (steps, CLIENTS, BATCH))


def _reference(problem: NeuralNetProblem, state, data, rows, lrs, momentum=0.0, weight_decay=0.0):
    """Each client as its own nn.Module in train mode with torch.optim.SGD: the semantics to match."""
    X, y = (torch.from_numpy(a) for a in data)
    out = []
    for c in range(rows.shape[1]):
        model = SmallCNN(1, 10, 12, width=4).train()
        model.load_state_dict({k: state[k][c].clone() for k in problem.param_names + problem.buffer_names})
        opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=momentum, weight_decay=weight_decay)
        for t, lr in enumerate(lrs):
            opt.param_groups[0]["lr"] = float(lr)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(X[rows[t, c]]), y[rows[t, c]]).backward()
            opt.step()
        out.append(model.state_dict())
    return out


def _assert_matches(state, reference) -> None:
    for c, ref in enumerate(reference):
        for name, value in ref.items():
            torch.testing.assert_close(state[name][c], value, rtol=1e-5, atol=1e-6, msg=f"client {c}, {name}")


def test_vmap_steps_equal_per_client_loop_params_and_bn_stats(data) -> None:
    problem = _problem(data)
    state = problem.init_state(CLIENTS, seed=3)
    # Clients must differ before the steps, or a bug mixing clients could go unseen.
    for name in problem.param_names:
        state[name] += 0.05 * torch.randn_like(state[name])
    start = copy_state(state)
    rows, lrs = _rows(), np.array([0.1, 0.05])
    problem.local_steps(state, rows, lrs, None)
    _assert_matches(state, _reference(problem, start, data, rows, lrs))
    assert state["features.1.running_mean"].abs().sum() > 0
    assert torch.equal(state["features.1.num_batches_tracked"], torch.full((CLIENTS,), 2))


def test_momentum_and_weight_decay_follow_torch_sgd(data) -> None:
    problem = _problem(data, momentum=0.9, weight_decay=1e-3)
    state = problem.init_state(CLIENTS, seed=0)
    start = copy_state(state)
    rows, lrs = _rows(3), np.array([0.1, 0.1, 0.05])
    problem.local_steps(state, rows, lrs, None)
    _assert_matches(state, _reference(problem, start, data, rows, lrs, momentum=0.9, weight_decay=1e-3))


def test_prox_term_adds_x_minus_anchor_over_gamma(data) -> None:
    """One step on f + 1/(2 gamma)||x - x_s||^2 = the plain step - lr (x - x_s)/gamma, x_s the anchor."""
    problem = _problem(data)
    base = problem.init_state(CLIENTS, seed=0)
    anchor = {k: v[:1] + 0.3 for k, v in base.items()}
    plain, prox = copy_state(base), copy_state(base)
    rows, lr, gamma_inv = _rows(1), 0.1, 0.5
    problem.local_steps(plain, rows, np.array([lr]), None)
    problem.local_steps(prox, rows, np.array([lr]), (gamma_inv, anchor))
    for name in problem.param_names:
        expected = plain[name] - lr * gamma_inv * (base[name] - anchor[name])
        torch.testing.assert_close(prox[name], expected, rtol=1e-5, atol=1e-6)
    for name in problem.buffer_names:  # BN statistics are not parameters: the prox term leaves them alone
        assert torch.equal(prox[name], plain[name])


def test_averaging_covers_bn_buffers_and_keeps_integer_ones(data) -> None:
    problem = _problem(data)
    state = problem.init_state(CLIENTS, seed=0)
    problem.local_steps(state, _rows(), np.array([0.1, 0.1]), None)
    before = copy_state(state)
    mean_over_clients(state)
    for name in ("features.1.running_mean", "features.1.running_var", "features.0.weight"):
        assert not torch.allclose(before[name][0], before[name][1])
        torch.testing.assert_close(state[name], before[name].mean(0, keepdim=True).expand_as(state[name]))
    assert torch.equal(
        state["features.1.num_batches_tracked"], before["features.1.num_batches_tracked"][:1].expand(CLIENTS)
    )


def test_any_subset_of_clients_steps_as_in_the_full_state(data) -> None:
    """The executor contract: a rank holding clients 1..2 gets exactly what the full simulator computes."""
    problem = _problem(data)
    full = problem.init_state(CLIENTS, seed=0)
    for name in problem.param_names:
        full[name] += 0.05 * torch.randn_like(full[name])
    part = {k: v[1:].clone() for k, v in full.items()}
    rows, lrs = _rows(), np.array([0.1, 0.05])
    problem.local_steps(full, rows, lrs, None)
    problem.local_steps(part, rows[:, 1:], lrs, None)
    for name in part:
        torch.testing.assert_close(part[name], full[name][1:], rtol=1e-5, atol=1e-6)


def test_same_seed_same_params_and_evaluation_matches_module(data) -> None:
    runs = []
    for _ in range(2):
        problem = _problem(data)
        state = problem.init_state(CLIENTS, seed=7)
        assert all(torch.equal(v[0], v[c]) for v in state.values() for c in range(CLIENTS))  # all clients start equal
        problem.local_steps(state, _rows(), np.array([0.1, 0.1]), None)
        mean_over_clients(state)
        runs.append((state, problem.evaluate(state)))
    (a, ev_a), (b, ev_b) = runs
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert ev_a == ev_b
    other = _problem(data).init_state(CLIENTS, seed=8)
    assert not torch.equal(other["features.0.weight"], a["features.0.weight"])
    # The evaluation is client 0's model in eval mode (running statistics) on the whole training set.
    model = SmallCNN(1, 10, 12, width=4).eval()
    model.load_state_dict({k: v[0] for k, v in a.items()})
    X, y = (torch.from_numpy(v) for v in data)
    with torch.no_grad():
        logits = model(X)
    assert ev_a.accuracy == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    assert ev_a.objective == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-5)
    assert _problem(data).optimum() is None


def test_cuda_steps_use_deterministic_cudnn_and_give_the_callers_settings_back() -> None:
    # cuDNN's flags are plain process settings, so the CUDA branch is checked here without a GPU; that it makes
    # two identical ResNet18 runs bit-identical on an H200 (they were not without it) is in table3.md.
    cudnn = torch.backends.cudnn
    before = cudnn.deterministic, cudnn.benchmark
    try:
        cudnn.deterministic, cudnn.benchmark = False, True
        with reproducible(torch.device("cuda")):
            assert (cudnn.deterministic, cudnn.benchmark) == (True, False)
        assert (cudnn.deterministic, cudnn.benchmark) == (False, True)
        with pytest.raises(RuntimeError), reproducible(torch.device("cuda")):
            raise RuntimeError("a step that fails")
        assert (cudnn.deterministic, cudnn.benchmark) == (False, True)
        with reproducible(torch.device("cpu")):  # nothing to choose on the CPU: the settings are left alone
            assert (cudnn.deterministic, cudnn.benchmark) == (False, True)
    finally:
        cudnn.deterministic, cudnn.benchmark = before
