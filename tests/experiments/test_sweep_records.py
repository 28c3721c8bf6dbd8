"""Foreign or damaged records in a sweep directory: a results line that is not a sweep result is a warning and
skipped (as a torn line is), on a rerun and in a report; a best.json the report cannot use is one line naming
the file and the field. Never a traceback."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from stlsgd.cli import main
from stlsgd.experiments.sweeps import read_results

STORED = Path(__file__).resolve().parents[2] / "docs/results/table2_data/table2_a9a_iid_split"

SWEEP = """
name = "records"
[base.data]
dataset = "digits49"
num_clients = 4
[base.run]
target_gap = 1e-1
max_rounds = 200
[[methods]]
method = "local_sgd"
grid = { lr = [0.05], k = [5] }
"""

FOREIGN = ["{}", "[1, 2]", '{"key": "x", "label": "Local SGD"}', '"text"', "3"]


def _stored_copy(tmp_path: Path) -> Path:
    copy = tmp_path / STORED.name
    shutil.copytree(STORED, copy)
    return copy


def test_foreign_results_lines_are_skipped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    sweep = _stored_copy(tmp_path)
    good = read_results(sweep)
    capsys.readouterr()
    with open(sweep / "results.jsonl", "a") as fh:
        fh.write("\n".join(FOREIGN) + "\n")
    with caplog.at_level(logging.WARNING, logger="stlsgd"):
        assert read_results(sweep) == good
    # The library logs (its user's logging configuration decides what is shown); it prints nothing itself.
    assert capsys.readouterr().err == ""
    first = len((STORED / "results.jsonl").read_text().splitlines()) + 1
    assert [(r.name, r.levelname) for r in caplog.records] == [("stlsgd.experiments.sweeps.results", "WARNING")] * len(
        FOREIGN
    )
    assert [r.getMessage().split(": skipping")[0] for r in caplog.records] == [
        f"{sweep / 'results.jsonl'}:{first + i}" for i in range(len(FOREIGN))
    ]


def test_the_cli_prints_the_librarys_warnings_as_its_own_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = _stored_copy(tmp_path)
    with open(sweep / "results.jsonl", "a") as fh:
        fh.write("\n".join(FOREIGN) + "\n")
    capsys.readouterr()
    assert main(["report", str(sweep), "--out", str(tmp_path / "r"), "--network", "datacenter,step=60ns"]) == 0
    first = len((STORED / "results.jsonl").read_text().splitlines()) + 1
    err = capsys.readouterr().err.splitlines()
    skipped = [line for line in err if ": skipping" in line]
    assert [line.split(": skipping")[0] for line in skipped] == [
        f"stlsgd: warning: {sweep / 'results.jsonl'}:{first + i}" for i in range(len(FOREIGN))
    ]
    # The stored copy keeps no runs: one line for each drawn run (one a row), naming what redraws it.
    missing = [line for line in err if line not in skipped]
    rows = len(json.loads((STORED / "best.json").read_text())["methods"])
    assert (
        rows >= 2
        and len(missing) == rows
        and all(line.startswith(f"stlsgd: warning: {sweep / 'runs'}/") and "stlsgd replay" in line for line in missing)
    ), err


def test_rerun_of_a_sweep_with_foreign_results_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shared_data: Path
) -> None:
    config, out = tmp_path / "s.toml", tmp_path / "out"
    config.write_text(SWEEP)
    args = ["sweep", str(config), "--out", str(out), "--jobs", "1", "--quiet", "--data-dir", str(shared_data)]
    assert main(args) == 0
    before = json.loads((out / "best.json").read_text())
    with open(out / "results.jsonl", "a") as fh:
        fh.write("\n".join(FOREIGN) + "\n")
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err.count("skipping a line that is not a sweep result") == len(FOREIGN), err
    after = json.loads((out / "best.json").read_text())
    assert {k: v for k, v in after.items() if k != "wall_s"} == {k: v for k, v in before.items() if k != "wall_s"}


def test_report_skips_foreign_results_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = _stored_copy(tmp_path)
    with open(sweep / "results.jsonl", "a") as fh:
        fh.write("\n".join(FOREIGN) + "\n")
    assert main(["report", str(sweep), "--out", str(tmp_path / "r"), "--network", "datacenter,step=60ns"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "skipping a line that is not a sweep result" in err
    assert (tmp_path / "r" / "table.md").is_file()


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda b: b.pop("labels"), "labels"),
        (lambda b: b.pop("dataset"), "dataset"),
        (lambda b: b["methods"][b["labels"][0]].update(median="abc"), "median"),
        (lambda b: b["methods"].pop(b["labels"][0]), "labels names"),
    ],
    ids=["no-labels", "no-dataset", "median-abc", "label-without-method"],
)
def test_damaged_best_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, field: str) -> None:
    sweep = _stored_copy(tmp_path)
    best = json.loads((sweep / "best.json").read_text())
    edit(best)
    (sweep / "best.json").write_text(json.dumps(best))
    assert main(["report", str(sweep), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"stlsgd: error: {sweep / 'best.json'}: ") and field in err[0], err


def test_best_json_that_is_a_list_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = _stored_copy(tmp_path)
    (sweep / "best.json").write_text("[1, 2]")
    assert main(["report", str(sweep), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"stlsgd: error: {sweep / 'best.json'}: not a best.json"), err


def test_best_json_names_its_sweep_file_relative_to_where_the_sweep_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep file under the working directory is recorded relative to it, however it was given: no record
    names the machine's folders, and a checkout moved elsewhere still finds it from its best.json's folder."""
    from stlsgd.experiments.sweeps.results import recorded_path, sweep_file_of

    checkout = tmp_path / "checkout"
    (checkout / "sweeps").mkdir(parents=True)
    (checkout / "sweeps" / "s.toml").write_text(SWEEP)
    outside = tmp_path / "elsewhere.toml"
    outside.write_text(SWEEP)
    monkeypatch.chdir(checkout)
    assert recorded_path(checkout / "sweeps" / "s.toml") == "sweeps/s.toml"
    assert recorded_path(Path("sweeps/s.toml")) == "sweeps/s.toml"
    assert recorded_path(outside) == str(outside)  # only its own path finds it
    assert main(["sweep", str(checkout / "sweeps" / "s.toml"), "--out", "out", "--quiet"]) == 0
    assert json.loads((checkout / "out" / "best.json").read_text())["config"] == "sweeps/s.toml"
    monkeypatch.chdir(tmp_path)
    moved = tmp_path / "moved"
    checkout.rename(moved)
    assert sweep_file_of({"config": "sweeps/s.toml", "_dir": str(moved / "out")}) == moved / "sweeps" / "s.toml"
    assert sweep_file_of({"config": "sweeps/s.toml"}) is None  # from elsewhere, without the sweep's folder
