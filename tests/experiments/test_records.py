"""The typed records: a summary or a sweep record missing a field is refused where it is written, and a record
round-trips through its file unchanged."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from stlsgd.experiments.records import RunSummary, SweepRecord
from stlsgd.experiments.sweeps.results import RESULTS, append_result, read_results

SUMMARY = {
    "name": "toy",
    "method": "stl_sgd",
    "status": "reached",
    "rounds_to_target": 7,
    "iterations_to_target": 70,
    "rounds": 7,
    "iterations": 70,
    "stages": 2,
    "client_steps": 280,
    "bytes": 4480,
    "bytes_per_client": 560,
    "wall_s": 0.125,
    "compute_s": 0.1,
    "comm_s": 0.0,
    "fstar": 0.25,
    "final": {"round": 7, "gap": 0.001},
    "plan": {"kind": "staged", "stages": [[1, 4], [2, 8]]},
    "rule": {"drift": None, "outer": None},
    "backend": {"kind": "simulator"},
    "auto_model_rounds": None,
}

RECORD = {
    "key": "abc123",
    "label": "STL-SGD",
    "method": "stl_sgd",
    "phase": "grid",
    "order": 0,
    "seed": 1,
    "settings": {"lr": 0.5},
    "status": "reached",
    "rounds_to_target": 7,
    "iterations_to_target": 70,
    "rounds": 7,
    "iterations": 70,
    "client_steps": 280,
    "bytes_per_client": 560,
    "eval_every": 1,
    "eval_every_iterations": None,
    "final_gap": 0.001,
    "final_objective": 0.251,
    "final_accuracy": None,
    "num_samples": 100,
    "wall_s": 0.125,
    "run_dir": "runs/abc123",
    "error": None,
}


def test_a_summary_missing_a_field_is_refused_where_it_is_written() -> None:
    incomplete = {k: v for k, v in SUMMARY.items() if k != "bytes_per_client"}
    with pytest.raises(ValidationError, match="bytes_per_client"):
        RunSummary.model_validate(incomplete)


def test_a_summary_round_trips_through_its_file(tmp_path) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(RunSummary.model_validate(SUMMARY).to_json()))
    assert json.loads(path.read_text()) == SUMMARY
    assert list(json.loads(path.read_text())) == list(SUMMARY)  # the order of the fields too
    assert RunSummary.read(path).to_json() == SUMMARY
    # a summary written before auto_model_rounds was recorded still reads: not the clients' models' choice
    older = {k: v for k, v in SUMMARY.items() if k != "auto_model_rounds"}
    assert RunSummary.model_validate(older).auto_model_rounds is None


def test_a_sweep_record_missing_a_field_is_refused_before_its_line_is_written(tmp_path) -> None:
    incomplete = {k: v for k, v in RECORD.items() if k != "run_dir"}
    with pytest.raises(ValidationError, match="run_dir"):
        append_result(tmp_path, incomplete)
    assert not (tmp_path / RESULTS).exists()


def test_a_sweep_record_round_trips_through_results_jsonl(tmp_path) -> None:
    written = append_result(tmp_path, RECORD)
    assert written == RECORD
    assert read_results(tmp_path) == [RECORD]
    assert SweepRecord.model_validate(json.loads((tmp_path / RESULTS).read_text())).to_json() == RECORD
