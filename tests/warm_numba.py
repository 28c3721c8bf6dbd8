"""Compile the logistic problem's numba kernels into their on-disk cache (``cache=True``) in one process.

A fresh clone has no cache: without this, the suite's first minute has every test process (and every process
they launch) compiling the same kernels at once. tests/conftest.py runs it once before pytest-xdist starts its
workers (26 s on one core when nothing is cached, 2 s when all is). Each tiny run below meets one
family of kernel signatures the suite meets: the data's encoding (digits: values through a table; a9a: all
ones), the proximal term (STL-SGD^nc), drift correction, mini-batches, many clients' steps (the parallel kernel)
and SyncSGD's fused rounds."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from stlsgd.experiments.config import load_config
from stlsgd.experiments.runner import run_experiment

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# (algorithm, run): k = 600 with 4 clients takes the parallel kernel; SyncSGD's rounds between evaluations are
# fused into one kernel call.
RUNS = (
    ('method = "local_sgd"\nlr = 0.5\nk = 5', "max_rounds = 3"),
    ('method = "local_sgd"\nlr = 0.5\nk = 600', "max_rounds = 2"),
    ('method = "local_sgd"\nlr = 0.5\nk = 5\nbatch = 4', "max_rounds = 3"),
    ('method = "local_sgd"\nlr = 0.5\nk = 5\ndrift = true', "max_rounds = 3"),
    ('method = "local_sgd"\nlr = 0.5\nk = 600\ndrift = true', "max_rounds = 2"),
    ('method = "stl_nc"\nlr = 0.5\nk = 2\nT1 = 40\ngamma = 5.0', "max_rounds = 3"),
    ('method = "sync_sgd"\nlr = 0.5', "max_rounds = 20\neval_every = 10"),
)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in ("digits49", "a9a"):
            for i, (algorithm, run) in enumerate(RUNS):
                config = Path(tmp) / f"{dataset}{i}.toml"
                config.write_text(
                    f'[data]\ndataset = "{dataset}"\nnum_clients = 4\ndata_dir = "{DATA}"\n'
                    f'[algorithm]\n{algorithm}\n[run]\n{run}\ntarget_gap = "none"\n'
                )
                run_experiment(load_config(config), Path(tmp) / f"out{dataset}{i}", progress=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
