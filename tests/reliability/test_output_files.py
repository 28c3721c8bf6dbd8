"""The files a run writes: outputs in the way of a file are one line, summaries and metrics are strict JSON even
for a diverged run, and every output file has the same mode."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
from base_run import SWEEP, base_config
from test_bad_input import assert_one_line_error

from stlsgd.experiments.config import load_config
from stlsgd.experiments.runner import run_experiment


def test_outputs_that_are_files_are_one_line(tmp_path: Path, cli) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP)
    assert_one_line_error(cli("run", base_config(tmp_path), "--out", blocker), "exists and is not a directory")
    assert_one_line_error(cli("run", base_config(tmp_path), "--out", blocker / "sub"), "is not a directory")
    assert_one_line_error(cli("sweep", sweep, "--out", blocker, "--jobs", "1"), "exists and is not a directory")
    assert cli("sweep", sweep, "--out", tmp_path / "sw", "--jobs", "1", "--quiet")[0] == 0
    assert_one_line_error(cli("report", tmp_path / "sw", "--out", blocker), "exists and is not a directory")
    assert blocker.read_text() == "x"


def test_summaries_and_metrics_are_strict_json(tmp_path: Path) -> None:
    # A run that diverges: its files must still parse with a reader that refuses NaN and Infinity.
    exp = load_config(base_config(tmp_path), ["algorithm.lr=1e6"])
    run_experiment(exp, tmp_path / "run", progress=False)

    def refuse(text: str) -> None:
        raise ValueError(f"non-standard JSON constant {text}")

    summary = json.loads((tmp_path / "run" / "summary.json").read_text(), parse_constant=refuse)
    assert summary["status"] == "diverged"
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=refuse)


def test_every_output_file_has_the_same_mode(tmp_path: Path) -> None:
    run_experiment(load_config(base_config(tmp_path)), tmp_path / "run", progress=False, checkpoint_every=10)
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "run").iterdir()}
    assert set(modes.values()) == {0o666 & ~umask}, modes
    assert {"config.yaml", "metrics.jsonl", "summary.json", "final_params.npz", "checkpoint"} <= set(modes)
    assert np.load(tmp_path / "run" / "final_params.npz")["w"].shape == (64,)
