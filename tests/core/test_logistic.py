"""Eq. 8's SGD step checked against numbers worked out by hand, and the exact optimum f*."""

import numpy as np
import pytest
import scipy.sparse as sp

from stlsgd.data import load_dataset, make_partition
from stlsgd.problems import logistic
from stlsgd.problems.logistic import LogisticRegression

X = sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 1.0]]))
Y = np.array([1.0, -1.0])


def two_clients():
    problem = LogisticRegression(X, Y, lam=0.1)
    state = problem.init_state(2)
    state["w"][:] = [0.5, -0.5]
    return problem, state


def test_one_sgd_step_by_hand():
    # Client 0 takes row 0 (x=[1,2], y=+1): m = -0.5, coefficient -sigma(0.5) = -0.62246;
    # w - 0.1 (coef x + 0.1 w). Client 1 takes row 1 (x=[0,1], y=-1): coefficient sigma(-0.5).
    problem, state = two_clients()
    problem.local_steps(state, np.array([[[0], [1]]]), np.array([0.1]), None)
    np.testing.assert_allclose(state["w"][0], [0.5572459331201854, -0.3705081337596291], rtol=1e-14)
    np.testing.assert_allclose(state["w"][1], [0.495, -0.5327540668798145], rtol=1e-14)


def test_minibatch_step_by_hand():
    problem, state = two_clients()
    problem.local_steps(state, np.array([[[0, 1], [0, 1]]]), np.array([0.1]), None)
    np.testing.assert_allclose(state["w"][0], [0.5261229665600927, -0.4516311003197218], rtol=1e-14)


def test_proximal_step_by_hand():
    # STL-SGD^nc adds (w - x_s)/gamma: here 1/gamma = 2, anchor x_s = [0.1, 0.2].
    problem, state = two_clients()
    anchor = {"w": np.array([[0.1, 0.2]])}
    problem.local_steps(state, np.array([[[0], [0]]]), np.array([0.1]), (2.0, anchor))
    np.testing.assert_allclose(state["w"][0], [0.47724593312018543, -0.23050813375962909], rtol=1e-14)


def test_synchronous_step_by_hand():
    # k = 1: both clients' steps above, averaged -- the same as one step on the union of their mini-batches.
    problem, state = two_clients()
    problem.sync_steps(state, np.array([[[0], [1]]]), np.array([0.1]), None)
    for w in state["w"]:
        np.testing.assert_allclose(w, [0.5261229665600927, -0.4516311003197218], rtol=1e-14)


@pytest.mark.parametrize("batch", [1, 3, 40])  # few rows: patched into the common model; many: whole models
@pytest.mark.parametrize("prox", [False, True])
def test_synchronous_steps_equal_local_steps_averaged_every_step_bit_for_bit(batch, prox):
    ds = load_dataset("digits49")
    problem = LogisticRegression(ds.X, ds.y)
    rng = np.random.default_rng(0)
    rows = rng.integers(0, problem.num_samples, (30, 4, batch))
    lrs = 0.5 / (1.0 + 0.01 * np.arange(30))
    anchor = (3.0, {"w": rng.normal(size=(1, problem.dim))}) if prox else None
    fused, stepped = problem.init_state(4), problem.init_state(4)
    problem.sync_steps(fused, rows, lrs, anchor)
    for t in range(30):
        problem.local_steps(stepped, rows[t : t + 1], lrs[t : t + 1], anchor)
        stepped["w"][:] = stepped["w"].mean(axis=0)
    assert np.array_equal(fused["w"], stepped["w"])
    assert not np.allclose(stepped["w"], 0.0)


@pytest.mark.parametrize("values", ["float", "few", "ones"])
def test_many_steps_match_a_plain_loop(values):
    # The kernels read X as float64 values, as uint8 codes into a table of <= 256 distinct values, or with
    # no values at all when every one is 1: all three must give the loop's numbers.
    rng = np.random.default_rng(0)
    mask = rng.random((400, 7)) < 0.4
    dense = {"float": rng.random((400, 7)), "few": rng.integers(1, 5, (400, 7)) / 4, "ones": np.ones((400, 7))}[values]
    dense = dense * mask
    y = np.where(rng.random(400) < 0.5, 1.0, -1.0)
    problem = LogisticRegression(sp.csr_matrix(dense), y)
    data, table = problem._rows[2:]
    assert (None if data is None else data.dtype, table is None) == {
        "float": (np.float64, True),
        "few": (np.uint8, False),
        "ones": (None, True),
    }[values]
    state = problem.init_state(6)  # four clients' margins are summed together, then the other two
    rows = rng.integers(0, 400, size=(40, 6, 2))
    lrs = 1.0 / (1 + 0.01 * np.arange(40))
    problem.local_steps(state, rows, lrs, None)
    w = np.zeros((6, 7))
    for t in range(40):
        for c in range(6):
            batch = dense[rows[t, c]]
            m = y[rows[t, c]] * (batch @ w[c])
            grad = batch.T @ (-y[rows[t, c]] / (1 + np.exp(m))) / 2 + problem.lam * w[c]
            w[c] -= lrs[t] * grad
    np.testing.assert_allclose(state["w"], w, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("values", ["float", "few", "ones"])
def test_margins_four_at_a_time_are_each_rows_own_sum_bit_for_bit(values):
    # Rows of every length, empty ones included, so that the four sums run past each other's ends.
    rng = np.random.default_rng(3)
    dense = {"float": rng.random((60, 30)), "few": rng.integers(1, 5, (60, 30)) / 4, "ones": np.ones((60, 30))}[values]
    dense = dense * (rng.random((60, 30)) < np.linspace(0.0, 1.0, 60)[:, None])
    problem = LogisticRegression(sp.csr_matrix(dense), np.ones(60))
    W, rows = rng.normal(size=(23, 30)), rng.integers(0, 60, size=23)
    out = np.empty(23)
    logistic._margins(W, *problem._rows, rows, out)
    expected = [logistic._dot(W[i], *problem._rows, rows[i]) for i in range(23)]
    assert out.tolist() == expected
    np.testing.assert_allclose(out, (dense[rows] * W).sum(axis=1), rtol=1e-13)


def test_newton_optimum_is_stationary_and_cached(tmp_path, shared_data):
    ds = load_dataset("a9a", shared_data)
    problem = LogisticRegression(ds.X, ds.y)
    assert problem.lam == pytest.approx(1 / 32561)
    w, fstar = problem.newton()
    assert np.linalg.norm(problem.gradient(w)) < 1e-12
    assert fstar == pytest.approx(problem.loss(w))
    assert problem.optimum(cache_dir=tmp_path) == fstar
    cached = list((tmp_path / "optima").glob("*.npz"))
    assert len(cached) == 1
    fresh = LogisticRegression(ds.X, ds.y)
    assert fresh.optimum(cache_dir=tmp_path) == fstar  # read back from the cache, bit for bit
    assert np.array_equal(fresh.minimizer(cache_dir=tmp_path), w)  # x* with it
    assert np.array_equal(LogisticRegression(ds.X, ds.y).minimizer(), w)  # without a cache: Newton's
    # No point on a random line through x* is lower.
    d = np.random.default_rng(1).standard_normal(w.shape)
    assert all(problem.loss(w + t * d) > fstar for t in (1e-3, -1e-3))


def test_dense_rows_stored_sparse_get_the_same_hessian_by_a_dense_product(monkeypatch):
    # digits 4/9 with 0.01 added to every pixel (every entry non-zero) and the dense path's threshold lowered: the
    # Hessian and Newton's x* agree with the sparse product's to rounding; a matrix under a quarter non-zero keeps
    # the sparse product, bit for bit.
    ds = load_dataset("digits49")
    dense_rows = sp.csr_matrix(ds.X.toarray() + 0.01)  # every entry non-zero
    problem = LogisticRegression(dense_rows, ds.y)
    w = np.random.default_rng(0).standard_normal(64) * 0.1
    sparse_h, (sparse_w, sparse_f) = problem.hessian(w), problem.newton()
    monkeypatch.setattr(logistic, "DENSE_HESSIAN_NNZ", 1)
    assert problem.hessian(w) == pytest.approx(sparse_h, rel=1e-12, abs=1e-15)
    w_star, f_star = problem.newton()
    assert w_star == pytest.approx(sparse_w, rel=1e-9, abs=1e-12) and f_star == pytest.approx(sparse_f, rel=1e-14)
    sparser = LogisticRegression(sp.csr_matrix(np.where(ds.X.toarray() > 0.9, ds.X.toarray(), 0.0)), ds.y)
    assert 4 * sparser.X.nnz < sparser.X.shape[0] * sparser.X.shape[1]
    monkeypatch.setattr(logistic, "DENSE_HESSIAN_NNZ", 1 << 24)
    before = sparser.hessian(w)
    monkeypatch.setattr(logistic, "DENSE_HESSIAN_NNZ", 1)
    assert np.array_equal(sparser.hessian(w), before)


def test_evaluate_reports_objective_and_accuracy():
    problem = LogisticRegression(X, Y, lam=0.1)
    state = {"w": np.array([[1.0, -1.0]])}
    ev = problem.evaluate(state)
    expected = np.mean(np.log1p(np.exp(-Y * (X @ [1.0, -1.0])))) + 0.05 * 2
    assert ev.objective == pytest.approx(expected, rel=1e-14)
    assert ev.accuracy == 0.5  # margins y * x^T w = [-1, +1]: one of two rows right


def test_row_weights_weigh_the_objective_its_gradient_hessian_and_optimum(shared_data):
    # Two rows weighing 1.5 and 0.5: f(w) = (1.5 l_0 + 0.5 l_1) / 2 + lam |w|^2 / 2, by hand at w = [1, -1]
    # (margins y x^T w = -1 and +1); the gradient and Hessian are f's (central differences).
    problem = LogisticRegression(X, Y, lam=0.1, weights=np.array([1.5, 0.5]))
    w = np.array([1.0, -1.0])
    assert problem.loss(w) == pytest.approx((1.5 * np.log1p(np.e) + 0.5 * np.log1p(np.exp(-1))) / 2 + 0.1, rel=1e-14)
    assert problem.evaluate({"w": w[None]}).objective == problem.loss(w)
    eye = np.eye(2) * 1e-6
    fd = [(problem.loss(w + e) - problem.loss(w - e)) / 2e-6 for e in eye]
    np.testing.assert_allclose(problem.gradient(w), fd, rtol=1e-8)
    fd2 = np.array([(problem.gradient(w + e) - problem.gradient(w - e)) / 2e-6 for e in eye])
    np.testing.assert_allclose(problem.hessian(w), fd2, rtol=1e-7)
    assert problem.fingerprint() != LogisticRegression(X, Y, lam=0.1).fingerprint()  # another optimum's cache
    # a9a dealt to 8 clients in Dirichlet(0.5) shares: the weighted x* is where the mean of the clients' own
    # gradients vanishes (each client's objective its rows' mean), not where the samples' mean does.
    ds = load_dataset("a9a", shared_data)
    part = make_partition(ds.y, 8, "dirichlet", seed=0, alpha=0.5)
    weighted = LogisticRegression(ds.X, ds.y, weights=part.row_weights(ds.n))
    x_star = weighted.minimizer()
    clients = [
        LogisticRegression(ds.X[part.client_rows(c)], ds.y[part.client_rows(c)], lam=weighted.lam) for c in range(8)
    ]
    assert np.linalg.norm(np.mean([c.gradient(x_star) for c in clients], axis=0)) < 1e-9  # rounding of 8 sums
    plain = LogisticRegression(ds.X, ds.y)
    assert np.linalg.norm(plain.gradient(x_star)) > 1e-3  # the samples' mean is not stationary there


def test_results_do_not_depend_on_the_thread_count():
    import numba

    rng = np.random.default_rng(2)
    problem = LogisticRegression(sp.csr_matrix(rng.random((40, 5))), np.where(rng.random(40) < 0.5, 1.0, -1.0))
    rows, lrs = rng.integers(0, 40, size=(2400, 7, 1)), np.full(2400, 0.05)  # enough samples to use threads
    assert rows.size >= logistic._PARALLEL_SAMPLES
    results = []
    for threads in (1, numba.config.NUMBA_NUM_THREADS):
        numba.set_num_threads(threads)
        state = problem.init_state(7)
        problem.local_steps(state, rows, lrs, None)
        results.append(state["w"])
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert np.array_equal(results[0], results[1])
