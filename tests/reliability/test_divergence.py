"""Divergence: a non-finite parameter or loss ends the run with status "diverged"; the last finite metrics stay."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np

from stlsgd.data import load_dataset
from stlsgd.experiments.config import Experiment
from stlsgd.experiments.runner import run_experiment
from stlsgd.problems.logistic import LogisticRegression


def _exp(**algorithm: object) -> Experiment:
    return Experiment.model_validate(
        {
            "name": "diverge",
            "data": {"dataset": "digits49", "num_clients": 8},
            "algorithm": algorithm,
            "run": {"target_gap": 1e-6, "max_rounds": 3000},
        }
    )


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_huge_lr_makes_the_parameters_non_finite_at_once(tmp_path: Path, cli) -> None:
    """eta_1 = 1e300: the first local step overflows the parameters, so nothing finite is ever recorded."""
    exp = _exp(method="stl_sc", lr=1e300, k=4, T1=64)
    out = tmp_path / "out"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = run_experiment(exp, out, progress=False)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]  # reported as a status, not noise
    assert summary["status"] == "diverged" and summary["rounds"] == 1
    assert summary["final"] == {} and _lines(out) == []
    assert not np.isfinite(np.load(out / "final_params.npz")["w"]).all()
    # Through the CLI it is a result, not an error: exit 0 and the status on stdout.
    config = tmp_path / "c.json"
    config.write_text(json.dumps(exp.to_dict()))
    code, stdout, _ = cli("run", config, "--out", tmp_path / "cli", "--quiet")
    assert code == 0 and "diverged after 1 rounds" in stdout


def test_slow_divergence_keeps_the_last_finite_metrics(tmp_path: Path) -> None:
    """SyncSGD with eta * lambda ~ 2.8 > 2: |w| grows geometrically; the loss overflows while w is still finite."""
    out = tmp_path / "out"
    summary = run_experiment(_exp(method="sync_sgd", lr=1000.0), out, progress=False)
    lines = _lines(out)
    assert summary["status"] == "diverged"
    assert len(lines) > 10 and all(math.isfinite(m["objective"]) for m in lines)
    assert [m["round"] for m in lines] == list(range(1, len(lines) + 1))
    assert summary["final"] == lines[-1]  # the last finite metrics, kept in both places
    assert summary["rounds"] == lines[-1]["round"] + 1  # the round whose loss was not finite is not recorded
    assert summary["rounds_to_target"] is None
    w = np.load(out / "final_params.npz")["w"]
    assert np.isfinite(w).all()
    digits = load_dataset("digits49")
    with np.errstate(over="ignore"):
        assert not math.isfinite(LogisticRegression(digits.X, digits.y).loss(w))


def test_a_diverged_checkpointed_run_resumes_to_the_same_result(tmp_path: Path) -> None:
    exp = _exp(method="sync_sgd", lr=1000.0)
    out = tmp_path / "out"
    first = run_experiment(exp, out, progress=False, checkpoint_every=100)
    metrics = (out / "metrics.jsonl").read_bytes()
    again = run_experiment(exp, out, progress=False, resume=True)
    assert again == first and again["status"] == "diverged"
    assert (out / "metrics.jsonl").read_bytes() == metrics
