"""L2-regularised logistic regression, the paper's convex problem (Eq. 8).

    f(theta) = 1/n sum_i log(1 + exp(-y_i x_i^T theta)) + lambda/2 ||theta||^2,   lambda = 1/n by default.

Local steps run in a compiled (numba) kernel over the stacked (clients x d) parameter matrix: a step of all
clients costs a few hundred nanoseconds, which a per-step dispatch of tensor operations cannot approach.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numba
import numpy as np
import scipy.sparse as sp

from stlsgd.files import atomic_write
from stlsgd.problems.base import Evaluation, State


@numba.njit(cache=True, nogil=True)
def _sigmoid(z: float) -> float:
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@numba.njit(cache=True, nogil=True, inline="always")
def _value(data, table, p):  # pragma: no cover
    """The p-th stored value of X: ``data[p]``, ``table[data[p]]`` when ``data`` holds codes, or 1 when
    ``data`` is None (binary features, as in a9a; the compiler then drops the multiplications by 1)."""
    if data is None:
        return 1.0
    if table is None:
        return data[p]
    return table[data[p]]


@numba.njit(cache=True, nogil=True, inline="always")
def _term(w, indices, data, table, p):  # pragma: no cover
    """The p-th stored value of X times its coordinate of w."""
    return _value(data, table, p) * w[indices[p]]


@numba.njit(cache=True, nogil=True, inline="always")
def _dot(w, indptr, indices, data, table, r):  # pragma: no cover
    """x_r^T w, its terms summed in the row's stored order."""
    m = 0.0
    for p in range(indptr[r], indptr[r + 1]):
        m += _term(w, indices, data, table, p)
    return m


@numba.njit(cache=True, nogil=True, inline="always")
def _add(w, indptr, indices, data, table, r, a):  # pragma: no cover
    """w += a x_r."""
    for p in range(indptr[r], indptr[r + 1]):
        w[indices[p]] += a * _value(data, table, p)


@numba.njit(cache=True, nogil=True)
def _margins(W, indptr, indices, data, table, rows, out):  # pragma: no cover
    """out[i] = x_{rows[i]}^T W[i] for every i, each exactly as :func:`_dot` sums it.

    Four rows at a time: one sum is a chain of additions, each waiting on the last, and four independent
    chains let the CPU overlap them and their rows' cache misses. Each keeps its row's order of terms.
    """
    i = 0
    while i + 4 <= rows.shape[0]:
        w0, w1, w2, w3 = W[i], W[i + 1], W[i + 2], W[i + 3]
        r0, r1, r2, r3 = rows[i], rows[i + 1], rows[i + 2], rows[i + 3]
        p0, p1, p2, p3 = indptr[r0], indptr[r1], indptr[r2], indptr[r3]
        e0, e1, e2, e3 = indptr[r0 + 1], indptr[r1 + 1], indptr[r2 + 1], indptr[r3 + 1]
        shared = min(min(e0 - p0, e1 - p1), min(e2 - p2, e3 - p3))
        m0 = m1 = m2 = m3 = 0.0
        for j in range(shared):
            m0 += _term(w0, indices, data, table, p0 + j)
            m1 += _term(w1, indices, data, table, p1 + j)
            m2 += _term(w2, indices, data, table, p2 + j)
            m3 += _term(w3, indices, data, table, p3 + j)
        for p in range(p0 + shared, e0):
            m0 += _term(w0, indices, data, table, p)
        for p in range(p1 + shared, e1):
            m1 += _term(w1, indices, data, table, p)
        for p in range(p2 + shared, e2):
            m2 += _term(w2, indices, data, table, p)
        for p in range(p3 + shared, e3):
            m3 += _term(w3, indices, data, table, p)
        out[i], out[i + 1], out[i + 2], out[i + 3] = m0, m1, m2, m3
        i += 4
    for j in range(i, rows.shape[0]):
        out[j] = _dot(W[j], indptr, indices, data, table, rows[j])


@numba.njit(cache=True, nogil=True, parallel=True)
def _local_steps(
    W, indptr, indices, data, table, y, lam, rows, lrs, gamma_inv, anchor, delta, n_blocks
):  # pragma: no cover
    """W[c] -= lr_t * (mini-batch loss gradient + lam W[c] + gamma_inv (W[c] - anchor) + delta[c]), every step t,
    client c (``delta`` None: no drift correction).

    Clients are independent between averages, so blocks of them run on numba's threads; each client's
    arithmetic is the same whatever the thread count, so results do not depend on it.
    """
    n_clients = W.shape[0]
    for block in numba.prange(n_blocks):
        first, last = block * n_clients // n_blocks, (block + 1) * n_clients // n_blocks
        _client_block(W, indptr, indices, data, table, y, lam, rows, lrs, gamma_inv, anchor, first, last, delta)


@numba.njit(cache=True, nogil=True)
def _client_block(
    W, indptr, indices, data, table, y, lam, rows, lrs, gamma_inv, anchor, first, last, delta=None
):  # pragma: no cover
    """Clients first..last-1 of :func:`_local_steps`.

    Without the proximal term the L2 shrink is kept as a per-client scale, and a drift correction delta[c]
    (constant during a round) as a per-client multiple of it: W[c] = scale * V[c] + beta * delta[c]. A step
    then touches only the sampled rows' non-zeros instead of all d coordinates: w' = (1 - lr lam) w - lr g -
    lr delta gives scale' = (1 - lr lam) scale and beta' = (1 - lr lam) beta - lr. Without delta (compiled
    apart, the branches below removed) the arithmetic is exactly that of plain local SGD.
    """
    d = W.shape[1]
    n_steps, _, batch = rows.shape
    coef = np.empty(batch)
    scale = np.ones(last - first)
    beta = np.zeros(last - first)
    margins = np.empty((batch, last - first))
    # Steps outer, clients inner: the clients' independent updates let the CPU overlap their cache misses.
    for t in range(n_steps):
        lr = lrs[t]
        shrink = 1.0 - lr * lam
        # Every gradient coefficient is taken at the old w, before any coordinate moves.
        for j in range(batch):
            _margins(W[first:last], indptr, indices, data, table, rows[t, first:last, j], margins[j])
        for c in range(first, last):
            w = W[c]
            sc = scale[c - first]
            for j in range(batch):
                yr = y[rows[t, c, j]]
                m = margins[j, c - first] * sc
                if delta is not None:
                    m += beta[c - first] * _dot(delta[c], indptr, indices, data, table, rows[t, c, j])
                coef[j] = -yr * _sigmoid(-yr * m) / batch
            if gamma_inv > 0.0:
                for q in range(d):
                    if delta is not None:
                        w[q] -= lr * (lam * w[q] + gamma_inv * (w[q] - anchor[q]) + delta[c, q])
                    else:
                        w[q] -= lr * (lam * w[q] + gamma_inv * (w[q] - anchor[q]))
            else:
                sc *= shrink
                if delta is not None:
                    beta[c - first] = shrink * beta[c - first] - lr
                if sc < 1e-100:
                    for q in range(d):
                        w[q] *= sc
                    sc = 1.0
                scale[c - first] = sc
            for j in range(batch):
                _add(w, indptr, indices, data, table, rows[t, c, j], -(lr * coef[j] / sc))
    for c in range(first, last):
        if delta is not None and beta[c - first] != 0.0:
            b = beta[c - first]
            s = scale[c - first]
            for q in range(d):
                W[c, q] = s * W[c, q] + b * delta[c, q]
            continue
        if scale[c - first] != 1.0:
            for q in range(d):
                W[c, q] *= scale[c - first]


@numba.njit(cache=True, nogil=True)
def _sync_steps(
    w, indptr, indices, data, table, y, lam, rows, lrs, gamma_inv, anchor, tmp, val, acc, common
):  # pragma: no cover
    """``len(lrs)`` rounds of one step each -- every client steps from the common model w, then w becomes
    the mean of the clients (SyncSGD, LB-SGD, CR-PSGD) -- with the same numbers, bit for bit, as
    :func:`_client_block` for one step followed by the canonical mean (clients added in order, then divided
    by N; :mod:`stlsgd.executors.averaging`).

    Without the round trips through Python, and without an N x d matrix: a client's model differs from the
    common value of every coordinate its rows do not touch, so the sum over clients adds that common value
    ``v`` for them and patches in each client's own values where its rows touch (``tmp``, ``val`` and ``acc``
    and ``common`` are d-long scratch arrays; ``val`` equals ``v`` between clients).
    """
    n_steps, n_clients, batch = rows.shape
    d = w.shape[0]
    margins = np.empty((batch, n_clients))
    coef = np.empty(batch)
    same_w = np.broadcast_to(w, (n_clients, d))  # every client's margin is taken at the one model
    for t in range(n_steps):
        lr = lrs[t]
        for j in range(batch):
            _margins(same_w, indptr, indices, data, table, rows[t, :, j], margins[j])
        # What _client_block does to a coordinate no row touches, and the scale its sparse updates divide by.
        shrink = 1.0 - lr * lam
        scaled = gamma_inv <= 0.0 and not shrink < 1e-100
        sc = shrink if scaled else 1.0
        for q in range(d):
            if gamma_inv > 0.0:
                val[q] = w[q] - lr * (lam * w[q] + gamma_inv * (w[q] - anchor[q]))
            else:
                val[q] = w[q] * shrink
        for c in range(n_clients):
            for j in range(batch):
                yr = y[rows[t, c, j]]
                coef[j] = -yr * _sigmoid(-yr * margins[j, c]) / batch
            touched = 0
            for j in range(batch):
                r = rows[t, c, j]
                touched += indptr[r + 1] - indptr[r]
            if 4 * touched >= d:
                # Many rows: the client's whole model, as _client_block holds it, then scaled into the sum.
                for q in range(d):
                    tmp[q] = w[q] if scaled else val[q]
                for j in range(batch):
                    _add(tmp, indptr, indices, data, table, rows[t, c, j], -(lr * coef[j] / sc))
                if c == 0:
                    for q in range(d):
                        acc[q] = tmp[q] * sc if scaled else tmp[q]
                else:
                    for q in range(d):
                        acc[q] += tmp[q] * sc if scaled else tmp[q]
                continue
            # Few rows: the common value everywhere, the client's own values patched in where its rows touch.
            for j in range(batch):
                r = rows[t, c, j]
                for p in range(indptr[r], indptr[r + 1]):
                    q = indices[p]
                    common[q] = val[q]
                    tmp[q] = w[q] if scaled else val[q]
            for j in range(batch):
                _add(tmp, indptr, indices, data, table, rows[t, c, j], -(lr * coef[j] / sc))
            for j in range(batch):
                r = rows[t, c, j]
                for p in range(indptr[r], indptr[r + 1]):
                    q = indices[p]
                    val[q] = tmp[q] * sc if scaled else tmp[q]
            if c == 0:
                acc[:] = val
            else:
                for q in range(d):
                    acc[q] += val[q]
            for j in range(batch):  # back to the common value for the next client
                r = rows[t, c, j]
                for p in range(indptr[r], indptr[r + 1]):
                    q = indices[p]
                    val[q] = common[q]
        for q in range(d):
            w[q] = acc[q] / n_clients


# Calls with fewer samples than this (32 clients x k = 10 in the Non-IID sweeps, tests) run on the calling
# thread: below it, waking numba's threads costs about what they save.
_PARALLEL_SAMPLES = 1 << 11
# Above this many non-zeros, with at least a quarter of X's entries non-zero, :meth:`LogisticRegression.hessian`
# multiplies dense (BLAS). Below it the sparse product stays, so Newton's x* and every cached f* of the sets
# measured so far (at most 1.7e6 non-zeros: MNIST 4/9's training split) are bit for bit what they were.
DENSE_HESSIAN_NNZ = 1 << 24


class LogisticRegression:
    """The problem of Eq. 8 on a CSR design matrix with labels in {-1, +1}."""

    def __init__(
        self,
        X: sp.csr_matrix,
        y: np.ndarray,
        lam: float | None = None,
        name: str = "",
        weights: np.ndarray | None = None,
    ) -> None:
        self.X = sp.csr_matrix(X, dtype=np.float64)
        self.X.sort_indices()
        self.y = np.ascontiguousarray(y, dtype=np.float64)
        self.num_samples, self.dim = self.X.shape
        self.lam = 1.0 / self.num_samples if lam is None else float(lam)
        self.name = name
        # The objective's weight of each row (None: all 1, the sample mean): the clients' mean objective where they
        # hold unequal shares (:meth:`~stlsgd.data.Partition.row_weights`). Each client's own objective, which its
        # steps follow, stays the mean loss over its rows.
        self.weights = None if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
        self.param_names = ["w"]
        # Where a score x^T w is exactly 0 (an all-zero row, or x_0 = 0) the prediction is the majority class of
        # the training labels (+1 when the classes are even), so ties count as right for the majority's rows.
        self.majority = 1.0 if np.count_nonzero(self.y > 0) * 2 >= self.y.size else -1.0
        self._fstar: float | None = None
        self._wstar: np.ndarray | None = None
        self._rows = _compact_rows(self.X)

    def init_state(self, num_clients: int, seed: int = 0) -> State:
        return {"w": np.zeros((num_clients, self.dim), dtype=np.float64)}

    def local_steps(
        self,
        state: State,
        rows: np.ndarray,
        lrs: np.ndarray,
        prox: tuple[float, State] | None,
        drift: State | None = None,
    ) -> None:
        W = state["w"]
        args = (W, *self._step_args(rows, lrs, prox))
        delta = None if drift is None else np.ascontiguousarray(drift["w"], dtype=np.float64)
        if rows.size < _PARALLEL_SAMPLES:
            _client_block(*args, 0, W.shape[0], delta)  # type: ignore[call-arg]  # numba dispatcher
        else:
            _local_steps(*args, delta, min(numba.get_num_threads(), W.shape[0]))  # type: ignore[call-arg]

    def warm_up(self) -> None:
        # Loading the cached kernels initialises LLVM: about a second, once per process. One step of lr 0 on a
        # throwaway model pays it here; no sample is drawn, so the run's random stream is untouched.
        self.local_steps(self.init_state(1), np.zeros((1, 1, 1), dtype=np.int64), np.zeros(1), None)

    def sync_steps(self, state: State, rows: np.ndarray, lrs: np.ndarray, prox: tuple[float, State] | None) -> None:
        """``local_steps`` followed by the mean after every step, for clients that start equal (k = 1): the
        numbers of rounds of one step each, bit for bit, without a trip through Python per round."""
        W = state["w"]
        w = W[0].copy()
        _sync_steps(w, *self._step_args(rows, lrs, prox), *(np.empty(self.dim) for _ in range(4)))
        W[:] = w

    def _step_args(self, rows: np.ndarray, lrs: np.ndarray, prox: tuple[float, State] | None) -> tuple:
        """The kernels' arguments after the model: X, y, lambda, the rows, the lrs, 1/gamma and the anchor."""
        gamma_inv, anchor = (0.0, np.zeros(self.dim)) if prox is None else (prox[0], prox[1]["w"])
        return (
            *self._rows,
            self.y,
            self.lam,
            np.ascontiguousarray(rows, dtype=np.int64),
            np.ascontiguousarray(lrs, dtype=np.float64),
            float(gamma_inv),
            np.ascontiguousarray(anchor, dtype=np.float64).reshape(-1),
        )

    def _objective(self, margins: np.ndarray, w: np.ndarray) -> float:
        """Eq. 8 from the rows' margins y x^T w: their losses' mean (weighted by :attr:`weights` where the rows have
        them) plus the L2 term."""
        losses = np.logaddexp(0.0, -margins)
        mean = np.mean(losses) if self.weights is None else losses @ self.weights / self.num_samples
        return float(mean) + 0.5 * self.lam * float(w @ w)

    def loss(self, w: np.ndarray) -> float:
        return self._objective(self.y * (self.X @ w), w)

    def evaluate(self, state: State) -> Evaluation:
        w = state["w"][0]
        margins = self.y * (self.X @ w)
        objective = self._objective(margins, w)
        # sign(x^T w) with ties to the majority class: right where the margin is > 0, or 0 on a majority row.
        right = (margins > 0) | ((margins == 0) & (self.y == self.majority))
        return Evaluation(objective=objective, accuracy=float(np.mean(right)))

    def gradient(self, w: np.ndarray) -> np.ndarray:
        margins = self.y * (self.X @ w)
        coef = -self.y * _expit(-margins)
        if self.weights is not None:
            coef *= self.weights
        return self.X.T @ coef / self.num_samples + self.lam * w

    def newton(self, tol: float = 1e-13, max_iter: int = 100) -> tuple[np.ndarray, float]:
        """x* by damped Newton's method to machine precision: the gap f(x) - f* is then exact."""
        w = np.zeros(self.dim)
        f = self.loss(w)
        for _ in range(max_iter):
            g = self.gradient(w)
            if np.linalg.norm(g) <= tol:
                break
            step = np.linalg.solve(self.hessian(w), g)
            t = 1.0
            while True:  # Armijo backtracking: full steps from x_0 = 0 can overshoot on separable data
                f_new = self.loss(w - t * step)
                if f_new <= f - 1e-4 * t * float(g @ step) or t < 1e-10:
                    break
                t *= 0.5
            w, f_prev, f = w - t * step, f, f_new
            if t == 1.0 and f_prev - f <= 1e-16 * max(1.0, abs(f)):
                break
        return w, self.loss(w)

    def hessian(self, w: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """The objective's Hessian at ``w``, dense d x d: X^T diag(p (1 - p) / n) X + lambda I; with ``rows``, that
        of Eq. 8 on those rows alone (a client's objective: their mean loss and the same L2 term)."""
        X, curvature = self._curvature(w, rows)
        if X.nnz >= DENSE_HESSIAN_NNZ and 4 * X.nnz >= X.shape[0] * X.shape[1]:
            # Dense rows stored sparse: scipy's sparse x sparse product runs on one core without BLAS (a 30,000 x
            # 2,000 dense set spent over 20 minutes in it); numpy's product takes seconds.
            dense = X.toarray()
            return (dense.T * curvature) @ dense + self.lam * np.eye(self.dim)
        return (X.T @ X.multiply(curvature[:, None])).toarray() + self.lam * np.eye(self.dim)

    def hessian_factor(self, w: np.ndarray, rows: np.ndarray | None = None) -> sp.csr_matrix:
        """A, one row per sample (of ``rows``), with :meth:`hessian` = A^T A + lambda I: the rows of X scaled by
        sqrt(p (1 - p) / n). The loss's curvature lies in their span: at most as many directions as rows."""
        X, curvature = self._curvature(w, rows)
        return sp.csr_matrix(X.multiply(np.sqrt(curvature)[:, None]))

    def _curvature(self, w: np.ndarray, rows: np.ndarray | None) -> tuple[sp.csr_matrix, np.ndarray]:
        """The rows (all, or ``rows``) and each one's loss curvature at ``w`` over their count, p (1 - p) / n (all
        rows: times their :attr:`weights`; ``rows``: a client's objective, unweighted)."""
        X, y = (self.X, self.y) if rows is None else (self.X[rows], self.y[rows])
        p = _expit(y * (X @ w))
        curvature = p * (1.0 - p) / X.shape[0]
        return X, curvature * self.weights if rows is None and self.weights is not None else curvature

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for a in (self.X.indptr, self.X.indices, self.X.data, self.y, np.array([self.lam])):
            h.update(np.ascontiguousarray(a).tobytes())
        if self.weights is not None:  # another objective, another optimum (unweighted: the hash as before)
            h.update(self.weights.tobytes())
        return h.hexdigest()[:24]

    def optimum(self, cache_dir: Path | None = None) -> float:
        """f* = f(x*), cached on disk per dataset content and lambda."""
        return self._solve(cache_dir)[1]

    def minimizer(self, cache_dir: Path | None = None) -> np.ndarray:
        """x*, by Newton's method or from the cache :meth:`optimum` writes."""
        return self._solve(cache_dir)[0]

    def _solve(self, cache_dir: Path | None) -> tuple[np.ndarray, float]:
        if self._wstar is not None and self._fstar is not None:  # set together
            return self._wstar, self._fstar
        path = None
        if cache_dir is not None:
            path = self._optimum_file(cache_dir)
            if path.is_file():
                with np.load(path) as cached:
                    self._wstar, self._fstar = np.array(cached["w"]), float(cached["fstar"])
                return self._wstar, self._fstar
        w, self._fstar = self.newton()
        self._wstar = w
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fstar = self._fstar
                atomic_write(path, lambda fh: np.savez(fh, w=w, fstar=fstar), mode="wb")
            except OSError:
                pass  # a read-only cache only costs a recomputation
        return w, self._fstar

    def _optimum_file(self, cache_dir: Path) -> Path:
        return Path(cache_dir) / "optima" / f"logistic-{self.fingerprint()}.npz"


def _compact_rows(X: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """X's CSR arrays in the smallest exact form, for the kernels: (indptr, indices, data, table).

    SGD reads one random row per client and step, so its speed is the latency of those reads, which depends
    on whether the matrix fits in cache: a9a's 451k non-zeros take 7.2 MB as int64 indices and float64
    values, but 0.6 MB as uint8 indices (d = 123) with the values left out, since they are all 1 (``data`` None
    tells the kernels so). Matrices with at most 256 distinct values (MNIST's pixel/255) store uint8
    codes into a ``table`` of them. Every value is kept bit for bit: other matrices keep float64 ``data``.
    """
    # Unsigned offsets: the compiled loops then index without checking for negative (wrap-around) indices.
    indptr = X.indptr.astype(np.uint32 if X.nnz < 2**32 else np.uint64)
    index_type = next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64) if X.shape[1] <= np.iinfo(t).max + 1)
    indices = X.indices.astype(index_type)
    if np.all(X.data == 1.0):
        return indptr, indices, None, None
    table = np.unique(X.data)
    if len(table) <= 256:
        return indptr, indices, np.searchsorted(table, X.data).astype(np.uint8), table.astype(np.float64)
    return indptr, indices, np.ascontiguousarray(X.data, dtype=np.float64), None


def _expit(z: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    return expit(z)
