"""Wall time of the whole CPU-scale Table 3: both sweep files of configs/cpu (IID and Non-IID), every method.

    .venv/bin/python benchmarks/bench_table3.py --data-dir ../shared/data [--jobs 2] [--out DIR]

Prints, per sweep, the wall time, the runs by status and the summed run time, then the total against a
30-minute target (ratio < 1 meets it) and the load average, then the floor of bench_table2 (the Local SGD and
STL-SGD^nc client-steps needed with every row's best run first, times the measured cost of a step). A finished
sweep is skipped on a rerun into the same --out, so time a fresh --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table2 import ROOT, time_sweeps  # noqa: E402

TARGET_S = 30 * 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--out", default=None, help="sweep directories go here (default: a fresh temp dir)")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_table3_"))
    configs = [ROOT / "configs" / "cpu" / f"table3_cnn_mnist_{split}.toml" for split in ("iid", "noniid")]
    time_sweeps(configs, out, jobs=args.jobs, data_dir=args.data_dir, limit=None, target_s=TARGET_S)


if __name__ == "__main__":
    main()
