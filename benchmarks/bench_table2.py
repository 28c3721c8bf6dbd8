"""Wall time of the whole Table 2 sweep: the four columns, every method, the paper's full grids.

    .venv/bin/python benchmarks/bench_table2.py --data-dir /work/shared/data [--jobs 2] [--out DIR]
        [--columns a9a_iid mnist_iid ...]

Prints, per column, the wall time, the runs by status and the summed run time (the serial cost the sweep's
pruning and parallelism had to absorb), then the total against the 20-minute target (ratio < 1 meets it) and
the load average, since other processes on the machine slow every figure down. A finished column is skipped
on a rerun into the same --out (results.jsonl), so time a fresh --out.

Then, per column, a floor under any schedule of the same grids: the client-steps the Local SGD and STL-SGD
runs (the bulk of the work) would take had every row's best run finished first, so that every other run is
pruned as early as the rule allows, times the local-step cost measured on the column's problem afterwards,
alone on the machine, divided by --jobs. Evaluations, averaging and the k = 1 methods are left out, so the
sweep cannot beat it; the last line compares the floor's total to the target.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from stlsgd.executors.sampling import Sampler
from stlsgd.experiments.build import build, plan_context
from stlsgd.experiments.config import read_raw, validate
from stlsgd.experiments.sweeps import best_of, current_records, load_sweep, read_results, run_sweep
from stlsgd.threads import share_cores

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("a9a_iid", "a9a_noniid", "mnist_iid", "mnist_noniid")
TARGET_S = 20 * 60


def time_sweeps(configs: list[Path], out: Path, *, jobs: int, data_dir: str | None, limit: int | None,
                target_s: float) -> float:
    """Run each sweep file into ``out`` in turn, print its wall time and runs, then the total; return it."""
    grids = "first {} setting(s) of each row".format(limit) if limit else "full grids"
    print(f"load average before: {os.getloadavg()}, jobs={jobs}, {grids}, out={out}", flush=True)
    total = 0.0
    for config in configs:
        column = config.stem
        started = time.perf_counter()
        run_sweep(config, out / column, jobs=jobs, data_dir=data_dir, quiet=True, limit=limit)
        wall = time.perf_counter() - started
        total += wall
        records = read_results(out / column)
        serial = sum(r["wall_s"] or 0.0 for r in records)
        statuses = dict(Counter(r["status"] for r in records))
        ratio = f"x{serial / wall:.2f} of wall" if wall >= 1.0 else "all finished before this run"
        print(f"{column}: wall {wall:.1f} s, {len(records)} runs {statuses}, summed run time {serial:.1f} s "
              f"({ratio}), load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"total: {total:.1f} s for {len(configs)} sweeps; target {target_s:.0f} s; ratio {total / target_s:.2f}")
    floor = 0.0
    for config in configs:
        simulated, needed = local_client_steps(config, out / config.stem)
        step_s = local_step_seconds(config, data_dir, jobs)
        floor += needed * step_s / jobs
        print(f"{config.stem}: Local SGD + STL-SGD client-steps {simulated / 1e9:.2f} G simulated, {needed / 1e9:.2f} G "
              f"with every row's best run first; {step_s * 1e9:.0f} ns per client-step -> floor "
              f"{needed * step_s / jobs:.0f} s on {jobs} job(s)", flush=True)
    print(f"floor total: {floor:.0f} s; target {target_s:.0f} s; floor / target {floor / target_s:.2f}")
    return total


LOCAL_METHODS = ("local_sgd", "stl_sc", "stl_nc")  # the methods with local steps between averages


def local_client_steps(config: Path, sweep_dir: Path) -> tuple[int, int]:
    """(client-steps the Local SGD and STL-SGD^sc runs of sweep file ``config`` took in ``sweep_dir``, those
    they need at the least): each grid run stopped at the round after the best finished round count among its
    rows, or at its own end if earlier or if a row it belongs to has no finished run; seed reruns count whole.
    Runs of earlier versions of the file are left out, as the sweep leaves them out of its choice."""
    sweep = load_sweep(config)
    records = current_records(sweep, read_results(sweep_dir))
    best = {label: best_of(records, label) for label in sweep.labels}
    labels: dict[str, set[str]] = {}
    first: dict[str, dict] = {}  # a run shared by two rows is recorded under each; count it once
    for r in records:
        labels.setdefault(r["key"], set()).add(r["label"])
        first.setdefault(r["key"], r)
    simulated = needed = 0
    for key, r in first.items():
        if r["method"] not in LOCAL_METHODS:
            continue
        exp = validate(read_raw(sweep_dir / r["run_dir"] / "config.yaml"), r["run_dir"])
        bounds = [best[label] and best[label]["rounds_to_target"] for label in labels[key]]
        stop = r["rounds"]
        if r["phase"] == "grid" and None not in bounds:
            stop = min(stop, max(bounds) + 1)
        plan = exp.algorithm.plan(plan_context(exp, r["num_samples"], exp.problem.lam or 1.0 / r["num_samples"]))
        per_step = exp.data.num_clients * exp.algorithm.batch
        simulated += r["iterations"] * per_step
        needed += next(rnd.end_iteration for rnd in plan.rounds() if rnd.index + 1 >= stop) * per_step
    return simulated, needed


def local_step_seconds(config: Path, data_dir: str | None, jobs: int) -> float:
    """Seconds per client-step (one sample of one client) of the local steps on ``config``'s problem and
    partition at its rows' batch, with a sweep worker's share of the cores (best of several calls, fresh rows
    each call: 30 calls of 400 steps for the compiled logistic kernels, 5 of 10 for a network)."""
    share_cores(jobs)
    spec = next(s for s in load_sweep(config).grid if s.method in LOCAL_METHODS)
    exp = validate(spec.config, str(config))
    built = build(exp, data_dir)
    steps, repeats = (10, 5) if exp.problem.kind == "net" else (400, 30)
    n, batch = built.partition.num_clients, exp.algorithm.batch
    sampler = Sampler(built.partition, seed=0)
    state = built.problem.init_state(n)
    lrs = np.full(steps, 1e-3)
    built.problem.local_steps(state, sampler.draw(steps, batch), lrs, None)  # compile / warm up
    best = float("inf")
    for _ in range(repeats):
        rows = sampler.draw(steps, batch)
        started = time.perf_counter()
        built.problem.local_steps(state, rows, lrs, None)
        best = min(best, time.perf_counter() - started)
    return best / (steps * n * batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--out", default=None, help="sweep directories go here (default: a fresh temp dir)")
    parser.add_argument("--columns", nargs="+", default=list(COLUMNS), choices=COLUMNS + ("a9a_iid_split",))
    parser.add_argument("--limit", type=int, default=None,
                        help="only the first N settings of each row (a probe; the target is for the full grids)")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_table2_"))
    configs = [ROOT / "configs" / "paper" / f"table2_{column}.toml" for column in args.columns]
    time_sweeps(configs, out, jobs=args.jobs, data_dir=args.data_dir, limit=args.limit, target_s=TARGET_S)


if __name__ == "__main__":
    main()
