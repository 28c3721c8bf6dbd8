"""An adversarial user's findings, one test (or more) each: no silent corruption on resume, validation before
any write, full disks, concurrent writers, one-line errors, strict JSON.

The base case: digits 4 vs 9, 8 clients, Local SGD, lr 0.5, k 10, no target, 50 rounds.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from test_bad_input import assert_one_line_error

from stlsgd.data import load_dataset
from stlsgd.executors.simulator import RunState
from stlsgd.experiments import rundir
from stlsgd.experiments.config import load_config
from stlsgd.experiments.rundir import LOCK_FILE
from stlsgd.experiments.runner import run_experiment
from stlsgd.files import append_jsonl, lock_directory, read_jsonl

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


def _config(tmp_path: Path, dataset: str = "digits49", name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(BASE.format(dataset=dataset))
    return path


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != LOCK_FILE}


def _interrupt_at(round_: int):
    def hook(state: RunState, rnd: object) -> None:
        if state.round == round_:
            raise KeyboardInterrupt

    return hook


def _digits_svmlight(path: Path, rows: int | None = None) -> Path:
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


# --------------------------------------------------------------------------- 1-2: resume never mixes runs


def test_resume_refuses_a_dataset_that_changed_since_the_checkpoint(tmp_path: Path, cli) -> None:
    data = _digits_svmlight(tmp_path / "mine.svm")
    config = _config(tmp_path, dataset=str(data))
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(load_config(config), out, progress=False, checkpoint_every=5, on_round=_interrupt_at(12))
    before = _files(out)
    _digits_svmlight(data, rows=200)  # the file is cut between the kill and the resume
    err = assert_one_line_error(cli("run", config, "--out", out, "--resume", "--quiet"), out / "checkpoint")
    assert "was made on other data" in err
    assert _files(out) == before  # metrics.jsonl is not continued on the other data


def test_resume_on_the_same_data_in_another_file_goes_on(tmp_path: Path) -> None:
    # The fingerprint is of the loaded rows and partition, not of the file's name or bytes.
    first = _digits_svmlight(tmp_path / "a.svm")
    config = _config(tmp_path, dataset=str(first))
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(load_config(config), out, progress=False, checkpoint_every=5, on_round=_interrupt_at(12))
    first.write_text(first.read_text().replace("\n", "  \n"))  # other bytes, same rows
    summary = run_experiment(load_config(config), out, progress=False, resume=True)
    assert summary["rounds"] == 50


# --------------------------------------------------------------------------- 3 and 7: validation before any write


@pytest.mark.parametrize(
    "override",
    [
        "run.seed=-1",
        "data.partition_seed=-3",
        "algorithm.k=1e999",
        "algorithm.k=99999999999999999999999",
        "algorithm.lr=inf",
        "run.max_rounds=true",
        "data.dataset=nonexistent.svm",
        "problem.kind=net",
    ],
)
def test_a_bad_rerun_with_overwrite_leaves_the_finished_run_as_it_was(tmp_path: Path, cli, override: str) -> None:
    config = _config(tmp_path)
    out = tmp_path / "run"
    assert cli("run", config, "--out", out, "--quiet")[0] == 0
    before = _files(out)
    assert_one_line_error(cli("run", config, "--out", out, "--quiet", "--overwrite", "--set", override))
    assert _files(out) == before


def test_a_failed_start_creates_nothing_and_the_corrected_rerun_is_not_refused(tmp_path: Path, cli) -> None:
    config = _config(tmp_path)
    out = tmp_path / "new" / "run"
    assert_one_line_error(cli("run", config, "--out", out, "--set", "data.dataset=missing.svm"), "missing.svm")
    assert not (tmp_path / "new").exists()
    assert cli("run", config, "--out", out, "--quiet")[0] == 0


def test_logistic_regression_on_an_image_dataset_is_one_line(tmp_path: Path, cli, shared_data: Path) -> None:
    config = _config(tmp_path, dataset="cifar10-png200")
    assert_one_line_error(
        cli("run", config, "--out", tmp_path / "o", "--data-dir", shared_data),
        "problem.kind: logistic regression needs a two-class svmlight dataset",
    )
    assert not (tmp_path / "o").exists()


def test_a_sweep_with_a_negative_or_repeated_seed_is_refused_before_it_starts(tmp_path: Path, cli) -> None:
    for seeds, why in (
        ("[0, -1]", "seeds.1: Input should be greater than or equal to 0"),
        ("[0, 1, 1]", "seeds: seed 1 is listed twice"),
    ):
        sweep = tmp_path / "s.toml"
        sweep.write_text(
            f'name = "s"\nseeds = {seeds}\n[base.data]\ndataset = "digits49"\nnum_clients = 4\n'
            '[[methods]]\nmethod = "sync_sgd"\ngrid = { lr = [0.5] }\n'
        )
        assert_one_line_error(cli("sweep", sweep, "--out", tmp_path / "o", "--jobs", "1"), why)
        assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- 4: a full disk


def _full_disk_after(limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """metrics.jsonl fills the disk: ``limit`` more bytes fit, then a line is torn and ENOSPC raised."""
    room = [limit]
    write = rundir.MetricsLog.write

    def full(self: rundir.MetricsLog, metrics: dict) -> None:
        data = (json.dumps(metrics) + "\n").encode()
        if len(data) > room[0]:
            self._fh.write(data[: room[0]])
            self._fh.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        room[0] -= len(data)
        write(self, metrics)

    monkeypatch.setattr(rundir.MetricsLog, "write", full)


def test_a_full_disk_is_one_line_and_the_resumed_run_has_no_torn_line(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path)
    run_experiment(load_config(config), tmp_path / "whole", progress=False)
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _full_disk_after(6000, m)
        assert_one_line_error(
            cli("run", config, "--out", out, "--quiet", "--checkpoint-every", "5"),
            out / "metrics.jsonl",
            "No space left on device",
        )
    torn = (out / "metrics.jsonl").read_bytes()
    assert not torn.endswith(b"\n")
    assert cli("run", config, "--out", out, "--quiet", "--resume")[0] == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    whole = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [m["round"] for m in whole] == list(range(1, 51))
    assert [m["objective"] for m in lines] == [m["objective"] for m in whole]


def test_a_torn_last_record_is_cut_off_not_glued_onto(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"key": "a", "n": 1}\n{"key": "b", "n"')  # a full disk tore the second record
    with caplog.at_level(logging.WARNING, logger="stlsgd"):
        assert [r["key"] for r in read_jsonl(path)] == ["a"]
        assert "skipping a last line cut short" in caplog.text
        append_jsonl(path, {"key": "b", "n": 2})
    assert path.read_bytes() == b'{"key": "a", "n": 1}\n{"key": "b", "n": 2}\n'
    assert "removed a last line cut short" in caplog.text


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


def test_a_sweep_rerun_after_a_full_disk_redoes_the_torn_run_once(tmp_path: Path, cli) -> None:
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP)
    out = tmp_path / "o"
    assert cli("sweep", sweep, "--out", out, "--jobs", "1", "--quiet")[0] == 0
    results = out / "results.jsonl"
    lines = results.read_bytes().splitlines(keepends=True)
    assert len(lines) == 3
    results.write_bytes(b"".join(lines[:2]) + lines[2][:40])  # the last record torn by a full disk
    assert cli("sweep", sweep, "--out", out, "--jobs", "1", "--quiet")[0] == 0
    records = read_jsonl(results)
    assert len(records) == 3 and len({r["key"] for r in records}) == 3  # redone once, nothing lost or doubled


def test_a_read_only_file_system_is_one_line(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    def erofs(path: os.PathLike, mode: int) -> bool:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(rundir.os, "access", erofs)
    out = tmp_path / "o"
    assert_one_line_error(cli("run", _config(tmp_path), "--out", out), "Read-only file system")
    assert not out.exists()


# --------------------------------------------------------------------------- 5: one writer per directory


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path: Path, cli) -> None:
    config = _config(tmp_path)
    out = tmp_path / "run"
    assert cli("run", config, "--out", out, "--quiet")[0] == 0
    before = _files(out)
    fd = lock_directory(out)  # as a run that is going would hold it
    try:
        assert_one_line_error(
            cli("run", config, "--out", out, "--quiet", "--overwrite"),
            f"another stlsgd process (pid {os.getpid()}) is writing a run here",
        )
    finally:
        os.close(fd)
    assert _files(out) == before
    assert cli("run", config, "--out", out, "--quiet", "--overwrite")[0] == 0  # free again once released


def test_a_second_sweep_into_the_same_directory_is_refused(tmp_path: Path, cli) -> None:
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP)
    out = tmp_path / "o"
    out.mkdir()
    fd = lock_directory(out)
    try:
        assert_one_line_error(cli("sweep", sweep, "--out", out, "--jobs", "1"), "another stlsgd sweep (pid")
    finally:
        os.close(fd)
    assert list(out.iterdir()) == [out / LOCK_FILE]


# --------------------------------------------------------------------------- 6: one line instead of a traceback


def test_outputs_that_are_files_are_one_line(tmp_path: Path, cli) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP)
    assert_one_line_error(cli("run", _config(tmp_path), "--out", blocker), "exists and is not a directory")
    assert_one_line_error(cli("run", _config(tmp_path), "--out", blocker / "sub"), "is not a directory")
    assert_one_line_error(cli("sweep", sweep, "--out", blocker, "--jobs", "1"), "exists and is not a directory")
    assert cli("sweep", sweep, "--out", tmp_path / "sw", "--jobs", "1", "--quiet")[0] == 0
    assert_one_line_error(cli("report", tmp_path / "sw", "--out", blocker), "exists and is not a directory")
    assert blocker.read_text() == "x"


# --------------------------------------------------------------------------- 9: nothing accepted silently


def test_summaries_and_metrics_are_strict_json(tmp_path: Path) -> None:
    # A run that diverges: its files must still parse with a reader that refuses NaN and Infinity.
    exp = load_config(_config(tmp_path), ["algorithm.lr=1e6"])
    run_experiment(exp, tmp_path / "run", progress=False)

    def refuse(text: str) -> None:
        raise ValueError(f"non-standard JSON constant {text}")

    summary = json.loads((tmp_path / "run" / "summary.json").read_text(), parse_constant=refuse)
    assert summary["status"] == "diverged"
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=refuse)


def test_duplicate_yaml_keys_and_a_byte_order_mark(tmp_path: Path, cli) -> None:
    dup = tmp_path / "c.yaml"
    dup.write_text("algorithm:\n  method: sync_sgd\n  lr: 1\n  lr: 2\n")
    assert_one_line_error(cli("run", dup, "--out", tmp_path / "o"), f"{dup}:4: invalid YAML (duplicate key 'lr')")
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + _config(tmp_path).read_bytes())
    assert load_config(bom).algorithm.lr == 0.5


def test_a_name_cannot_leave_runs(tmp_path: Path, cli) -> None:
    config = _config(tmp_path)
    for name in ("../../x", "/etc/x", "a/../../b", ""):
        assert_one_line_error(cli("run", config, "--set", f'name="{name}"'), "name: must be a relative name")


# --------------------------------------------------------------------------- 10: one mode for every file


def test_every_output_file_has_the_same_mode(tmp_path: Path) -> None:
    run_experiment(load_config(_config(tmp_path)), tmp_path / "run", progress=False, checkpoint_every=10)
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "run").iterdir()}
    assert set(modes.values()) == {0o666 & ~umask}, modes
    assert {"config.yaml", "metrics.jsonl", "summary.json", "final_params.npz", "checkpoint"} <= set(modes)
    assert np.load(tmp_path / "run" / "final_params.npz")["w"].shape == (64,)
