"""Started by torchrun from the distributed tests: one process group, several configs through the CLI.

    torchrun --nproc_per_node=4 tests/distributed/dist_worker.py OUT_ROOT CONFIG...

Each config runs as ``stlsgd run CONFIG --backend dist --out OUT_ROOT/<config stem>``; the executor uses the
process group this script made (and leaves it alone), so one launch serves every config.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

from stlsgd.cli import main


def run(out_root: str, configs: list[str]) -> int:
    dist.init_process_group("gloo")
    try:
        for config in configs:
            code = main(
                ["run", config, "--backend", "dist", "--quiet", "--out", str(Path(out_root) / Path(config).stem)]
            )
            if code:
                return code
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], sys.argv[2:]))
