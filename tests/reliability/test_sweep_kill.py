"""Process deaths in a sweep: a sweep killed outright (SIGKILL) leaves no worker computing on, whether they were
computing or still starting, and a killed worker costs its runs one retry, not the sweep.

The kills come from inside the workers ($STLSGD_FAULT, :mod:`stlsgd.faults`, passed to them through the sweep's
environment) at a chosen instant: no polling for the right one, and no run can finish first. The sweep's orphans
become this process's children (a child subreaper), and their ends are waited for on pidfds.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.launch,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux (child subreaper, pidfd)"),
]

SWEEP = """
name = "kill"
[base.data]
dataset = "digits49"
num_clients = 8
[base.run]
target_gap = 1e-12
max_iterations = {max_iterations}
[[methods]]
method = "local_sgd"
grid = {{ lr = {lrs}, k = [1000] }}
"""


PR_SET_CHILD_SUBREAPER = 36


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def subreaper(on: bool) -> None:
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0


def reap(pid: int, timeout: float) -> int:
    """Wait (no polling: a pidfd) until child ``pid`` ends; its wait status."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"process {pid} still runs {timeout} s after its parent died"
    finally:
        os.close(fd)
    return os.waitpid(pid, 0)[1]


def _orphans_of_a_killed_sweep(tmp_path: Path, fault: str, timeout: float) -> dict[int, int]:
    """Run ``stlsgd sweep --jobs 2`` of two runs too long to finish with ``$STLSGD_FAULT=fault``, which must
    SIGKILL the sweep; the wait status of each process it left behind (its workers, multiprocessing's resource
    tracker), each reaped within ``timeout`` seconds of the sweep's death."""
    config, out = tmp_path / "long.toml", tmp_path / "out"
    config.write_text(SWEEP.format(max_iterations=10**9, lrs=[0.01, 0.02]))
    before = children(os.getpid())
    subreaper(True)  # the sweep's orphans become this process's children: it can wait for them
    try:
        sweep = subprocess.Popen(
            [sys.executable, "-m", "stlsgd", "sweep", str(config), "--jobs", "2", "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "STLSGD_FAULT": fault},
        )
        try:
            assert sweep.wait(timeout=300) == -signal.SIGKILL
        finally:
            if sweep.poll() is None:
                sweep.kill()
        orphans = children(os.getpid()) - before
        return {pid: reap(pid, timeout) for pid in orphans}
    finally:
        subreaper(False)


def test_workers_end_when_the_sweep_is_killed(tmp_path: Path) -> None:
    fired = tmp_path / "fired"
    # The first worker to finish round 3 SIGKILLs the sweep (its parent) and computes on until the kernel ends it.
    statuses = _orphans_of_a_killed_sweep(tmp_path, f"die-after-round=3,once={fired},target=parent", timeout=30)
    assert fired.is_file()
    # The worker that was computing (and any other that had started its run) was ended by SIGTERM, the death
    # signal it asked the kernel for; the others (a worker still starting, the resource tracker) ended by
    # themselves. Either way none is left.
    terminated = [p for p, s in statuses.items() if os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGTERM]
    assert terminated and len(set(statuses) - {os.getpid()}) >= 2, statuses  # two workers were started


def test_workers_still_starting_end_when_the_sweep_is_killed(tmp_path: Path) -> None:
    fired = tmp_path / "fired"
    # The first worker to come up SIGKILLs the sweep, its parent, before it asks the kernel for the parent-death
    # signal: the window a kill from outside could only hope to hit (the kernel's signal only covers a parent
    # alive when it is asked for, so each worker checks its parent once it has asked).
    statuses = _orphans_of_a_killed_sweep(tmp_path, f"die-at=worker-start,once={fired},target=parent", timeout=90)
    assert fired.is_file()
    # The worker that killed the sweep waited for its death, asked for the parent-death signal too late to get
    # it, found its parent gone and ended itself with status 1 (the other worker, started or not, ends either way).
    assert any(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 1 for s in statuses.values()), statuses


def test_a_killed_worker_costs_its_runs_a_retry_not_the_sweep(tmp_path: Path) -> None:
    config = tmp_path / "quick.toml"
    config.write_text(SWEEP.format(max_iterations=20_000, lrs=[0.01, 0.02, 0.03]))
    fired = tmp_path / "fired"
    # The first worker to finish round 3 dies (SIGKILL); the retries run through (the fault fires once).
    env = {**os.environ, "STLSGD_FAULT": f"die-after-round=3,once={fired}"}
    sweep = subprocess.run(
        [sys.executable, "-m", "stlsgd", "sweep", str(config), "--jobs", "2", "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        timeout=300,
    )
    output = sweep.stdout.decode()
    assert sweep.returncode == 0, output
    assert fired.is_file()
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["settings"]["lr"] for r in records if r["phase"] == "grid") == [0.01, 0.02, 0.03]
    assert all(r["status"] == "budget" for r in records), [r["error"] for r in records]
