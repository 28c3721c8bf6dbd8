"""The stored sweeps (docs/results/<data>/<column>/results.jsonl) and the configs their runs ran with, read back
so a test can run a stored setting again and compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stlsgd.experiments.sweeps.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]


def stored_run(data: str, column: str, label: str, settings: dict[str, Any], seed: int) -> dict[str, Any]:
    """The one record of ``label`` at ``settings`` and ``seed`` in docs/results/``data``/``column``."""
    lines = (ROOT / "docs" / "results" / data / column / "results.jsonl").read_text().splitlines()
    found = [
        record
        for record in map(json.loads, lines)
        if record["label"] == label and record["settings"] == settings and record["seed"] == seed
    ]
    assert len(found) == 1, f"{data}/{column}: {len(found)} stored runs {label} {settings} seed {seed}, not one"
    return found[0]


def sweep_config(column: str, label: str, settings: dict[str, Any], seed: int) -> dict[str, Any]:
    """The config the sweep configs/paper/``column``.toml runs ``label`` at ``settings`` and ``seed`` with."""
    sweep = load_sweep(ROOT / "configs" / "paper" / f"{column}.toml", only=[label])
    spec = next(s for s in sweep.grid if s.settings == settings)
    config = json.loads(json.dumps(spec.config))
    config["run"]["seed"] = seed
    return config
