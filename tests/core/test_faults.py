"""$STLSGD_FAULT, the tests' deterministic kill: what it reads, and whom it kills when (in-process, the kill stubbed)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from stlsgd import faults
from stlsgd.errors import ConfigError


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(faults, "wait_for_exit", lambda pid: None)  # the kill was not sent: nothing ends
    return sent


def test_parse_reads_every_field(tmp_path: Path) -> None:
    assert faults.parse("die-after-round=7") == faults.Fault(after_round=7)
    f = faults.parse(f" die-after-round=3 , rank=1, once={tmp_path / 'x'} ,target=parent")
    assert (f.after_round, f.rank, f.once, f.parent) == (3, 1, tmp_path / "x", os.getppid())


def test_parse_reads_the_sweeps_faults(tmp_path: Path) -> None:
    assert faults.parse("die-after-record=2") == faults.Fault(after_records=2)
    f = faults.parse(f"die-at=worker-start,once={tmp_path / 'x'},target=parent")
    assert (f.at_worker_start, f.after_round, f.once, f.parent) == (True, None, tmp_path / "x", os.getppid())


@pytest.mark.parametrize(
    "text",
    [
        "rank=1",
        "die-after-round=x",
        "die-after-round=2,rank=",
        "die-after=2",
        "die-after-round=2,target=me",
        "die-after-round=2,die-after-record=1",
        "die-after-record=one",
        "die-at=round-3",
    ],
)
def test_a_malformed_value_is_a_one_line_error_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^\$STLSGD_FAULT: ") as err:
        faults.parse(text)
    assert "\n" not in str(err.value)


def test_unset_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faults.from_env() is None
    monkeypatch.setenv(faults.ENV, "die-after-round=2")
    assert faults.from_env() == faults.Fault(after_round=2)


def test_dies_at_the_first_boundary_at_or_past_the_round(kills: list[tuple[int, int]]) -> None:
    f = faults.Fault(after_round=5)
    for r in (1, 4):
        f.after(r)
    assert kills == []
    f.after(6)  # synchronous methods' rounds come in groups: 5 may be skipped
    assert kills == [(os.getpid(), signal.SIGKILL)]


def test_only_the_chosen_rank_dies(kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    f = faults.Fault(after_round=1, rank=1)
    monkeypatch.setenv("RANK", "0")
    f.after(1)
    assert kills == []
    monkeypatch.setenv("RANK", "1")
    f.after(1)
    assert kills == [(os.getpid(), signal.SIGKILL)]


def test_once_fires_for_the_first_process_only(kills: list[tuple[int, int]], tmp_path: Path) -> None:
    f = faults.Fault(after_round=1, once=tmp_path / "fired")
    f.after(1)
    f.after(2)  # a retry or a resume under the same environment runs through
    assert kills == [(os.getpid(), signal.SIGKILL)] and (tmp_path / "fired").is_file()


def test_target_parent_kills_the_parent_while_it_is_still_the_parent(kills: list[tuple[int, int]]) -> None:
    faults.Fault(after_round=1, parent=os.getppid()).after(1)
    faults.Fault(after_round=1, parent=os.getppid() + 1).after(1)  # re-parented: its first parent is gone
    assert kills == [(os.getppid(), signal.SIGKILL)]


def test_a_sweep_dies_once_it_has_recorded_the_chosen_count(kills: list[tuple[int, int]]) -> None:
    f = faults.Fault(after_records=2)
    f.after(10**6)  # a run's rounds never trigger it
    f.worker_started()
    f.recorded(1)
    assert kills == []
    f.recorded(2)
    assert kills == [(os.getpid(), signal.SIGKILL)]


def test_a_starting_worker_kills_its_parent_once(kills: list[tuple[int, int]], tmp_path: Path) -> None:
    f = faults.parse(f"die-at=worker-start,once={tmp_path / 'fired'},target=parent")
    f.after(10**6)
    f.recorded(10**6)
    assert kills == []
    f.worker_started()
    f.worker_started()  # a second worker with the same environment starts normally
    assert kills == [(os.getppid(), signal.SIGKILL)] and (tmp_path / "fired").is_file()
