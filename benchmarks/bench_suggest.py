"""The clients' model's choice for ``auto`` as shipped against its draws run one after another, each to the cap.

    .venv/bin/python benchmarks/bench_suggest.py --data-dir ../shared/data [--config CONFIG] [--repeats 1]

``auto`` (clients that differ, with a target gap) takes the candidate of :func:`~stlsgd.experiments.suggest.
drift_candidates` with the fewest median rounds over five draws of the window's noise in the clients' quadratic
models, then the same among the plans beside it (its neighbours) where it is Local SGD + drift
(:func:`~stlsgd.experiments.suggest.drift_pick`). As shipped, the draws run side by side and stop at the
first majority (:func:`~stlsgd.experiments.suggest.fewest_median_rounds`). The baseline, measured in the same run
on the same estimates, runs the five draws one after another with every candidate up to the cap (STATIONARY_SLACK
x the stationary stages' count) and takes the fewest medians, then the most draws in by then, then the fewest
steps, then the lowest last lr, of the candidates every draw of which reaches (``drift_pick`` passes over the
others): the same choice, computed plainly. Prints both times, their ratio, and checks that both choose the same
plan in the same rounds. Default config: a9a, 32 label-sorted clients (s = 50), target gap 1e-4, a budget of 10 M
steps, an evaluation every 5 rounds (the Table 2+ a9a Non-IID column's run); ``--config`` takes another
(``benchmarks/heldout_sets.py OUT`` writes some).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

from stlsgd.experiments import suggest
from stlsgd.experiments.build import build
from stlsgd.experiments.config import Experiment, load_config

A9A_NONIID = {
    "data": {"dataset": "a9a", "num_clients": 32, "partition": "noniid", "s": 50},
    "run": {"seed": 0, "target_gap": 1e-4, "max_iterations": 10_000_000, "eval_every": 5},
    "algorithm": {"method": "stl_sc"},
}


def in_turn(
    e: suggest.Estimates, m: suggest.ClientsAtOptimum, bar: int, exp: Experiment
) -> tuple[int, dict[str, Any]] | None:
    """The baseline: the fewest median rounds and the candidate, each draw run alone up to ``bar`` - 1; where that
    is Local SGD + drift, the same among it and its neighbours, up to its rounds (as ``drift_pick``)."""
    got = _fewest_in_turn(e, m, suggest.drift_candidates(e), bar, bar - 1, exp)
    if got is not None and got[1]["method"] == "local_sgd":
        near = [got[1], *suggest.neighbours(e, got[1])]
        got = _fewest_in_turn(e, m, near, bar, got[0], exp) or got
    return got


def _fewest_in_turn(
    e: suggest.Estimates,
    m: suggest.ClientsAtOptimum,
    candidates: list[dict[str, Any]],
    bar: int,
    most: int,
    exp: Experiment,
) -> tuple[int, dict[str, Any]] | None:
    """The fewest median rounds (at most ``most``) of ``candidates`` every draw of which reaches under ``bar``."""
    plans, built = suggest.candidate_plans(e, m, candidates, exp.algorithm.batch, exp.run.max_iterations)
    draws = [
        suggest.drift_rounds(m, built, every=exp.run.eval_every, max_rounds=bar - 1, seeds=seed)
        for seed in range(suggest.DRIFT_DRAWS)
    ]
    per_candidate = list(zip(*draws, strict=True))
    medians = [
        sorted(math.inf if r is None else r for r in rounds)[suggest.DRIFT_DRAWS // 2] for rounds in per_candidate
    ]
    # drift_pick passes over a candidate some draw of which does not reach (within the budget and under the bar)
    found = [(int(r), i) for i, r in enumerate(medians) if None not in per_candidate[i] and r <= most]
    if not found:
        return None
    within = [sum(x is not None and x <= r for x in rounds) for r, rounds in zip(medians, per_candidate, strict=True)]
    r, i = min(
        found,
        key=lambda f: (
            f[0],
            -within[f[1]],
            suggest._steps_to(plans[f[1]], f[0]),
            built[f[1]].lasts(f[0], f[0])[0],
            f[1],
        ),
    )
    return r, candidates[i]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--config", default=None, help="an experiment config (default: a9a Non-IID, as above)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if args.config is None:
        exp = Experiment.model_validate(A9A_NONIID)
    else:
        exp = load_config(args.config, [], sweep_base=True)
        exp = exp.model_copy(update={"algorithm": exp.algorithm.model_copy(update={"auto": False})})
    built = build(exp, args.data_dir)
    e = suggest.estimates_for(built, exp.run.target_gap)
    m = e.clients
    if m is None:
        raise SystemExit(f"no clients' models for this config ({e.clients_skipped or 'alike clients or no target'})")
    stl = suggest.stl_rounds(e, m.noise, m.target_gap, exp.run.eval_every, exp.algorithm.batch)
    bar = suggest.STATIONARY_SLACK * stl
    times: dict[str, list[float]] = {"shipped": [], "in turn": []}
    chosen: dict[str, Any] = {}
    for _ in range(args.repeats):
        t = time.perf_counter()
        pick = suggest.drift_pick(e, m, bar, exp.algorithm.batch, exp.run.max_iterations, exp.run.eval_every)
        times["shipped"].append(time.perf_counter() - t)
        chosen["shipped"] = None
        if pick is not None:  # the candidate as drift_candidates gives it, and its rounds
            rounds, plan = pick.pop("model_rounds"), {k: v for k, v in pick.items() if k != "fallback"}
            chosen["shipped"] = (rounds, plan)
        t = time.perf_counter()
        chosen["in turn"] = in_turn(e, m, bar, exp)
        times["in turn"].append(time.perf_counter() - t)
    count = len(suggest.drift_candidates(e))
    print(f"{count} candidates, five draws, up to {bar - 1} rounds; d = {e.d}, N = {e.num_clients}")
    for name, ts in times.items():
        got = chosen[name]
        what = "none reaches" if got is None else f"{got[0]} rounds"
        print(f"{name:>8}: median {statistics.median(ts):.2f} s of {len(ts)} ({what})")
    ratio = statistics.median(times["in turn"]) / statistics.median(times["shipped"])
    print(f"ratio (in turn / shipped): {ratio:.2f}x")
    if chosen["shipped"] != chosen["in turn"]:
        raise SystemExit(f"the choices differ: {chosen}")
    if chosen["shipped"] is not None:
        print("chosen by both:", chosen["shipped"][1])


if __name__ == "__main__":
    main()
