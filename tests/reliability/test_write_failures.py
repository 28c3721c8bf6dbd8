"""Writes that fail: a full disk or a read-only file system is one line, a torn last record is cut off (never
glued onto), and the resumed run or rerun sweep redoes the torn part once."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest
from base_run import SWEEP, base_config
from test_bad_input import assert_one_line_error

from stlsgd.experiments import rundir
from stlsgd.experiments.config import load_config
from stlsgd.experiments.runner import run_experiment
from stlsgd.files import append_jsonl, read_jsonl


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
    config = base_config(tmp_path)
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
    assert_one_line_error(cli("run", base_config(tmp_path), "--out", out), "Read-only file system")
    assert not out.exists()
