"""benchmarks/gpu_check.py keeps working without a GPU: its CPU dry run of the same four steps.

- the dry run (tiny sizes, gloo with 2 ranks) passes every step and records real figures: versions first,
  images/s of both models, a stage of the Table 3 STL-SGD row on synthetic CIFAR-shaped images (the data dir
  holds a9a only, as a fresh GPU machine may), the column's extrapolation, and torchrun --backend dist
  against the simulator on a9a, bit for bit;
- a failing step is recorded with its error, the next step still runs, and the exit status is 1.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.launch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
SWEEP = REPO / "configs" / "paper" / "table3_resnet18_iid.toml"


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    # The script makes the repo's src/ importable for itself and its subprocesses; nothing to add here.
    env.update(GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1", STLSGD_CACHE=str(tmp_path / "cache"))
    return env


def _run(tmp_path: Path, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), *args],
        cwd=REPO,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    report = json.loads((out / "gpu_check.json").read_text())
    return proc, report


def test_dry_run_passes_every_step_with_real_figures(tmp_path: Path, shared_data: Path) -> None:
    data = tmp_path / "data"
    (data / "a9a").mkdir(parents=True)
    (data / "a9a" / "a9a.gz").symlink_to(shared_data / "a9a" / "a9a.gz")
    proc, report = _run(tmp_path, "--data-dir", str(data))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    # Step 0 first: the versions are the first thing printed and recorded.
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("== step 0") and lines[1].startswith(f"torch {torch.__version__}")
    assert proc.stdout.index("GPUs:") < proc.stdout.index("== step 1")
    assert report["mode"] == "dry-run" and report["passed"] is True and report["failed_steps"] == []
    assert report["versions"]["torch"] == torch.__version__ and report["versions"]["python"]
    assert report["device"]["cpu_count"] == os.cpu_count()
    steps = report["steps"]
    assert list(steps) == ["versions", "vmap_vs_loop", "stage_run", "dist_vs_sim"]
    assert all(s["passed"] and s["error"] is None for s in steps.values()), {k: s["error"] for k, s in steps.items()}
    assert [s["step"] for s in steps.values()] == [0, 1, 2, 3]

    # Step 1: both models timed both ways, the same update from one step.
    models = steps["vmap_vs_loop"]["models"]
    assert set(models) == {"resnet18", "cnn"}
    for m in models.values():
        assert m["vmap_images_per_s"] > 0 and m["loop_images_per_s"] > 0
        assert math.isclose(m["ratio_vmap_over_loop"], m["vmap_images_per_s"] / m["loop_images_per_s"])
        assert m["update_rel_diff"] <= m["update_rel_tol"]

    # Step 2: the STL row's first grid setting, on synthetic images (no CIFAR in the data dir), extrapolated.
    st = steps["stage_run"]
    sweep = tomllib.loads(SWEEP.read_text())
    row = next(m for m in sweep["methods"] if m["method"].startswith("stl"))
    assert st["row"] == row["label"] and st["grid_setting"] == {k: v[0] for k, v in row["grid"].items()}
    assert st["data_source"] == "synthetic" and "python -m stlsgd run" in st["command"]
    assert st["summary"]["status"] == "budget" and st["iterations_run"] == st["iterations_cap"] > 0
    assert st["T1"] == math.ceil(row["grid"]["T1_epochs"][0] * st["images"] / (st["clients"] * st["batch"]))
    assert st["seconds_per_iteration"] > 0 and st["time_per_epoch_s"] > 0 and st["eval_time_s"] > 0
    grid_runs = sum(math.prod(len(v) for v in m["grid"].values()) for m in sweep["methods"])
    assert st["column"]["runs"] == grid_runs + (len(sweep["seeds"]) - 1) * len(sweep["methods"])
    assert math.isclose(st["column_time_s"], st["time_per_epoch_s"] * st["column"]["epochs"])
    sync = next(r for r in st["column"]["rows"] if r["label"] == "SyncSGD")
    base = sweep["base"]
    assert math.isclose(
        sync["epochs"],
        len(list(itertools.product(*sweep["methods"][0]["grid"].values())))
        * base["run"]["max_iterations"]
        * base["data"]["num_clients"]
        * base["algorithm"]["batch"]
        / 50_000,
    )

    # Step 3: torchrun --backend dist (gloo, 2 ranks) vs the simulator on a9a: bit for bit.
    dv = steps["dist_vs_sim"]
    assert dv["dataset"] == "a9a" and dv["comm_backend"] == "gloo" and dv["nproc"] == 2
    run = dv["runs"]["a9a"]
    assert run["passed"], run["error"]
    for key in ("status", "rounds", "iterations", "stages", "rounds_to_target", "bytes"):
        assert run["compared"][key]["equal"], key
    assert run["dist_backend"] == {"executor": "dist", "comm": "gloo", "world_size": 2}
    assert "torch.distributed.run --nproc_per_node=2" in run["dist_command"]
    assert run["params_max_rel_diff"] == 0.0 and run["final_objective"]["rel_diff"] == 0.0


def test_a_failing_step_is_recorded_and_the_next_still_runs(tmp_path: Path) -> None:
    proc, report = _run(tmp_path, "--steps", "2,1", "--sweep", str(tmp_path / "missing.toml"), timeout=120)
    assert proc.returncode == 1
    assert list(report["steps"]) == ["versions", "stage_run", "vmap_vs_loop"]
    assert report["steps"]["stage_run"]["passed"] is False and "missing.toml" in report["steps"]["stage_run"]["error"]
    assert report["steps"]["vmap_vs_loop"]["passed"] is True
    assert report["passed"] is False and report["failed_steps"] == ["stage_run"]
    assert "FAILED: stage_run" in proc.stdout
