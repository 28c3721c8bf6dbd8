"""benchmarks/gpu_check.py keeps working without a GPU: its CPU dry run of the same four steps.

- the dry run (tiny sizes, gloo with 2 ranks) passes every step and records real figures: versions first,
  images/s of both models, a stage of the Table 3 STL-SGD row on synthetic CIFAR-shaped images (the data dir
  holds a9a only, as a fresh GPU machine may), the column's extrapolation, and torchrun --backend dist
  against the simulator on a9a, bit for bit. The script's ``main`` runs in this process, and so do the
  ``python -m stlsgd ...`` commands it launches (the same argument lists, through ``stlsgd.cli.main``): the
  one launch is the torchrun job, the one thing that needs processes of its own;
- a failing step is recorded with its error, the next step still runs, and the exit status is 1;
- the column's count of a run at its budget (images, iterations, evaluations), on hand-computed numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import pytest
import torch

from stlsgd import cli
from stlsgd.experiments.config import validate

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
SWEEP = REPO / "configs" / "paper" / "table3_resnet18_iid.toml"


@pytest.fixture(scope="module")
def gpu_check() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def in_process(gpu_check: ModuleType) -> Any:
    """A launcher for ``main``: ``python -m stlsgd ARGS`` through ``stlsgd.cli.main(ARGS)`` here, with the
    environment variables the script sets for it; any other command (torchrun) launched as the script does."""

    def launch(cmd: list[Any], *, timeout: float, env: dict[str, str], log: Path) -> Any:
        args = [str(c) for c in cmd]
        if args[:3] != [sys.executable, "-m", "stlsgd"]:
            return gpu_check.run_cmd(cmd, timeout=timeout, env=env, log=log)
        t0 = time.perf_counter()
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
            with mock.patch.dict(os.environ, {"STLSGD_CACHE": env["STLSGD_CACHE"]}):
                rc = cli.main(args[3:])
        return gpu_check.Launched(" ".join(args), rc, False, time.perf_counter() - t0, log.read_text(), str(log))

    return launch


@pytest.mark.launch
def test_dry_run_passes_every_step_with_real_figures(
    gpu_check: ModuleType, tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    (data / "a9a").mkdir(parents=True)
    (data / "a9a" / "a9a.gz").symlink_to(shared_data / "a9a" / "a9a.gz")
    threads = torch.get_num_threads()
    rc = gpu_check.main(["--dry-run", "--out", str(tmp_path / "out"), "--data-dir", str(data)], in_process(gpu_check))
    stdout = capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert rc == 0, stdout[-4000:]
    assert torch.get_num_threads() == threads  # the dry run's one thread is put back

    # Step 0 first: the versions are the first thing printed and recorded.
    lines = stdout.splitlines()
    assert lines[0].startswith("== step 0") and lines[1].startswith(f"torch {torch.__version__}")
    assert stdout.index("GPUs:") < stdout.index("== step 1")
    assert report["mode"] == "dry-run" and report["passed"] is True and report["failed_steps"] == []
    assert report["versions"]["torch"] == torch.__version__ and report["versions"]["python"]
    assert report["device"]["cpu_count"] == os.cpu_count()
    steps = report["steps"]
    assert list(steps) == ["versions", "vmap_vs_loop", "stage_run", "dist_vs_sim", "repeatable"]
    assert all(s["passed"] and s["error"] is None for s in steps.values()), {k: s["error"] for k, s in steps.items()}
    assert [s["step"] for s in steps.values()] == [0, 1, 2, 3, 4]

    # Step 1: both models timed both ways, the same update from one step.
    models = steps["vmap_vs_loop"]["models"]
    assert set(models) == {"resnet18", "cnn"}
    for m in models.values():
        assert m["vmap_images_per_s"] > 0 and m["loop_images_per_s"] > 0
        assert math.isclose(m["ratio_vmap_over_loop"], m["vmap_images_per_s"] / m["loop_images_per_s"])
        assert m["update_rel_diff"] <= m["update_rel_tol"]

    # Step 2: the STL row's first grid setting, on synthetic images (no CIFAR in the data dir), extrapolated
    # over the column (in the dry run: each row's first grid setting).
    st = steps["stage_run"]
    sweep = tomllib.loads(SWEEP.read_text())
    row = next(m for m in sweep["methods"] if m["method"].startswith("stl"))
    assert st["row"] == row["label"] and st["grid_setting"] == {k: v[0] for k, v in row["grid"].items()}
    assert st["data_source"] == "synthetic" and f"{sys.executable} -m stlsgd run " in st["command"]
    assert st["summary"]["status"] == "budget" and st["iterations_run"] == st["iterations_cap"] > 0
    assert st["T1"] == math.ceil(row["grid"]["T1_epochs"][0] * st["images"] / (st["clients"] * st["batch"]))
    assert st["seconds_per_iteration"] > 0 and st["time_per_epoch_s"] > 0 and st["eval_time_s"] > 0
    assert report["sizes"]["column_settings"] == 1
    assert st["column"]["runs"] == len(sweep["methods"]) * len(sweep["seeds"])
    assert math.isclose(st["column_time_s"], st["time_per_epoch_s"] * st["column"]["epochs"])
    sync = next(r for r in st["column"]["rows"] if r["label"] == "SyncSGD")
    base = sweep["base"]
    epochs = base["run"]["max_iterations"] * base["data"]["num_clients"] * base["algorithm"]["batch"] / 50_000
    assert math.isclose(sync["epochs"], epochs)

    # Step 3: torchrun --backend dist (gloo, 2 ranks) vs the simulator on a9a: bit for bit.
    dv = steps["dist_vs_sim"]
    assert dv["dataset"] == "a9a" and dv["comm_backend"] == "gloo" and dv["nproc"] == 2
    for key in ("status", "rounds", "iterations", "stages", "rounds_to_target", "bytes"):
        assert dv["compared"][key]["equal"], key
    assert dv["dist_backend"] == {"executor": "dist", "comm": "gloo", "world_size": 2}
    assert "torch.distributed.run --nproc_per_node=2" in dv["dist_command"]
    assert dv["params_max_rel_diff"] == 0.0 and dv["final_objective"]["rel_diff"] == 0.0

    # Step 4: the network run twice, bit for bit.
    rp = steps["repeatable"]
    assert rp["config"]["problem"]["model"] == "cnn" and set(rp["runs"]) == {"first", "second"}
    assert rp["checks"] and all(rp["checks"].values()) and rp["params_max_rel_diff"] == 0.0
    assert rp["params_rel_diff_per_array"] and rp["objective_rel_diff_per_evaluation"]
    assert rp["final_objective"]["first"] == rp["final_objective"]["second"] is not None


def test_runs_that_differ_fail_the_repeatability_step(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a GPU with nondeterministic kernels does, made by hand: one array of the second run's final parameters
    # moved by one ulp (its evaluations stay the same, so only the parameters can tell).
    import numpy as np

    launch = in_process(gpu_check)

    def perturbing(cmd: list[Any], **kw: Any) -> Any:
        res = launch(cmd, **kw)
        out = Path(str(cmd[cmd.index("--out") + 1]))
        if out.name == "second":
            with np.load(out / "final_params.npz") as f:
                arrays = {k: f[k] for k in f.files}
            last = sorted(k for k, v in arrays.items() if v.dtype.kind == "f")[-1]
            arrays[last] = np.nextafter(arrays[last], np.inf)
            np.savez(out / "final_params.npz", **arrays)
        return res

    rc = gpu_check.main(["--dry-run", "--out", str(tmp_path / "out"), "--steps", "4"], perturbing)
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    rp = report["steps"]["repeatable"]
    assert rc == 1 and report["failed_steps"] == ["repeatable"]
    assert rp["error"] == "differs: params within rtol" and [k for k, ok in rp["checks"].items() if not ok] == [
        "params within rtol"
    ]
    assert 0.0 < rp["params_max_rel_diff"] < 1e-6  # one float32 ulp
    assert sum(d > 0 for d in rp["params_rel_diff_per_array"].values()) == 1
    assert "DIFFERENT: params within rtol" in capsys.readouterr().out


def test_a_failing_step_is_recorded_and_the_next_still_runs(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Step 1 with the small CNN alone: the next step only has to run (both models run in the test above).
    dry = gpu_check.SIZES["dry-run"]
    monkeypatch.setitem(gpu_check.SIZES, "dry-run", dataclasses.replace(dry, bench={"cnn": dry.bench["cnn"]}))
    out = tmp_path / "out"
    rc = gpu_check.main(["--dry-run", "--out", str(out), "--steps", "2,1", "--sweep", str(tmp_path / "missing.toml")])
    report = json.loads((out / "gpu_check.json").read_text())
    assert rc == 1
    assert list(report["steps"]) == ["versions", "stage_run", "vmap_vs_loop"]
    assert report["steps"]["stage_run"]["passed"] is False and "missing.toml" in report["steps"]["stage_run"]["error"]
    assert report["steps"]["vmap_vs_loop"]["passed"] is True and list(report["steps"]["vmap_vs_loop"]["models"]) == [
        "cnn"
    ]
    assert report["passed"] is False and report["failed_steps"] == ["stage_run"]
    assert "FAILED: stage_run" in capsys.readouterr().out


def _experiment(method: dict[str, Any], run: dict[str, Any]) -> Any:
    config = {"data": {"dataset": "cifar10", "num_clients": 8}, "problem": {"kind": "net"}}
    return validate({**config, "algorithm": method, "run": run}, "test")


@pytest.mark.parametrize(
    ("method", "run", "expected"),
    [
        # SyncSGD, 100 iterations of 8 x 64 images; evaluations at iterations 49 and 98, and the last at 100.
        (
            {"method": "sync_sgd", "batch": 64},
            {"max_iterations": 100, "eval_every": 10**6, "eval_every_iterations": 49},
            (100 * 8 * 64, 100, 3),
        ),
        # Local SGD, k = 3, budget 10: rounds of 3, 3, 3 and 1 (cut at the budget); every 2nd round evaluated.
        ({"method": "local_sgd", "k": 3}, {"max_iterations": 10, "eval_every": 2}, (10 * 8, 10, 2)),
        # CR-PSGD, the batch doubling every step up to 8: 1 + 2 + 4 + 8 + 8 images per client, every step evaluated.
        (
            {"method": "cr_psgd", "rho": 2.0, "max_batch": 8, "grow": "step"},
            {"max_iterations": 5, "eval_every": 1},
            (23 * 8, 5, 5),
        ),
    ],
)
def test_a_run_at_its_budget_is_counted_as_its_plan_runs(
    gpu_check: ModuleType, method: dict[str, Any], run: dict[str, Any], expected: tuple[int, int, int]
) -> None:
    assert gpu_check.run_usage(_experiment(method, run), 50_000) == expected


COLUMN = """
name = "column"
seeds = [0, 1]
[base.data]
dataset = "cifar10"
num_clients = 8
[base.problem]
kind = "net"
[base.run]
seed = 0
max_iterations = 100
[[methods]]
method = "sync_sgd"
grid = { lr = [0.1, 0.2] }
[[methods]]
method = "local_sgd"
grid = { k = [2, 4, 5] }
"""


def test_the_column_counts_every_grid_run_and_every_extra_seed_at_its_budget(
    gpu_check: ModuleType, tmp_path: Path
) -> None:
    from stlsgd.experiments.sweeps import load_sweep

    (tmp_path / "column.toml").write_text(COLUMN)
    column = gpu_check.column_budget(load_sweep(tmp_path / "column.toml"), 800)
    # 2 + 3 grid runs and, with 2 seeds, one rerun of each row; every run is 100 iterations x 8 clients x 1 image
    # = 1 epoch of 800. Evaluations: SyncSGD every round (100); Local SGD every round of k = 2, 4, 5 (50, 25, 20),
    # the rerun counted as the row's costliest run (all alike in images: the first, k = 2).
    assert column["runs"] == 7
    assert [(r["label"], r["grid_runs"], r["seed_reruns"]) for r in column["rows"]] == [
        ("sync_sgd", 2, 1),
        ("local_sgd", 3, 1),
    ]
    assert [r["epochs"] for r in column["rows"]] == [3.0, 4.0] and column["epochs"] == 7.0
    assert [r["evaluations"] for r in column["rows"]] == [300, 145] and column["evaluations"] == 445


@pytest.mark.parametrize(
    ("mode", "present", "expected"),
    [
        # The config's own CIFAR-10 when the data dir holds its five batches (max_samples 8 cuts it).
        ("dry-run", "cifar10", ("cifar10", "cifar10", 8)),
        # cifar10-png200 when its 200 images hold one iteration (the dry run: 2 clients x 2 images) ...
        ("dry-run", "cifar10-png200", ("cifar10-png200", "cifar10-png200", 8)),
        # ... but not on a GPU, where budgets and T1 count epochs of 50,000 images: synthetic ones instead.
        ("gpu", "cifar10-png200", ("synthetic", "cifar10", 8)),
        ("dry-run", None, ("synthetic", "cifar10", 8)),
    ],
)
def test_the_stage_runs_on_the_config_s_data_else_a_stand_in_that_fits(
    gpu_check: ModuleType, tmp_path: Path, mode: str, present: str | None, expected: tuple[str, str, int]
) -> None:
    from stlsgd.data.registry import DATASETS

    data = tmp_path / "data"
    for rel in DATASETS[present].paths if present else ():
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_bytes(b"")  # only their presence is looked at
    data.mkdir(exist_ok=True)
    args = gpu_check.parse_args(["--out", str(tmp_path / "out"), "--data-dir", str(data)])
    check = gpu_check.make_check(args, mode, "", gpu_check.run_cmd)
    check.sizes = dataclasses.replace(check.sizes, synthetic_images=10)
    chosen = gpu_check.stage_data(check, "cifar10", per_iteration=4, limit=8)
    assert (chosen.source, chosen.dataset, chosen.images) == expected
    if chosen.synthetic:  # written where the registry looks for cifar10, and readable as such
        assert gpu_check.dataset_present(chosen.data_dir, "cifar10")
        assert DATASETS["cifar10"].load(chosen.data_dir).X.shape == (10, 3, 32, 32)
