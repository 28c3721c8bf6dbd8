"""A sweep killed while its workers are still starting leaves no orphan: each worker notices its parent is gone
when it comes up (the kernel's parent-death signal only covers a parent alive when it is asked for)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

SWEEP = """
name = "orphans"
[base.data]
dataset = "digits49"
num_clients = 8
[base.run]
target_gap = 1e-12
max_iterations = 1000000000
[[methods]]
method = "local_sgd"
grid = { lr = [0.01, 0.02], k = [1000] }
"""


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def _workers(pid: int) -> set[int]:
    """The sweep's worker processes: its children but multiprocessing's resource tracker."""
    found = set()
    for c in _children(pid):
        try:
            if "resource_tracker" not in Path(f"/proc/{c}/cmdline").read_text():
                found.add(c)
        except FileNotFoundError:
            pass
    return found


def _has_queues(pid: int) -> bool:
    try:
        return "/dev/shm/sem.mp-" in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_workers_still_starting_end_when_the_sweep_is_killed(tmp_path: Path) -> None:
    config = tmp_path / "long.toml"
    config.write_text(SWEEP)
    sweep = subprocess.Popen(
        [sys.executable, "-m", "stlsgd", "sweep", str(config), "--jobs", "2", "--out", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Kill the sweep the moment a worker has opened the pool's queues (their semaphores are mapped) while it
        # still imports the run's modules (seconds), long before it could ask for the parent-death signal. (A
        # worker killed even earlier dies by itself: its parent's semaphores are gone.)
        deadline = time.monotonic() + 120
        while not (workers := {w for w in _workers(sweep.pid) if _has_queues(w)}):
            assert sweep.poll() is None and time.monotonic() < deadline
            time.sleep(0.002)
        workers |= _workers(sweep.pid)
        pidfds = [os.pidfd_open(w) for w in workers]
    finally:
        sweep.send_signal(signal.SIGKILL)
        sweep.wait()
    try:
        for fd in pidfds:  # readable once that process has ended
            ready, _, _ = select.select([fd], [], [], 90)
            assert ready, "a worker outlived the killed sweep (an orphan)"
    finally:
        for fd in pidfds:
            os.close(fd)
        for w in workers:  # an orphan left by a failure must not linger
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass
