"""Fixtures of the distributed tests: the session's private cache (tests/conftest.py; launched ranks inherit it
through the environment), and the shared launches (one per world size, ranks started with torchrun's environment)
whose runs the tests compare with the simulator."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from dist_jobs import JOBS, config_of, sets_of
from launch import REPO, run_ranks


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STLSGD_CACHE", str(private_cache))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)


def _claim_launch(tmp_path_factory: pytest.TempPathFactory, world: int) -> None:
    """Under pytest-xdist, fail when another worker has launched this world size too: the comparisons are meant
    to share one launch (tests/conftest.py groups them), and a broken grouping would double their cost unseen."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    run = tmp_path_factory.getbasetemp().parent  # shared by this run's workers
    (run / f"launch-world{world}-{worker}").touch()
    others = sorted(p.name for p in run.glob(f"launch-world{world}-*") if not p.name.endswith(f"-{worker}"))
    assert not others, f"{others}: the simulator comparisons were not kept on one xdist worker (--dist loadgroup)"


@pytest.fixture(scope="session")
def dist_runs(
    tmp_path_factory: pytest.TempPathFactory, shared_data: Path, private_cache: Path
) -> Callable[[int, str], Path]:
    """``dist_runs(world, job)``: the directory of ``job`` (dist_jobs.JOBS) after the launch of ``world`` ranks,
    which runs every job of that world size once per session, on the first request."""
    launched: dict[int, tuple[Path, subprocess.CompletedProcess]] = {}

    def get(world: int, name: str) -> Path:
        if world not in launched:
            _claim_launch(tmp_path_factory, world)
            root = tmp_path_factory.mktemp(f"dist{world}")
            jobs = [
                {
                    "name": job.name,
                    "mode": job.mode,
                    "config": str(config_of(job, root / "configs")),
                    "out": str(root / job.name),
                    "sets": sets_of(job, shared_data),
                }
                for job in JOBS[world]
            ]
            (root / "jobs.json").write_text(json.dumps(jobs, indent=1))
            result = run_ranks(
                world,
                [REPO / "tests" / "distributed" / "dist_worker.py", root / "jobs.json"],
                timeout=600,
                STLSGD_CACHE=str(private_cache),
            )
            launched[world] = root, result
        root, result = launched[world]
        assert result.returncode == 0, f"{result.args}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        out = root / name
        failed = sorted(out.glob("failed_rank*.txt"))
        assert not failed, "\n".join(f"{f.name}:\n{f.read_text()[-3000:]}" for f in failed)
        return out

    return get
