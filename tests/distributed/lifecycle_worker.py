"""Started by torchrun from the distributed tests, to look inside a run or to kill it at a chosen instant.

torchrun --nproc_per_node=P tests/distributed/lifecycle_worker.py trace OUT CONFIG [KEY=VALUE ...]
    every rank saves OUT/trace_rank<r>.npz: its clients' averaged model after every round;
torchrun --nproc_per_node=P tests/distributed/lifecycle_worker.py kill-before-summary OUT CONFIG [KEY=VALUE ...]
    rank 0 SIGKILLs itself after the final checkpoint, before final_params.npz and summary.json.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np

from stlsgd.experiments import rundir
from stlsgd.experiments.config import load_config
from stlsgd.experiments.runner import run_experiment


def main(mode: str, out: str, config: str, overrides: list[str]) -> int:
    exp = load_config(config, overrides)
    rank = int(os.environ["RANK"])
    if mode == "trace":
        rows: list[np.ndarray] = []

        def record(st, rnd) -> None:
            rows.append(st.clients["w"].copy())
            if st.control is not None:  # drift correction: this rank's control variates too
                rows.append(st.control["w"].copy())

        run_experiment(exp, Path(out) / "run", backend="dist", progress=False, on_round=record, checkpoint_every=4)
        np.savez(Path(out) / f"trace_rank{rank}.npz", *rows)
        return 0
    assert mode == "kill-before-summary"

    def die(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if rank == 0:
        rundir.write_final_params = die  # the first file written after the final checkpoint
    run_experiment(exp, Path(out), backend="dist", progress=False, checkpoint_every=5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
