"""Wall time of the whole Table 2 sweep: the four columns, every method, the paper's full grids.

    .venv/bin/python benchmarks/bench_table2.py --data-dir ../shared/data [--jobs 2] [--out DIR]
        [--columns a9a_iid mnist_iid ...] [--sweeps table2plus] [--floor-only] [--limit N] [--only LABEL]
        [--cluster local:2 | tcp://HOST:PORT] [--compare-cluster local:2]

Prints, per column, the wall time, the runs by status, the summed run time (the serial cost the sweep's
pruning and parallelism had to absorb) and the column's floor (below) with the summed run time's ratio to it,
then the total against the 20-minute target (ratio < 1 meets it) and the load average, since other processes
on the machine slow every figure down. ``--cluster`` runs the sweeps on Dask (``stlsgd sweep --cluster``);
``--compare-cluster ADDR`` runs each column twice, with the local pool (``--jobs``) and on ``ADDR``, each into
its own fresh directory, and prints the cluster's wall time against the pool's. A finished column is skipped
on a rerun into the same --out (results.jsonl), so time a fresh --out. ``--sweeps table2plus`` times the
Table 2+ files instead (configs/paper/table2plus_*.toml); ``--floor-only`` runs nothing and prints the floor
of the sweeps already in --out (one directory per file, named after it).

Then, per column, a floor under any schedule of the same grids: the client-steps the runs of local methods
(Local SGD, STL-SGD and the other period schedules: the bulk of the work) would take had every row's best run
finished first, so that every other run is pruned as early as the rule allows, times the local-step cost
measured on the column's problem afterwards, alone on the machine (the drift-corrected kernel's for the runs
that used drift correction), divided by --jobs. Evaluations, averaging and the k = 1 methods are left out, so
the sweep cannot beat it; the last line compares the floor's total to the target."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from stlsgd.algorithms.registry import REGISTRY, LocalMethodConfig
from stlsgd.executors.sampling import Sampler
from stlsgd.experiments.build import build
from stlsgd.experiments.config import read_raw, validate
from stlsgd.experiments.sweeps import best_of, current_records, load_sweep, read_results, run_sweep
from stlsgd.threads import share_cores

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("a9a_iid", "a9a_noniid", "mnist_iid", "mnist_noniid")
TARGET_S = 20 * 60


def time_sweeps(
    configs: list[Path],
    out: Path,
    *,
    jobs: int,
    data_dir: str | None,
    limit: int | None,
    target_s: float,
    cluster: str | None = None,
    floor: bool = True,
    only: list[str] | None = None,
) -> float:
    """Run each sweep file into ``out`` in turn, print its wall time, runs, summed run time and floor, then the
    total; return it."""
    grids = f"first {limit} setting(s) of each row" if limit else "full grids"
    where = f"cluster={cluster}" if cluster else f"jobs={jobs}"
    print(f"load average before: {os.getloadavg()}, {where}, {grids}, out={out}", flush=True)
    total = 0.0
    for config in configs:
        column = config.stem
        started = time.perf_counter()
        run_sweep(
            config, out / column, jobs=jobs, data_dir=data_dir, quiet=True, limit=limit, cluster=cluster, only=only
        )
        wall = time.perf_counter() - started
        total += wall
        records = read_results(out / column)
        serial = sum(r["wall_s"] or 0.0 for r in records)
        statuses = dict(Counter(r["status"] for r in records))
        ratio = f"x{serial / wall:.2f} of wall" if wall >= 1.0 else "all finished before this run"
        line = (
            f"{column}: wall {wall:.1f} s, {len(records)} runs {statuses}, summed run time {serial:.1f} s "
            f"({ratio}), load {os.getloadavg()[0]:.2f}"
        )
        if floor:
            floor_s = column_floor(config, out / column, jobs=jobs, data_dir=data_dir)
            line += (
                f", floor {floor_s:.1f} s on {jobs} job(s): summed run time x{serial / max(floor_s, 1e-9):.1f} of "
                f"the floor (as docs/results/schedules.md states it), x{serial / max(floor_s * jobs, 1e-9):.1f} of "
                "its serial time"
            )
        print(line, flush=True)
    print(f"total: {total:.1f} s for {len(configs)} sweeps; target {target_s:.0f} s; ratio {total / target_s:.2f}")
    return total


def column_floor(config: Path, sweep_dir: Path, *, jobs: int, data_dir: str | None) -> float:
    """The column's floor in seconds on ``jobs`` jobs (see the module's docstring)."""
    return sum(
        needed * local_step_seconds(config, data_dir, jobs, drift=drift) / jobs
        for drift, (_, needed) in local_client_steps_by_rule(config, sweep_dir).items()
    )


def print_floor(configs: list[Path], out: Path, *, jobs: int, data_dir: str | None, target_s: float) -> None:
    """Print each sweep's floor (see the module's docstring) and their total against the target."""
    floor = 0.0
    for config in configs:
        for drift, (simulated, needed) in sorted(local_client_steps_by_rule(config, out / config.stem).items()):
            step_s = local_step_seconds(config, data_dir, jobs, drift=drift)
            floor += needed * step_s / jobs
            print(
                f"{config.stem}{' (rows with drift correction)' if drift else ''}: local methods' client-steps "
                f"{simulated / 1e9:.2f} G simulated, {needed / 1e9:.2f} G with every row's best run first; "
                f"{step_s * 1e9:.0f} ns per client-step -> floor {needed * step_s / jobs:.0f} s on {jobs} job(s)",
                flush=True,
            )
    print(f"floor total: {floor:.0f} s; target {target_s:.0f} s; floor / target {floor / target_s:.2f}")


def _local(method: str) -> bool:
    """A method with local steps between averages (the bulk of a sweep's work)."""
    return issubclass(REGISTRY[method], LocalMethodConfig)


def local_client_steps(config: Path, sweep_dir: Path) -> tuple[int, int]:
    """(client-steps the runs of local methods took in ``sweep_dir``, summed over clients; those they need at
    the least), with and without drift correction together (:func:`local_client_steps_by_rule`)."""
    counts = local_client_steps_by_rule(config, sweep_dir).values()
    return sum(simulated for simulated, _ in counts), sum(needed for _, needed in counts)


def local_client_steps_by_rule(config: Path, sweep_dir: Path) -> dict[bool, tuple[int, int]]:
    """Whether drift correction ran -> (client-steps the runs of local methods took in ``sweep_dir``, summed over
    clients; those they need at the least), for the rules some run used, in one pass over the runs: each grid run
    stopped at the first evaluation at or after the best finished round count among its rows (a run still going
    there is pruned), or at its own end if earlier or if a row it belongs to has no finished run;
    seed reruns count whole. Read from each run's metrics.jsonl, so adaptive schedules count what they did. Runs of earlier versions of the file are left out, as the sweep
    leaves them out of its choice."""
    sweep = load_sweep(config)
    records = current_records(sweep, read_results(sweep_dir))
    best = {label: best_of(records, label) for label in sweep.labels}
    labels: dict[str, set[str]] = {}
    first: dict[str, dict] = {}  # a run shared by two rows is recorded under each; count it once
    for r in records:
        labels.setdefault(r["key"], set()).add(r["label"])
        first.setdefault(r["key"], r)
    counts: dict[bool, tuple[int, int]] = {}
    for key, r in first.items():
        if not _local(r["method"]):
            continue
        bounds = [best[label] and best[label]["rounds_to_target"] for label in labels[key]]
        stop = r["rounds"]
        if r["phase"] == "grid" and None not in bounds:
            stop = min(stop, max(bounds))
        lines = [json.loads(line) for line in (sweep_dir / r["run_dir"] / "metrics.jsonl").read_text().splitlines()]
        exp = validate(read_raw(sweep_dir / r["run_dir"] / "config.yaml"), r["run_dir"])
        ran = json.loads((sweep_dir / r["run_dir"] / "summary.json").read_text()).get("rule") or {}
        drift = bool(ran.get("drift"))  # what ran (auto decides it itself)
        clients = exp.data.num_clients
        simulated, needed = counts.get(drift, (0, 0))
        counts[drift] = (
            simulated + r["iterations"] * exp.algorithm.batch * clients,
            needed + next((m for m in lines if m["round"] >= stop), lines[-1])["client_steps"] * clients,
        )
    return counts


def local_step_seconds(config: Path, data_dir: str | None, jobs: int, drift: bool = False) -> float:
    """Seconds per client-step (one sample of one client) of the local steps on ``config``'s problem and
    partition at its rows' batch, with a sweep worker's share of the cores (best of several calls, fresh rows
    each call: 30 calls of 400 steps for the compiled logistic kernels, 5 of 10 for a network); with ``drift``,
    the kernel that also adds the control variates' correction every step (about a fifth more on a9a)."""
    share_cores(jobs)
    spec = next(s for s in load_sweep(config).grid if _local(s.method))
    exp = validate(spec.config, str(config))
    built = build(exp, data_dir)
    steps, repeats = (10, 5) if exp.problem.kind == "net" else (400, 30)
    n, batch = built.partition.num_clients, exp.algorithm.batch
    sampler = Sampler(built.partition, seed=0)
    state = built.problem.init_state(n)
    lrs = np.full(steps, 1e-3)
    correction = {name: value * 0 for name, value in state.items()} if drift else None
    built.problem.local_steps(state, sampler.draw(steps, batch), lrs, None, correction)  # compile / warm up
    best = float("inf")
    for _ in range(repeats):
        rows = sampler.draw(steps, batch)
        started = time.perf_counter()
        built.problem.local_steps(state, rows, lrs, None, correction)
        best = min(best, time.perf_counter() - started)
    return best / (steps * n * batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--out", default=None, help="sweep directories go here (default: a fresh temp dir)")
    parser.add_argument("--columns", nargs="+", default=list(COLUMNS), choices=COLUMNS + ("a9a_iid_split",))
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="only the first N settings of each row (a probe; the target is for the full grids)",
    )
    parser.add_argument(
        "--sweeps",
        choices=("table2", "table2plus"),
        default="table2",
        help="the sweep files: the paper's Table 2 (default) or Table 2+ (configs/paper/table2plus_*)",
    )
    parser.add_argument("--only", action="append", metavar="LABEL", help="run only this row (repeatable; a probe)")
    parser.add_argument("--cluster", default=None, help="run the sweeps on Dask: local:N or tcp://HOST:PORT")
    parser.add_argument(
        "--compare-cluster",
        default=None,
        metavar="ADDR",
        help="run each column with the local pool (--jobs) and on ADDR (e.g. local:2) and compare wall times",
    )
    parser.add_argument(
        "--floor-only",
        action="store_true",
        help="run nothing: print the floor of the sweeps already in --out (e.g. ones run by hand)",
    )
    args = parser.parse_args()
    if args.floor_only and not args.out:
        parser.error("--floor-only: needs --out, the directory holding the sweeps")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_table2_"))
    configs = [ROOT / "configs" / "paper" / f"{args.sweeps}_{column}.toml" for column in args.columns]
    if args.floor_only:
        for config in configs:
            if not (out / config.stem / "runs").is_dir():
                # The floor counts each run's client-steps up to its row's bound from its metrics.jsonl; the
                # records kept under docs/results hold no run directories.
                parser.error(
                    f"--floor-only: {out / config.stem / 'runs'} is missing: point --out at the sweeps' own output"
                )
        print_floor(configs, out, jobs=args.jobs, data_dir=args.data_dir, target_s=TARGET_S)
    elif args.compare_cluster:
        common = {
            "jobs": args.jobs,
            "data_dir": args.data_dir,
            "limit": args.limit,
            "target_s": TARGET_S,
            "only": args.only,
        }
        for config in configs:
            pool = time_sweeps([config], out / "pool", **common)
            dask = time_sweeps([config], out / "cluster", cluster=args.compare_cluster, floor=False, **common)
            print(
                f"{config.stem}: {args.compare_cluster} wall {dask:.1f} s vs local pool (--jobs {args.jobs}) "
                f"{pool:.1f} s: x{dask / pool:.2f}",
                flush=True,
            )
    else:
        time_sweeps(
            configs,
            out,
            jobs=args.jobs,
            data_dir=args.data_dir,
            limit=args.limit,
            target_s=TARGET_S,
            cluster=args.cluster,
            only=args.only,
        )


if __name__ == "__main__":
    main()
