"""Resume never mixes runs: a checkpoint made on other data is refused (nothing written), the same rows read
from another file go on (the fingerprint is of the loaded rows and partition)."""

from __future__ import annotations

from pathlib import Path

import pytest
from base_run import base_config, digits_svmlight, interrupt_at, run_files
from test_bad_input import assert_one_line_error

from stlsgd.experiments.config import load_config
from stlsgd.experiments.runner import run_experiment


def test_resume_refuses_a_dataset_that_changed_since_the_checkpoint(tmp_path: Path, cli) -> None:
    data = digits_svmlight(tmp_path / "mine.svm")
    config = base_config(tmp_path, dataset=str(data))
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(load_config(config), out, progress=False, checkpoint_every=5, on_round=interrupt_at(12))
    before = run_files(out)
    digits_svmlight(data, rows=200)  # the file is cut between the kill and the resume
    err = assert_one_line_error(cli("run", config, "--out", out, "--resume", "--quiet"), out / "checkpoint")
    assert "was made on other data" in err
    assert run_files(out) == before  # metrics.jsonl is not continued on the other data


def test_resume_on_the_same_data_in_another_file_goes_on(tmp_path: Path) -> None:
    # The fingerprint is of the loaded rows and partition, not of the file's name or bytes.
    first = digits_svmlight(tmp_path / "a.svm")
    config = base_config(tmp_path, dataset=str(first))
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(load_config(config), out, progress=False, checkpoint_every=5, on_round=interrupt_at(12))
    first.write_text(first.read_text().replace("\n", "  \n"))  # other bytes, same rows
    summary = run_experiment(load_config(config), out, progress=False, resume=True)
    assert summary["rounds"] == 50
