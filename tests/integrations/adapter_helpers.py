"""Helpers of the adapter tests: launched ranks on loopback (as tests/distributed/dist_helpers.py), JSON results."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_env(**extra: str) -> dict[str, str]:
    """Environment for launched ranks: loopback only, one thread each, the repo's sources importable."""
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        env.pop(key, None)
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")])))
    env.update(extra)
    return env


def run(cmd: list[str | Path], timeout: float = 240, **env: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(c) for c in cmd], cwd=REPO, env=launch_env(**env), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    return result


def torchrun(script: Path, *args: str | Path, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    return run([TORCHRUN, f"--nproc_per_node={nproc}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}", script, *args])


def ranks(out: Path, world: int = 2) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
