"""Process deaths in a sweep: a sweep killed outright (SIGKILL) leaves no worker computing on, and a killed
worker costs its runs one retry, not the sweep.

The kills come from inside the runs ($STLSGD_FAULT, :mod:`stlsgd.faults`, passed to the workers through the
sweep's environment) at a chosen round: no polling for the right instant, and no run can finish first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import children, reap, subreaper

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


def test_workers_end_when_the_sweep_is_killed(tmp_path: Path) -> None:
    config = tmp_path / "long.toml"
    config.write_text(SWEEP.format(max_iterations=10**9, lrs=[0.01, 0.02]))
    fired = tmp_path / "fired"
    # The first worker to finish round 3 SIGKILLs the sweep (its parent) and computes on until the kernel ends it.
    env = {**os.environ, "STLSGD_FAULT": f"die-after-round=3,once={fired},target=parent"}
    before = children(os.getpid())
    subreaper(True)  # the sweep's orphans become this process's children: it can wait for them
    try:
        sweep = subprocess.Popen(
            [sys.executable, "-m", "stlsgd", "sweep", str(config), "--jobs", "2", "--out", str(tmp_path / "out")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            assert sweep.wait(timeout=300) == -signal.SIGKILL
        finally:
            if sweep.poll() is None:
                sweep.kill()
        orphans = children(os.getpid()) - before
        statuses = {pid: reap(pid, timeout=30) for pid in orphans}
    finally:
        subreaper(False)
    assert fired.is_file()
    # The worker that was computing (and any other that had started its run) was ended by SIGTERM, the death
    # signal it asked the kernel for; the others (a worker still starting, the resource tracker) ended by
    # themselves. Either way none is left.
    terminated = [p for p, s in statuses.items() if os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGTERM]
    assert terminated and len(orphans - {os.getpid()}) >= 2, statuses  # two workers were started


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
