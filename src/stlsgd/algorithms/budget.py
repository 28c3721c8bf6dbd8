"""The iteration budget as a hard cap on a plan's rounds.

``run.max_iterations`` caps the run's iterations (local steps per client): a round that would cross it is cut at
the budget -- it runs only the steps left, then averages as every round does -- and the run ends ``budget``.
The cut round's metrics line shows its actual length (``period``) and ``iteration`` equal to the budget.

Why cut rather than not start it: late STL-SGD stages have rounds of 10^5-10^6 local steps, so a round left
unstarted could leave most of a budget unused (and one that ran whole overran a 6M budget by 70%), while a cut
round spends exactly the budget and still ends on an averaged model. The cut round's steps are the first steps
of the round the plan gave (same learning rates, same samples), so a run with a larger budget passes through the
same states up to the cut.
"""

from __future__ import annotations

import dataclasses

from stlsgd.algorithms.plan import Round


def within_budget(rnd: Round, max_iterations: int | None) -> Round:
    """``rnd``, or its first ``max_iterations - rnd.start_iteration`` steps when it would cross the budget."""
    if max_iterations is None or not rnd.start_iteration < max_iterations < rnd.end_iteration:
        return rnd
    return dataclasses.replace(rnd, steps=max_iterations - rnd.start_iteration)


__all__ = ["within_budget"]
