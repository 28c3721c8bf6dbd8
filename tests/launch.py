"""Launching ranks from a test: free loopback ports and the environment the launched processes get."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_env(**extra: str) -> dict[str, str]:
    """Environment for launched ranks: loopback only, one thread each, the repo's sources importable, and none
    of the launcher variables of a test run that is itself under torchrun."""
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        env.pop(key, None)
    env.update(
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")])),
    )
    env.update(extra)
    return env


def run_ranks(world: int, args: list[str | Path], timeout: float, **extra: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` as ``world`` ranks with the environment torchrun gives its ranks (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), without torchrun's agent: a process that imports
    torch (seconds of CPU) saved where the agent is not what a test is about (tests/distributed/ test torchrun
    itself: its agent ending a job, two nodes rendezvousing, a run resumed under it). The first non-zero exit
    status (else 0), and every rank's output, rank by rank."""
    port, cmd = str(free_port()), [PYTHON, *map(str, args)]
    ranks = [
        subprocess.Popen(
            cmd,
            cwd=REPO,
            env=launch_env(
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                **extra,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    try:
        outputs = [p.communicate(timeout=timeout) for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    code = next((p.returncode for p in ranks if p.returncode), 0)
    return subprocess.CompletedProcess(cmd, code, "".join(o for o, _ in outputs), "".join(e for _, e in outputs))
