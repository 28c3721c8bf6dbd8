"""A proved lower bound on the logistic objective's gap, cheap enough to ask at every evaluation point.

A sweep run stops at the first evaluation whose gap f(w) - f* is at most the target. Most evaluation points
are far from it; if a bound computed from w alone (O(d^2), no pass over the data) proves the gap above the
target and the objective finite, the evaluation cannot end the run and may be skipped without changing the
round the run stops at (:class:`stlsgd.executors.simulator.Sparse`).

The bound is Bach's self-concordance inequality for logistic regression (F. Bach, "Self-concordant analysis
for logistic regression", EJS 2010, Lemma 1): along w(t) = x + t (w - x), g(t) = f(w(t)) has
|g'''| <= S g'' with S = max_i |a_i^T (w - x)| (the logistic loss has |phi'''| <= phi'', the L2 term none),
hence for Delta = w - x:

    f(w) >= f(x) + grad f(x)^T Delta + Delta^T H(x) Delta * (exp(-S) + S - 1) / S^2.

Taken at x = x* (Newton's optimum, the f* of the gap), with S <= min(R_2 |Delta|_2, R_1 |Delta|_inf) for the
rows' largest 2- and 1-norms, it costs one quadratic form in the Hessian at x*.
"""

from __future__ import annotations

import math
import weakref
from pathlib import Path

import numpy as np
import scipy.linalg

from stlsgd.problems.logistic import LogisticRegression

# Rounding: the evaluated gap differs from the exact one by ~1e-15 (a mean of n terms); the bound must exceed
# the target by far more than that before an evaluation is skipped.
_RELATIVE_SLACK = 1e-6
_ABSOLUTE_SLACK = 1e-9
# Below this norm every margin |a_i^T w| <= R |w| and |w|^2 are far from overflow: the objective is finite.
_FINITE_NORM = 1e100


def _psi(s: float) -> float:
    """(exp(-s) + s - 1) / s^2, -> 1/2 at s = 0 (series where the formula cancels)."""
    if s < 1e-4:
        return 0.5 - s / 6.0 + s * s / 24.0
    return (math.expm1(-s) + s) / (s * s)


class GapFloor:
    """``excludes(w, target)``: proved f(w) - f* > target and f(w) finite, for f* = ``problem.optimum()``."""

    def __init__(self, problem: LogisticRegression, cache_dir: Path | None = None) -> None:
        self.fstar = problem.optimum(cache_dir)
        self.w = np.asarray(problem.minimizer(cache_dir), dtype=np.float64)
        X = problem.X
        # H = L L^T: Delta^T H Delta = |L^T Delta|^2, never negative whatever the rounding.
        self.factor = np.ascontiguousarray(scipy.linalg.cholesky(problem.hessian(self.w), lower=True).T)
        squared = X.multiply(X).sum(axis=1)
        self.r2 = float(np.sqrt(np.max(squared))) if X.shape[0] else 0.0
        self.r1 = float(np.max(abs(X).sum(axis=1))) if X.shape[0] else 0.0
        # f(x*) - f* (0 unless the cached f* came from another x) and |grad f(x*)| (Newton's residual).
        self.offset = problem.loss(self.w) - self.fstar
        self.residual = float(np.linalg.norm(problem.gradient(self.w)))

    def lower(self, w: np.ndarray) -> float:
        """A lower bound on f(w) - f* (before the rounding slack)."""
        delta = w - self.w
        norm = float(np.linalg.norm(delta))
        s = min(self.r2 * norm, self.r1 * float(np.max(np.abs(delta), initial=0.0)))
        quad = float(np.sum((self.factor @ delta) ** 2))
        return self.offset - self.residual * norm + quad * _psi(s)

    def excludes(self, w: np.ndarray, target: float) -> bool:
        """Whether f(w) - f* > target and f(w) is finite, proved: an evaluation of w could not end the run."""
        norm = float(np.linalg.norm(w))
        if not norm < _FINITE_NORM:  # also NaN
            return False
        return self.lower(w) * (1.0 - _RELATIVE_SLACK) - _ABSOLUTE_SLACK > target


_FLOORS: weakref.WeakKeyDictionary[LogisticRegression, GapFloor] = weakref.WeakKeyDictionary()


def floor_for(problem: LogisticRegression, cache_dir: Path | None = None) -> GapFloor:
    """The problem's :class:`GapFloor`, built once per problem object (a sweep worker reuses its problem)."""
    if problem not in _FLOORS:
        _FLOORS[problem] = GapFloor(problem, cache_dir)
    return _FLOORS[problem]
