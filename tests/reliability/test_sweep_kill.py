"""Process deaths in a sweep: a sweep killed outright (SIGKILL) leaves no worker computing on, and a killed
worker costs its runs one retry, not the sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists(), reason="needs Linux /proc children lists"
)

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


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def _workers(pid: int) -> set[int]:
    """The sweep's worker processes: its children but multiprocessing's resource tracker."""
    return {c for c in _children(pid) if "resource_tracker" not in Path(f"/proc/{c}/cmdline").read_text()}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_end_when_the_sweep_is_killed(tmp_path: Path) -> None:
    config = tmp_path / "long.toml"
    config.write_text(SWEEP.format(max_iterations=10**9, lrs=[0.01, 0.02]))
    sweep = subprocess.Popen(
        [sys.executable, "-m", "stlsgd", "sweep", str(config), "--jobs", "2", "--out", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list((tmp_path / "out").glob("runs/*/metrics.jsonl"))) < 2:  # both workers are computing
            assert sweep.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        workers = _workers(sweep.pid)
        assert len(workers) == 2
    finally:
        sweep.send_signal(signal.SIGKILL)
        sweep.wait()
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [w for w in workers if _alive(w)]


def test_a_killed_worker_costs_its_runs_a_retry_not_the_sweep(tmp_path: Path) -> None:
    config = tmp_path / "quick.toml"
    config.write_text(SWEEP.format(max_iterations=300_000, lrs=[0.01, 0.02, 0.03]))
    sweep = subprocess.Popen(
        [sys.executable, "-m", "stlsgd", "sweep", str(config), "--jobs", "2", "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while len(list((tmp_path / "out").glob("runs/*/metrics.jsonl"))) < 1:
        assert sweep.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(min(_workers(sweep.pid)), signal.SIGKILL)
    output = sweep.communicate(timeout=300)[0].decode()
    assert sweep.returncode == 0, output
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["settings"]["lr"] for r in records if r["phase"] == "grid") == [0.01, 0.02, 0.03]
    assert all(r["status"] == "budget" for r in records), [r["error"] for r in records]
