"""The simulator run as the unit tests run it: one plan on one problem from x_0 = 0, with its metrics lines."""

from __future__ import annotations

from stlsgd.executors.rules import PLAIN
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import init_run_state, run


def simulate(problem, partition, plan, stop, seed=0, fstar=None, rule=PLAIN):
    sampler = Sampler(partition, seed)
    metrics = []
    state = run(
        plan,
        problem,
        sampler,
        stop,
        init_run_state(problem, sampler, partition.num_clients, seed),
        fstar=fstar,
        on_metrics=metrics.append,
        progress=False,
        rule=rule,
    )
    return state, metrics
