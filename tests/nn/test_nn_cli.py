"""End to end: `stlsgd run` and `stlsgd sweep` on tiny non-convex configs (CIFAR PNG subset, MNIST)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stlsgd.cli import main
from stlsgd.experiments.sweeps import read_results

PNG_RUN = """
name = "nc_png"
[data]
dataset = "cifar10-png200"
num_clients = 4
partition = "noniid"
s = 0
[problem]
kind = "net"
model = "cnn"
device = "cpu"
eval_batch = 64
[algorithm]
method = "stl_nc"
option = 1
lr = 0.05
batch = 8
k = 2
gamma = 100
T1 = 2
[run]
target_accuracy = 0.99
max_rounds = 3
"""

MNIST_SWEEP = """
name = "nc_mnist"
[base.data]
dataset = "mnist10"
max_samples = 96
num_clients = 4
[base.problem]
kind = "net"
device = "cpu"
[base.algorithm]
batch = 8
[base.run]
target_accuracy = 0.99
max_rounds = 2
[[methods]]
method = "local_sgd"
grid = { lr = [0.05], k = [2] }
[[methods]]
method = "stl_nc"
label = "STL-SGD^nc-2"
grid = { lr = [0.05], gamma = [100.0] }
fixed = { option = 2, T1 = 2, k = 2 }
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_run_png_subset_stl_nc(tmp_path: Path, shared_data: Path) -> None:
    out = tmp_path / "out"
    rc = main(
        [
            "run",
            str(_write(tmp_path, "png.toml", PNG_RUN)),
            "--data-dir",
            str(shared_data),
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["status"] == "budget" and summary["rounds"] == 3 and summary["fstar"] is None
    assert [m["round"] for m in metrics] == [1, 2, 3]
    assert all(m["gap"] is None and 0.0 <= m["accuracy"] <= 1.0 and m["objective"] > 0 for m in metrics)
    # Option 1, Non-IID (partition noniid): T_1 = 2, then T_2 = 4 with k_2 = floor(2 sqrt 2) = 2 and eta_1 / 2.
    assert [(m["stage"], m["period"], m["lr"]) for m in metrics] == [(1, 2, 0.05), (2, 2, 0.025), (2, 2, 0.025)]
    assert summary["plan"]["gamma"] == 100.0


def test_run_mnist_reaches_accuracy_target_and_stops(tmp_path: Path, shared_data: Path) -> None:
    text = PNG_RUN.replace('"cifar10-png200"', '"mnist10"\nmax_samples = 64').replace(
        "max_rounds = 3", "max_rounds = 60"
    )
    text = text.replace("target_accuracy = 0.99", "target_accuracy = 0.5").replace(
        'method = "stl_nc"', 'method = "sync_sgd"'
    )
    for field in ("option = 1\n", "k = 2\n", "gamma = 100\n", "T1 = 2\n"):  # STL-SGD^nc's own fields
        text = text.replace(field, "")
    out = tmp_path / "out"
    assert (
        main(
            ["run", str(_write(tmp_path, "m.toml", text)), "--data-dir", str(shared_data), "--out", str(out), "--quiet"]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "reached" and summary["final"]["accuracy"] >= 0.5
    assert summary["rounds_to_target"] == summary["final"]["round"] < 60


def test_net_config_errors_name_the_field(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write(tmp_path, "bad.toml", PNG_RUN.replace("[run]", "[run]\ntarget_gap = 1e-4"))
    assert main(["run", str(cfg), "--data-dir", str(shared_data), "--out", str(tmp_path / "o")]) == 2
    assert "run.target_gap" in capsys.readouterr().err
    cfg = _write(tmp_path, "bad2.toml", PNG_RUN.replace('"cifar10-png200"', '"digits49"'))
    assert main(["run", str(cfg), "--data-dir", str(shared_data), "--out", str(tmp_path / "o2")]) == 2
    assert "data.dataset" in capsys.readouterr().err
    cfg = _write(tmp_path, "bad3.toml", PNG_RUN.replace('model = "cnn"', 'model = "lenet"'))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o3")]) == 2
    assert "problem.model" in capsys.readouterr().err


@pytest.mark.parametrize("dataset", ["mnist10", "cifar10-png200"])
def test_tiny_nonconvex_sweep_end_to_end(tmp_path: Path, shared_data: Path, dataset: str) -> None:
    text = MNIST_SWEEP if dataset == "mnist10" else MNIST_SWEEP.replace('"mnist10"\nmax_samples = 96', f'"{dataset}"')
    out = tmp_path / "sweep"
    assert (
        main(
            [
                "sweep",
                str(_write(tmp_path, "s.toml", text)),
                "--out",
                str(out),
                "--data-dir",
                str(shared_data),
                "--jobs",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    records = read_results(out)
    assert len(records) == 2 and {r["status"] for r in records} <= {"budget", "reached", "pruned"}
    best = json.loads((out / "best.json").read_text())
    assert best  # one entry per label
