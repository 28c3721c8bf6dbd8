"""A sweep killed while its workers are still starting leaves no orphan: each worker notices its parent is gone
when it comes up (the kernel's parent-death signal only covers a parent alive when it is asked for)."""

from __future__ import annotations

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


def test_workers_still_starting_end_when_the_sweep_is_killed(tmp_path: Path) -> None:
    config = tmp_path / "long.toml"
    config.write_text(SWEEP)
    fired = tmp_path / "fired"
    # The first worker to come up SIGKILLs the sweep, its parent, before it asks the kernel for the parent-death
    # signal ($STLSGD_FAULT, stlsgd.faults): the window a kill from outside could only hope to hit.
    env = {**os.environ, "STLSGD_FAULT": f"die-at=worker-start,once={fired},target=parent"}
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
        statuses = {pid: reap(pid, timeout=90) for pid in orphans}  # none outlives the sweep
    finally:
        subreaper(False)
    assert fired.is_file()
    # The worker that killed the sweep waited for its death, asked for the parent-death signal too late to get
    # it, found its parent gone and ended itself with status 1 (the other worker, started or not, ends either way).
    assert any(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 1 for s in statuses.values()), statuses
