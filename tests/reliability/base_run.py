"""The reliability tests' base case and helpers (not a test module): digits 4 vs 9, 8 clients, Local SGD,
lr 0.5, k 10, no target, 50 rounds; a small sweep of three Local SGD settings."""

from __future__ import annotations

from pathlib import Path

from stlsgd.data import load_dataset
from stlsgd.executors.simulator import RunState
from stlsgd.experiments.rundir import LOCK_FILE

BASE = """\
name = "base"
[data]
dataset = "{dataset}"
num_clients = 8
[algorithm]
method = "local_sgd"
lr = 0.5
k = 10
[run]
target_gap = "none"
max_rounds = 50
"""

SWEEP = """\
name = "s"
seeds = [0]
[base.data]
dataset = "digits49"
num_clients = 4
[base.run]
target_gap = 1e-3
max_rounds = 300
[[methods]]
method = "local_sgd"
grid = { lr = [0.5, 0.3, 0.2], k = [4] }
"""


def base_config(tmp_path: Path, dataset: str = "digits49", name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(BASE.format(dataset=dataset))
    return path


def run_files(out: Path) -> dict[str, bytes]:
    """Every file of a run directory but its lock, by name: what a refused command must leave as it was."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != LOCK_FILE}


def interrupt_at(round_: int):
    """An on_round callback that interrupts the run (KeyboardInterrupt) after ``round_``."""

    def hook(state: RunState, rnd: object) -> None:
        if state.round == round_:
            raise KeyboardInterrupt

    return hook


def digits_svmlight(path: Path, rows: int | None = None) -> Path:
    """digits 4 vs 9 written as an svmlight file (the first ``rows`` rows)."""
    ds = load_dataset("digits49")
    X, y = ds.X.tocsr(), ds.y
    n = X.shape[0] if rows is None else rows
    with open(path, "w") as fh:
        for i in range(n):
            row = X[i]
            feats = " ".join(f"{j + 1}:{v:g}" for j, v in zip(row.indices, row.data))
            fh.write(f"{int(y[i]):+d} {feats}\n")
    return path
