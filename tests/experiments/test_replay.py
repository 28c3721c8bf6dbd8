"""`stlsgd replay`: an archived sweep (results.jsonl and best.json, no runs/) rerun into runs/ and drawn again.

A small real sweep (the embedded digits, 8 clients) runs once; each test replays a copy of
its two files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stlsgd.cli import main
from stlsgd.experiments.report import _panels, load_sweep_dir
from stlsgd.experiments.sweeps import read_results
from stlsgd.experiments.sweeps.replay import same_outcome

SWEEP = """
name = "ci_replay_digits"
title = "digits 4 vs 9 (IID)"
seeds = [0]

[base.data]
dataset = "digits49"
num_clients = 8
partition = "shared"

[base.run]
target_gap = 1e-3
max_rounds = 3000

[[methods]]
method = "sync_sgd"
label = "SyncSGD"
grid = { lr = [0.8], lr_decay = [1e-3] }
fixed = { "run.eval_every" = 5 }

[[methods]]
method = "local_sgd"
label = "Local SGD"
grid = { lr = [0.8, 0.002], k = [16] }
fixed = { lr_decay = 1e-2 }

[[methods]]
method = "local_sgd"
label = "Local SGD (4 rounds)"
# Never reaches the target: the figures draw its closest run, which the replay reruns too.
grid = { lr = [0.8, 0.4], k = [16] }
fixed = { lr_decay = 1e-2, "run.max_rounds" = 4 }
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    config = root / "small.toml"
    config.write_text(SWEEP)
    out = root / "out"
    assert (
        main(["sweep", str(config), "--out", str(out), "--jobs", "1", "--quiet", "--data-dir", str(shared_data)]) == 0
    )
    return out


def _archive(swept: Path, into: Path) -> Path:
    """The sweep as an archive keeps it: results.jsonl and best.json, no runs/."""
    into.mkdir()
    for name in ("results.jsonl", "best.json"):
        shutil.copy(swept / name, into / name)
    return into


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _metrics(path: Path) -> list[dict[str, object]]:
    """A run's evaluations without their timings (the only fields a rerun may change)."""
    timing = {"compute_s", "comm_s", "wall_s"}
    return [{k: v for k, v in json.loads(line).items() if k not in timing} for line in path.read_text().splitlines()]


def test_replay_reruns_the_drawn_runs_and_the_report_draws_them(
    swept: Path, tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = _archive(swept, tmp_path / "archive")
    assert main(["replay", str(archive), "--jobs", "1", "--data-dir", str(shared_data)]) == 0
    out = capsys.readouterr().out
    best = json.loads((archive / "best.json").read_text())
    drawn = {label: info.get("run_dir") or info["closest"]["run_dir"] for label, info in best["methods"].items()}
    assert best["methods"]["Local SGD (4 rounds)"].get("run_dir") is None  # the closest run is drawn
    # Exactly the drawn runs, each with every evaluation its eval_every asks for, and the same values at the
    # points the sweep's own run kept (bit for bit but the timings).
    assert sorted(p.name for p in (archive / "runs").iterdir()) == sorted({d.split("/")[1] for d in drawn.values()})
    records = {r["run_dir"]: r for r in read_results(archive)}
    for label, run_dir in drawn.items():
        replayed, original = _metrics(archive / run_dir / "metrics.jsonl"), _metrics(swept / run_dir / "metrics.jsonl")
        every, rounds = records[run_dir]["eval_every"], records[run_dir]["rounds"]
        assert [m["round"] for m in replayed] == list(range(every, rounds + 1, every)), label
        assert original and all(m in replayed for m in original), label
        assert f"'{label}' {run_dir}:" in out
    assert "as recorded" in out and not (archive / ".replay").exists()
    # The report draws every row from the replayed runs; its table is the sweep's own.
    panel = _panels([load_sweep_dir(archive)], "round")[0]
    assert [(c.label, c.reached) for c in panel.curves] == [
        ("SyncSGD", True),
        ("Local SGD", True),
        ("Local SGD (4 rounds)", False),  # its closest run, drawn faded under its own row's name
    ]
    assert panel.title == "digits 4 vs 9 (IID)"
    assert main(["report", str(archive), "--out", str(tmp_path / "r1")]) == 0
    assert main(["report", str(swept), "--out", str(tmp_path / "r2")]) == 0
    for name in ("table.md", "table.csv"):
        assert (tmp_path / "r1" / name).read_bytes() == (tmp_path / "r2" / name).read_bytes()
    assert all((tmp_path / "r1" / f"table_{f}.png").stat().st_size > 0 for f in ("rounds", "epochs", "compute"))


def test_a_replay_that_differs_from_its_record_is_refused_and_not_kept(
    swept: Path, tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = _archive(swept, tmp_path / "archive")
    best = json.loads((archive / "best.json").read_text())
    tampered = best["methods"]["SyncSGD"]["run_dir"]
    lines = []
    for line in (archive / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["run_dir"] == tampered:  # the record claims 5 rounds fewer than the run takes
            rounds = record["rounds_to_target"]
            record["rounds_to_target"] -= 5
            record["iterations_to_target"] -= 5
        lines.append(json.dumps(record))
    (archive / "results.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["replay", str(archive), "--jobs", "1", "--quiet", "--data-dir", str(shared_data)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("stlsgd: error: ")
    assert (
        f"row 'SyncSGD' ({tampered}) replayed reached in {rounds} rounds ({rounds} iterations), "
        f"recorded reached in {rounds - 5} rounds ({rounds - 5} iterations)" in err
    )
    # The other rows matched and are kept; the refused run is not there, nor any half-written copy.
    kept = sorted(p.name for p in (archive / "runs").iterdir())
    assert tampered.split("/")[1] not in kept and len(kept) == 2
    assert not (archive / ".replay").exists()


def _refused(args: list[str], directory: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = _files(directory)
    assert main(["replay", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("stlsgd: error: ")
    assert _files(directory) == before  # nothing written, not even the lock
    return err


def test_bad_input_is_one_line_before_anything_is_written(
    swept: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = _archive(swept, tmp_path / "archive")
    # No best.json.
    (archive / "best.json").rename(tmp_path / "best.json")
    assert "best.json: not found" in _refused([str(archive)], archive, capsys)
    (tmp_path / "best.json").rename(archive / "best.json")
    # A run_dir that results.jsonl does not hold.
    best = json.loads((archive / "best.json").read_text())
    drawn = best["methods"]["Local SGD"]["run_dir"]
    results = (archive / "results.jsonl").read_text()
    (archive / "results.jsonl").write_text("".join(x for x in results.splitlines(True) if drawn not in x))
    assert f"methods.Local SGD.run_dir: {drawn} is not in results.jsonl" in _refused([str(archive)], archive, capsys)
    (archive / "results.jsonl").write_text(results)
    # A sweep file edited since: the recorded run is no longer one of its runs.
    edited = tmp_path / "edited.toml"
    edited.write_text(SWEEP.replace("lr = [0.8, 0.002], k = [16]", "lr = [0.8, 0.002], k = [8]"))
    err = _refused([str(archive), "--config", str(edited)], archive, capsys)
    assert f"row 'Local SGD': no run of this sweep file is the recorded {drawn}" in err
    # Another sweep's file; a missing one; --jobs 0.
    other = tmp_path / "other.toml"
    other.write_text(SWEEP.replace('name = "ci_replay_digits"', 'name = "other"'))
    assert "is sweep 'other'" in _refused([str(archive), "--config", str(other)], archive, capsys)
    assert "--config: " in _refused([str(archive), "--config", str(tmp_path / "no.toml")], archive, capsys)
    assert "--jobs: must be >= 1" in _refused([str(archive), "--jobs", "0"], archive, capsys)
    # A link in a later directory: refused before the first directory is written.
    linked = _archive(swept, tmp_path / "linked")
    (linked / "runs").symlink_to(tmp_path)
    assert "is a symbolic link" in _refused([str(archive), str(linked)], archive, capsys)


def test_the_outcome_compared_is_the_target_crossing_or_where_an_unreached_run_stopped() -> None:
    reached = {"status": "reached", "rounds_to_target": 27, "iterations_to_target": 14_892_038}
    # A reached run: the round and the iteration of the crossing (here the budget cut its last round).
    assert same_outcome({**reached, "rounds": 27, "iterations": 14_892_038}, {**reached, "rounds": 27})
    assert not same_outcome({**reached, "iterations_to_target": 10_000_000}, reached)
    assert not same_outcome({**reached, "rounds_to_target": 26}, reached)
    # A run that did not reach the target: where it stopped, rounds and iterations.
    stopped = {"status": "budget", "rounds_to_target": None, "iterations_to_target": None, "rounds": 69}
    assert same_outcome({**stopped, "iterations": 10_115_136}, {**stopped, "iterations": 10_115_136})
    assert not same_outcome({**stopped, "iterations": 10_000_000}, {**stopped, "iterations": 10_115_136})
    assert not same_outcome({**stopped, "rounds": 70, "iterations": 1}, {**stopped, "iterations": 1})
    assert not same_outcome({**stopped, "status": "diverged", "iterations": 1}, {**stopped, "iterations": 1})
