"""Started as ranks (tests/launch.py run_ranks, or torchrun) by the distributed tests, to kill a run at a chosen
instant.

torchrun --nproc_per_node=P tests/distributed/lifecycle_worker.py kill-before-summary OUT CONFIG [KEY=VALUE ...]
    rank 0 SIGKILLs itself after the final checkpoint, before final_params.npz and summary.json.

(The runs traced round by round come from the shared launches: tests/distributed/dist_worker.py.)
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from stlsgd.experiments import rundir
from stlsgd.experiments.config import load_config
from stlsgd.experiments.runner import run_experiment


def main(mode: str, out: str, config: str, overrides: list[str]) -> int:
    assert mode == "kill-before-summary"
    exp = load_config(config, overrides)

    def die(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if int(os.environ["RANK"]) == 0:
        rundir.write_final_params = die  # the first file written after the final checkpoint
    run_experiment(exp, Path(out), backend="dist", progress=False, checkpoint_every=5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
