"""Helpers for the distributed tests: in-process gloo groups on threads, free loopback ports, launch env."""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def on_thread_ranks(world: int, fn: Callable[[dist.ProcessGroup], Any], timeout_s: float = 20.0) -> list[Any]:
    """Run ``fn(group)`` on ``world`` threads, each a rank of a real gloo group over one in-memory store.

    Gloo runs its collectives outside the GIL, so threads stand in for processes without paying for
    process start-up; the groups are passed explicitly and never become torch's default group.
    """
    store = dist.HashStore()
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            group = dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=timeout_s))
            results[rank] = fn(group)
        except BaseException as exc:  # re-raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    if errors:
        raise errors[0]
    return results


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_env(**extra: str) -> dict[str, str]:
    """Environment for launched ranks: loopback only, one thread each, the repo's sources importable."""
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")])))
    env.update(extra)
    return env
