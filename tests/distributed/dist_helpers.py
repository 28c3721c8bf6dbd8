"""Helpers for the distributed tests: in-process gloo groups on threads; launching (tests/launch.py) re-exported."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from launch import PYTHON, REPO, TORCHRUN, free_port, launch_env, run_ranks  # noqa: F401  (re-exported to the tests)


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


def launch_worker(script: str, out: Any, nproc: int = 2, timeout_s: float = 240) -> Any:
    """Run ``tests/distributed/<script> OUT`` as ``nproc`` ranks started as torchrun starts them (tests/launch.py);
    the finished processes."""
    return run_ranks(nproc, [REPO / "tests" / "distributed" / script, out], timeout=timeout_s)
