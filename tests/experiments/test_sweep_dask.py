"""`stlsgd sweep --cluster`: a real `dask scheduler` and two `dask worker` processes on loopback run a small
sweep to the local pool's `best.json`, and a worker killed in the middle of a run loses and duplicates nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import distributed
import pytest

from stlsgd.cli import main
from stlsgd.experiments.sweeps import load_sweep, read_results

SWEEP = """
name = "dask_small"
seeds = [0, 1]

[base.data]
dataset = "a9a"
num_clients = 8
partition = "shared"

[base.run]
target_gap = 1e-2
max_rounds = 3000

[[methods]]
method = "local_sgd"
label = "Local SGD"
grid = { lr = [0.4, 0.002], k = [20] }
fixed = { lr_decay = 1e-2 }

[[methods]]
method = "stl_sc"
label = "STL-SGD^sc"
grid = { lr = [0.4], k = [200, 100] }
fixed = { lr_T1 = 0.1 }
"""


def _dask(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("dask")), *args]


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dask") / "small.toml"
    path.write_text(SWEEP)
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A scheduler and two one-thread workers on 127.0.0.1; yields its address and the kill hook's marker
    (the hook is armed by deleting the marker)."""
    root = tmp_path_factory.mktemp("cluster")
    scheduler_file, marker = root / "scheduler.json", root / "kill-once"
    marker.touch()  # disarmed
    # $STLSGD_FAULT (stlsgd.faults): the first run past round 1 once the marker is gone kills its worker process.
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        "STLSGD_FAULT": f"die-after-round=1,once={marker}",
    }
    procs = [
        subprocess.Popen(
            _dask(
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(scheduler_file),
            ),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    _dask(
                        "worker",
                        "--scheduler-file",
                        str(scheduler_file),
                        "--nthreads",
                        "1",
                        "--host",
                        "127.0.0.1",
                        "--no-dashboard",
                        "--death-timeout",
                        "60",
                    ),
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        # The client waits for the scheduler file, then for both workers (bounded).
        with distributed.Client(scheduler_file=str(scheduler_file), timeout=120) as client:
            client.wait_for_workers(2, timeout=120)
            address = client.scheduler.address
        yield address, marker
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def local_best(config: Path, tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> dict:
    out = tmp_path_factory.mktemp("local") / "out"
    assert (
        main(["sweep", str(config), "--out", str(out), "--jobs", "2", "--quiet", "--data-dir", str(shared_data)]) == 0
    )
    return json.loads((out / "best.json").read_text())


def _chosen(best: dict) -> dict:
    """What a sweep decides: per row the chosen setting and each seed's rounds to target."""
    return {
        label: (m["settings"], m["median"], {s: r["rounds_to_target"] for s, r in m["seeds"].items()})
        for label, m in best["methods"].items()
    }


def _check_complete(config: Path, out: Path) -> None:
    """Every grid setting and seed rerun recorded exactly once, none failed, each with its run's files here."""
    sweep = load_sweep(config)
    records = read_results(out)
    seen = [(r["label"], r["key"]) for r in records]
    assert len(seen) == len(set(seen)), "a run was recorded twice"
    assert {(s.label, s.key) for s in sweep.grid} <= set(seen)
    assert len([r for r in records if r["phase"] == "seed"]) == len(sweep.labels) * (len(sweep.seeds) - 1)
    assert not [r for r in records if r["status"] == "failed"], [r["error"] for r in records]
    for r in records:
        assert (out / r["run_dir"] / "summary.json").is_file() and (out / r["run_dir"] / "final_params.npz").is_file()


def test_sweep_on_a_dask_cluster_chooses_what_the_local_pool_chooses(
    cluster: tuple[str, Path], config: Path, local_best: dict, tmp_path: Path, shared_data: Path
) -> None:
    address, _ = cluster
    out = tmp_path / "out"
    args = ["sweep", str(config), "--out", str(out), "--cluster", address, "--quiet", "--data-dir", str(shared_data)]
    assert main(args) == 0
    best = json.loads((out / "best.json").read_text())
    assert best["complete"] and _chosen(best) == _chosen(local_best)
    _check_complete(config, out)


def test_a_rows_bundles_on_two_workers_prune_each_other(
    cluster: tuple[str, Path], tmp_path: Path, shared_data: Path
) -> None:
    """One row of two settings goes out as two bundles, one a worker: the run that cannot reach the target in
    its budget hears of the other's round through the cluster's bounds, read from the bundle's own run threads,
    and is pruned instead of running to its budget."""
    address, _ = cluster
    config = tmp_path / "row.toml"
    # A budget the slow run would take many seconds to spend, far longer than the bounds take to arrive.
    config.write_text(SWEEP.split("[[methods]]")[0].replace("max_rounds = 3000", "max_rounds = 100000") + ROW)
    out = tmp_path / "out"
    args = ["sweep", str(config), "--out", str(out), "--cluster", address, "--quiet", "--data-dir", str(shared_data)]
    assert main(args) == 0
    grid = {r["settings"]["lr"]: r for r in read_results(out) if r["phase"] == "grid"}
    assert grid[0.4]["status"] == "reached"
    assert grid[1e-5]["status"] == "pruned" and grid[1e-5]["rounds"] >= grid[0.4]["rounds_to_target"]


ROW = """
[[methods]]
method = "local_sgd"
label = "Local SGD"
grid = { lr = [0.4, 1e-5], k = [20] }
fixed = { lr_decay = 1e-2 }
"""


def test_a_worker_killed_in_a_run_loses_and_duplicates_nothing(
    cluster: tuple[str, Path], config: Path, local_best: dict, tmp_path: Path, shared_data: Path
) -> None:
    address, marker = cluster
    marker.unlink()  # arm: the next run to start kills its own worker process
    out = tmp_path / "out"
    args = ["sweep", str(config), "--out", str(out), "--cluster", address, "--quiet", "--data-dir", str(shared_data)]
    assert main(args) == 0
    assert marker.exists(), "no worker was killed"
    best = json.loads((out / "best.json").read_text())
    assert best["complete"] and _chosen(best) == _chosen(local_best)
    _check_complete(config, out)


def test_bad_cluster_address_is_one_line(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(config), "--out", str(tmp_path / "o"), "--cluster", "local:0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stlsgd: error: --cluster local:0: local:N needs a number of workers N >= 1, e.g. local:4"]
    assert not (tmp_path / "o").exists()


def test_unreachable_cluster_is_one_line_and_writes_nothing(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from stlsgd.experiments.sweeps import cluster

    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 2)
    out = tmp_path / "o"
    assert main(["sweep", str(config), "--out", str(out), "--cluster", "tcp://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stlsgd: error: --cluster tcp://127.0.0.1:9: cannot reach"), err
    assert not out.exists()


def test_a_killed_submitting_process_is_resumed_by_the_same_command(
    cluster: tuple[str, Path], config: Path, local_best: dict, tmp_path: Path, shared_data: Path
) -> None:
    address, _ = cluster
    out = tmp_path / "out"
    args = ["sweep", str(config), "--out", str(out), "--cluster", address, "--quiet", "--data-dir", str(shared_data)]
    # The submitting process kills itself once it has recorded its first result ($STLSGD_FAULT): a known instant,
    # neither before any run finished nor after the sweep did, on a machine of any speed. The cluster's workers
    # run on (their environment is the cluster's).
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        "STLSGD_FAULT": "die-after-record=1",
    }
    first = subprocess.run([sys.executable, "-m", "stlsgd", *args], env=env, stderr=subprocess.DEVNULL, timeout=300)
    assert first.returncode == -signal.SIGKILL
    done = len(read_results(out))
    assert done == 1
    assert main(args) == 0
    best = json.loads((out / "best.json").read_text())
    assert best["complete"] and _chosen(best) == _chosen(local_best)
    _check_complete(config, out)


def test_a_worker_keeps_a_runs_buffers_instead_of_mapping_them_afresh_every_round() -> None:
    """Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, which also fixes glibc's mmap threshold at
    128 KiB: a 1 MiB buffer freed and allocated again is mapped afresh, and each of its pages faulted in, every
    time. A run on a worker sets glibc's thresholds back first; the page faults of 200 such buffers show it."""
    probe = (
        "import resource, numpy as np\n"
        "from stlsgd.experiments.sweeps.cluster import undo_dask_malloc_trim\n"
        "def faults():\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    for _ in range(200):\n"
        "        np.ones(1 << 17)\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
        "as_dask_starts_it = faults()\n"
        "assert undo_dask_malloc_trim() and not undo_dask_malloc_trim()  # once per process\n"
        "faults()\n"
        "print(as_dask_starts_it, faults())\n"
    )
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    as_dask_starts_it, after = map(int, out.stdout.split())
    assert as_dask_starts_it >= 200 * 256  # every 1 MiB buffer's 256 pages, every time
    assert after < 256  # mapped once, then reused
