"""One stored sweep setting run densely (every due evaluation) and sparsely (as sweep runs now do), alternately.

    .venv/bin/python benchmarks/bench_sparse_eval.py --data-dir ../shared/data --sweep table2_a9a_noniid \
        --label "Local SGD" --settings '{"lr": 3.2, "lr_decay": 0.001, "k": 20}' [--seed 0] [--repeats 3] \
        [--prune-after R]

Both runs go through the sweep worker's path (data, partition, problem and f* built once, one numba thread as a
sweep worker with --jobs 2 has) after one warm-up run; ``--prune-after R`` prunes them after round R, as a sweep
whose row has a finished run of R rounds does; prints each run's own time (summary wall_s: the round loop,
no start-up), its evaluations, the medians and their ratio, and checks that the outcomes are the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from stlsgd.experiments.config import Experiment
from stlsgd.experiments.runner import run_experiment
from stlsgd.experiments.sweeps.spec import load_sweep
from stlsgd.experiments.sweeps.worker import KEEP_EVERY, _built_for
from stlsgd.threads import share_cores

ROOT = Path(__file__).resolve().parents[1]
OUTCOME = ("status", "rounds_to_target", "iterations_to_target", "rounds", "iterations")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--sweep", required=True, help="a file name under configs/paper/ (no .toml)")
    parser.add_argument("--label", required=True)
    parser.add_argument("--settings", required=True, help="the grid setting, as JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="cores shared as a sweep with --jobs N shares them")
    parser.add_argument("--prune-after", type=int, default=None, help="prune the runs after this round")
    args = parser.parse_args()
    share_cores(args.jobs)
    settings = json.loads(args.settings)
    sweep = load_sweep(ROOT / "configs" / "paper" / f"{args.sweep}.toml", only=[args.label])
    config = next(s.config for s in sweep.grid if s.settings == settings)
    config["run"]["seed"] = args.seed
    exp = Experiment.model_validate(config)
    built = _built_for(exp, args.data_dir)
    times: dict[str, list[float]] = {"dense": [], "sparse": []}
    outcomes: dict[str, Any] = {}
    bound = args.prune_after

    def on_round(st: Any, rnd: Any) -> str | None:
        return "pruned" if bound is not None and st.round > bound else None

    with tempfile.TemporaryDirectory() as tmp:
        run_experiment(exp, Path(tmp) / "warm", built=built, progress=False, sparse_eval=KEEP_EVERY, on_round=on_round)
        for i in range(args.repeats):
            for mode, sparse_eval in (("dense", None), ("sparse", KEEP_EVERY)):
                out = Path(tmp) / f"{mode}{i}"
                s = run_experiment(exp, out, built=built, progress=False, sparse_eval=sparse_eval, on_round=on_round)
                assert s is not None
                lines = len((out / "metrics.jsonl").read_text().splitlines())
                times[mode].append(s["wall_s"])
                outcome = {k: s[k] for k in OUTCOME} | {"objective": s["final"]["objective"]}
                assert outcomes.setdefault("first", outcome) == outcome, (mode, outcome, outcomes["first"])
                print(f"{mode:6s} run {i}: {s['wall_s']:.3f} s, {lines} evaluations, {outcome}", flush=True)
    dense, sparse = statistics.median(times["dense"]), statistics.median(times["sparse"])
    print(f"median: dense {dense:.3f} s, sparse {sparse:.3f} s: x{dense / sparse:.2f} faster, same outcome")


if __name__ == "__main__":
    main()
