"""Started as the ranks of a job from the distributed tests, with torchrun's environment (tests/launch.py:
run_ranks): one process group, many runs (one launch serves them all). By hand:

    torchrun --nproc_per_node=P tests/distributed/dist_worker.py JOBS.json

``JOBS.json`` is a list of jobs, run in order on the same group (the executor uses the group this script made
and leaves it alone):

- ``{"mode": "run", "config": C, "out": D, "sets": [...]}``: ``stlsgd run C --backend dist --quiet --out D
  --set ...`` through the CLI;
- ``{"mode": "trace", "config": C, "out": D, "sets": [...]}``: the run into ``D/run`` (checkpoints every 4
  rounds), every rank saving ``D/trace_rank<r>.npz``: its clients' averaged model after every round (and their
  control variates, with drift correction).

A job that fails writes ``D/failed_rank<r>.txt`` (its exit status or traceback); the next job still runs, so
one broken comparison fails its own test only (tests/distributed/conftest.py launches and reads these).
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np
import torch.distributed as dist

from stlsgd.cli import main
from stlsgd.experiments.config import load_config
from stlsgd.experiments.runner import run_experiment


def trace(config: str, sets: list[str], out: Path) -> None:
    rows: list[np.ndarray] = []

    def record(st, rnd) -> None:
        rows.append(st.clients["w"].copy())
        if st.control is not None:  # drift correction: this rank's control variates too
            rows.append(st.control["w"].copy())

    run_experiment(
        load_config(config, sets), out / "run", backend="dist", progress=False, on_round=record, checkpoint_every=4
    )
    np.savez(out / f"trace_rank{dist.get_rank()}.npz", *rows)


def run_job(job: dict) -> None:
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    try:
        if job["mode"] == "trace":
            trace(job["config"], job["sets"], out)
            return
        sets = [x for s in job["sets"] for x in ("--set", s)]
        code = main(["run", job["config"], "--backend", "dist", "--quiet", "--out", str(out), *sets])
        if code:
            (out / f"failed_rank{dist.get_rank()}.txt").write_text(f"stlsgd run exited with status {code}\n")
    except Exception:  # noqa: BLE001 -- recorded for the job's own test; the next job still runs
        (out / f"failed_rank{dist.get_rank()}.txt").write_text(traceback.format_exc())


def run(jobs_file: str) -> int:
    dist.init_process_group("gloo")
    try:
        for job in json.loads(Path(jobs_file).read_text()):
            run_job(job)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
