"""Wall time of the whole Table 2 sweep: the four columns, every method, the paper's full grids.

    .venv/bin/python benchmarks/bench_table2.py --data-dir /work/shared/data [--jobs 2] [--out DIR]
        [--columns a9a_iid mnist_iid ...]

Prints, per column, the wall time, the runs by status and the summed run time (the serial cost the sweep's
pruning and parallelism had to absorb), then the total against the 20-minute target (ratio < 1 meets it) and
the load average, since other processes on the machine slow every figure down. A finished column is skipped
on a rerun into the same --out (results.jsonl), so time a fresh --out.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from stlsgd.experiments.sweep import read_results, run_sweep

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
        records = read_results(out / column / "results.jsonl")
        serial = sum(r["wall_s"] or 0.0 for r in records)
        statuses = dict(Counter(r["status"] for r in records))
        print(f"{column}: wall {wall:.1f} s, {len(records)} runs {statuses}, summed run time {serial:.1f} s "
              f"(x{serial / wall:.2f} of wall), load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"total: {total:.1f} s for {len(configs)} sweeps; target {target_s:.0f} s; ratio {total / target_s:.2f}")
    return total


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
