"""TensorBoard scalars: the drop-in's rounds through RoundWriter, and one metrics.jsonl line through write_metrics,
read back from the event files with TensorBoard's EventAccumulator."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from adapter_helpers import PYTHON, launch_env
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from stlsgd.algorithms import STLSGD
from stlsgd.dropin import PlanAverager
from stlsgd.integrations.tensorboard import RoundWriter, open_writer, write_metrics


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_round_writer_writes_each_rounds_scalars(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)  # 8 float32 parameters: 32 bytes a step for a per-step DDP
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    writer = RoundWriter(tmp_path)
    # plan_lr: stage 1 = 2 rounds of 1 step at lr 0.2; stage 2 = 2 rounds of 2 steps at lr 0.1.
    PlanAverager(model, optimizer, STLSGD(lr=0.2, T1=2, k1=1.0), plan_lr=True, on_round=writer)
    for step in range(6):
        if step == 3:
            writer.report(loss=0.75, gap=0.125)
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
    writer.close()
    s = _scalars(tmp_path)
    assert s["stlsgd/stage"] == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0)]
    assert s["stlsgd/period"] == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0)]
    assert s["stlsgd/steps"] == [(1, 1.0), (2, 2.0), (3, 4.0), (4, 6.0)]
    assert [v for _, v in s["stlsgd/lr"]] == pytest.approx([0.2, 0.2, 0.1, 0.1])
    assert s["stlsgd/ddp_bytes"] == [(1, 32.0), (2, 64.0), (3, 128.0), (4, 192.0)]
    assert s["stlsgd/bytes_sent"] == [(r, 0.0) for r in (1, 2, 3, 4)]  # one process: nothing sent
    assert s["stlsgd/saved"] == [(r, 1.0) for r in (1, 2, 3, 4)]
    assert s["stlsgd/averages"] == [(r, 0.0) for r in (1, 2, 3, 4)]
    assert s["stlsgd/loss"] == [(3, 0.75)] and s["stlsgd/gap"] == [(3, 0.125)]  # reported during round 3, once


def test_write_metrics_writes_one_simulator_line_at_step_round(tmp_path: Path) -> None:
    writer = open_writer(tmp_path)
    for line in (
        {
            "round": 10,
            "iteration": 160,
            "stage": 2,
            "lr": 0.05,
            "period": 16,
            "batch": 1,
            "objective": 0.3251,
            "gap": 0.0042,
            "accuracy": 0.84,
            "bytes": 123456,
            "client_steps": 5120,
            "wall_s": 1.5,
        },
        {
            "round": 20,
            "iteration": 480,
            "stage": 3,
            "lr": 0.025,
            "period": 32,
            "objective": 0.3213,
            "gap": None,
            "accuracy": float("nan"),
            "bytes": 246912,
            "client_steps": 15360,
            "note": "x",
        },
    ):
        write_metrics(writer, line)
    writer.close()
    s = _scalars(tmp_path)
    assert s["stlsgd/iteration"] == [(10, 160.0), (20, 480.0)]
    assert s["stlsgd/stage"] == [(10, 2.0), (20, 3.0)] and s["stlsgd/period"] == [(10, 16.0), (20, 32.0)]
    assert [(st, round(v, 6)) for st, v in s["stlsgd/lr"]] == [(10, 0.05), (20, 0.025)]
    assert [(st, round(v, 6)) for st, v in s["stlsgd/objective"]] == [(10, 0.3251), (20, 0.3213)]
    assert [st for st, _ in s["stlsgd/gap"]] == [10] and [st for st, _ in s["stlsgd/accuracy"]] == [10]
    assert s["stlsgd/bytes"] == [(10, 123456.0), (20, 246912.0)]
    assert s["stlsgd/client_steps"] == [(10, 5120.0), (20, 15360.0)]
    assert "stlsgd/round" not in s and "stlsgd/note" not in s


def test_import_stlsgd_needs_none_of_the_frameworks() -> None:
    code = (
        "import sys, stlsgd, stlsgd.dropin, stlsgd.integrations, stlsgd.algorithms\n"
        "print(sorted(m for m in ('accelerate', 'lightning', 'flwr', 'tensorboard', 'torch.utils.tensorboard')"
        " if m in sys.modules))"
    )
    out = subprocess.run([PYTHON, "-c", code], env=launch_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_stlsgd_run_writes_its_metrics_as_tensorboard_scalars(tmp_path: Path) -> None:
    from stlsgd.cli import main

    config = tmp_path / "c.toml"
    config.write_text(
        '[data]\ndataset = "digits49"\nnum_clients = 4\n[algorithm]\nmethod = "local_sgd"\nlr = 0.5\n'
        "k = 5\n[run]\nmax_rounds = 12\neval_every = 3\n"
    )
    assert (
        main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet", "--tensorboard", str(tmp_path / "tb")])
        == 0
    )
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    gaps = events.Scalars("stlsgd/gap")
    assert [e.step for e in gaps] == [3, 6, 9, 12]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e.value for e in gaps] == pytest.approx([m["gap"] for m in lines], rel=1e-6)  # float32 in the file
