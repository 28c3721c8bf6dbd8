"""End to end: `stlsgd sweep` on a small grid (a9a from ../shared/data), then `stlsgd report` on its directory."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from stlsgd.cli import main
from stlsgd.experiments.sweeps import load_sweep, read_results
from stlsgd.experiments.sweeps.spec import grid_edges

SWEEP = """
name = "ci_small_a9a"
seeds = [0, 1]

[base.data]
dataset = "a9a"
num_clients = 8
partition = "shared"

[base.run]
target_gap = 1e-2
max_rounds = 3000

[[methods]]
method = "sync_sgd"
label = "SyncSGD"
grid = { lr = [0.8, 0.4], lr_decay = [1e-3] }
fixed = { "run.eval_every" = 5 }

[[methods]]
method = "local_sgd"
label = "Local SGD"
# The first setting is good; the tiny learning rates need far more rounds, so pruning must stop them.
grid = { lr = [0.4, 0.002, 0.001, 0.0005, 0.0002], k = [20] }
fixed = { lr_decay = 1e-2 }

[[methods]]
method = "stl_sc"
label = "STL-SGD^sc"
grid = { lr = [0.4], k = [200, 100] }
fixed = { lr_T1 = 0.1 }
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> tuple[Path, Path, int]:
    root = tmp_path_factory.mktemp("sweep")
    config = root / "small.toml"
    config.write_text(SWEEP)
    out = root / "out"
    # One worker: the good first setting of each row always finishes before the hopeless ones start, so
    # pruning is deterministic (with two, a warm worker can run a slow setting to its budget first).
    rc = main(["sweep", str(config), "--out", str(out), "--jobs", "1", "--quiet", "--data-dir", str(shared_data)])
    return config, out, rc


def test_sweep_writes_results_and_best(swept: tuple[Path, Path, int]) -> None:
    config, out, rc = swept
    assert rc == 0
    records = read_results(out)
    grid = [r for r in records if r["phase"] == "grid"]
    sweep = load_sweep(config)
    assert {(r["label"], r["key"]) for r in grid} == {(s.label, s.key) for s in sweep.grid}
    best = json.loads((out / "best.json").read_text())
    for label in sweep.labels:
        reached = [r for r in grid if r["label"] == label and r["status"] == "reached"]
        assert reached, label
        fewest = min(r["rounds_to_target"] for r in reached)
        chosen = best["methods"][label]
        winner = next(r for r in reached if r["settings"] == chosen["settings"])
        assert winner["rounds_to_target"] == fewest
        # The best setting was rerun with the other seed; median and range cover both.
        seeds = chosen["seeds"]
        assert set(seeds) == {"0", "1"}
        rounds = [v["rounds_to_target"] for v in seeds.values() if v["status"] == "reached"]
        assert chosen["min"] == min(rounds) and chosen["max"] == max(rounds)
        for v in seeds.values():
            assert (out / v["run_dir"] / "metrics.jsonl").is_file()
        assert chosen["edges"] == grid_edges(chosen["settings"], sweep.grids[label])
    # Local SGD's good lr 0.4 is its list's largest (k = [20] has no edge): the choice sits at the grid's edge.
    assert best["methods"]["Local SGD"]["edges"] == ["lr"]
    # Every run keeps its final model, as a plain `stlsgd run` does (the README says every run writes it).
    for r in records:
        assert (out / r["run_dir"] / "final_params.npz").is_file(), r["run_dir"]
    # SyncSGD evaluates every 5 rounds, so its round counts are multiples of 5.
    assert all(r["rounds_to_target"] % 5 == 0 for r in records if r["label"] == "SyncSGD" and r["status"] == "reached")


def test_grid_edges_by_hand() -> None:
    grid = {"lr": [3.2, 32, 0.32], "k": [800, 25600], "warmup": [1000, 100, 10000], "iid": [True, False], "s": [7]}
    assert grid_edges({"lr": 3.2, "k": 25600, "warmup": 100, "iid": True, "s": 7}, grid) == ["k", "warmup"]
    assert grid_edges({"lr": 0.32, "k": 800, "warmup": 1000}, grid) == ["lr", "k"]  # the smallest is an edge too
    assert grid_edges({"lr": 3.2}, {"lr": [3.2, "x"]}) == []  # not a list of numbers: no order to be at the end of


def test_hopeless_runs_are_pruned_not_failed(swept: tuple[Path, Path, int]) -> None:
    _, out, _ = swept
    records = read_results(out)
    local = [r for r in records if r["label"] == "Local SGD" and r["phase"] == "grid"]
    best = min(r["rounds_to_target"] for r in local if r["status"] == "reached")
    pruned = [r for r in local if r["status"] == "pruned"]
    assert pruned, [r["status"] for r in local]
    # One worker ran the row's best first, so every hopeless run stopped at the best's round count: still going
    # there, it could no longer even tie.
    assert all(r["rounds"] == best for r in pruned), [r["rounds"] for r in pruned]
    assert not any(r["status"] == "failed" for r in records)


def test_rerun_skips_finished_runs(
    swept: tuple[Path, Path, int], capsys: pytest.CaptureFixture[str], shared_data: Path
) -> None:
    config, out, _ = swept
    before = (out / "results.jsonl").read_text()
    assert main(["sweep", str(config), "--out", str(out), "--jobs", "2", "--data-dir", str(shared_data)]) == 0
    assert (out / "results.jsonl").read_text() == before
    assert "[1]" not in capsys.readouterr().out  # no run line: nothing ran again


def test_edited_sweep_file_chooses_only_among_its_own_runs(
    swept: tuple[Path, Path, int], tmp_path: Path, shared_data: Path
) -> None:
    config, out, _ = swept
    edited_out = tmp_path / "out"
    shutil.copytree(out, edited_out)
    edited = tmp_path / "edited.toml"
    # SyncSGD now evaluates every 10 rounds: both its settings are new configs, and its old records (every
    # 5 rounds, so possibly fewer rounds to target) must neither win, nor be counted, nor prune the new ones.
    edited.write_text(
        config.read_text().replace('fixed = { "run.eval_every" = 5 }', 'fixed = { "run.eval_every" = 10 }')
    )
    old = read_results(out)
    assert (
        main(["sweep", str(edited), "--out", str(edited_out), "--jobs", "1", "--quiet", "--data-dir", str(shared_data)])
        == 0
    )
    records = read_results(edited_out)
    assert records[: len(old)] == old  # the earlier runs stay on disk
    new_keys = {s.key for s in load_sweep(edited).grid if s.label == "SyncSGD"}
    new_grid = [r for r in records if r["label"] == "SyncSGD" and r["phase"] == "grid" and r["key"] in new_keys]
    # Only a new run may prune a new one: a pruned one stopped at the round its sibling reached the target.
    reached = [r["rounds_to_target"] for r in new_grid if r["status"] == "reached"]
    assert len(new_grid) == 2 and reached
    assert all(r["status"] == "reached" or r["rounds"] == min(reached) for r in new_grid)
    sync = json.loads((edited_out / "best.json").read_text())["methods"]["SyncSGD"]
    assert sync["tried"]["reached"] + sync["tried"]["pruned"] == sync["tried"]["planned"] == 2
    assert sync["key"] in new_keys
    assert all(v["rounds_to_target"] % 10 == 0 for v in sync["seeds"].values())


def _bench_table2():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_table2.py"
    spec = importlib.util.spec_from_file_location("bench_table2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_client_step_floor_stops_each_run_just_past_its_rows_best(
    swept: tuple[Path, Path, int], tmp_path: Path
) -> None:
    config, out, _ = swept
    count = _bench_table2().local_client_steps
    records = read_results(out)
    local = [r for r in records if r["method"] in ("local_sgd", "stl_sc")]
    taken = sum(r["iterations"] for r in {r["key"]: r for r in local}.values()) * 8  # 8 clients, batch 1
    # One worker ran each row's best setting first, so every other run stopped as early as the rule allows.
    assert count(config, out) == (taken, taken)
    # Had a Local SGD run been pruned 50 rounds late (its row's best unknown yet), those 50 rounds (k = 20,
    # 8 clients) were more than needed: a run still going at the best's round count cannot win.
    best = min(r["rounds_to_target"] for r in local if r["label"] == "Local SGD" and r["status"] == "reached")
    late = next(r for r in local if r["label"] == "Local SGD" and r["status"] == "pruned")
    assert late["rounds"] == best
    late.update(rounds=best + 50, iterations=20 * (best + 50))
    doctored = tmp_path / "late"
    shutil.copytree(out, doctored)
    (doctored / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert count(config, doctored) == (taken + 50 * 20 * 8, taken)


def test_report_writes_table_and_figures(swept: tuple[Path, Path, int], tmp_path: Path) -> None:
    _, out, _ = swept
    assert main(["report", str(out), "--out", str(tmp_path), "--prefix", "t2"]) == 0
    best = json.loads((out / "best.json").read_text())
    md = (tmp_path / "t2.md").read_text()
    for label in best["methods"]:
        assert f"| {label} |" in md
    # A setting chosen at its list's edge is marked, and named under the table.
    assert "| Local SGD | lr=0.4 (edge), k=20 (eval every 1) |" in md
    assert "extend it, or say why not." in md and "Local SGD (ci_small_a9a): lr" in md
    rows = list(csv.DictReader(open(tmp_path / "t2.csv")))
    by_label = {r["label"]: r for r in rows}
    sync = float(by_label["SyncSGD"]["median_rounds"])
    assert float(by_label["SyncSGD"]["speedup"]) == pytest.approx(1.0)
    for label, info in best["methods"].items():
        assert float(by_label[label]["median_rounds"]) == info["median"]
        assert float(by_label[label]["speedup"]) == pytest.approx(sync / info["median"])
    for name in ("t2_rounds.png", "t2_epochs.png"):
        with Image.open(tmp_path / name) as img:
            assert img.format == "PNG" and img.size[0] > 100


def test_bad_grid_value_names_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(SWEEP.replace("lr = [0.8, 0.4]", "lr = [0.8, -1]"))
    assert main(["sweep", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(config) in err and "algorithm.lr" in err and "lr=-1" in err
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_report_without_sweep_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "best.json" in capsys.readouterr().err


def test_report_prices_each_row_by_hand_and_draws_the_time_figures(
    swept: tuple[Path, Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = swept
    # alpha 1 ms a round, beta 1000 B/s (8 kbit), c 2 us a client-step.
    assert (
        main(["report", str(out), "--out", str(tmp_path / "rep"), "--network", "latency=1ms,bandwidth=8kbit,step=2us"])
        == 0
    )
    md = (tmp_path / "rep" / "table.md").read_text()
    best = json.loads((out / "best.json").read_text())
    local = best["methods"]["Local SGD"]["seeds"]
    # Median over the two seeds of each quantity: rounds, bytes one client sent (d = 123 float64s a round),
    # client-steps (k = 20 steps of batch 1 a round).
    rounds = sorted(v["rounds_to_target"] for v in local.values())
    assert [v["bytes_per_client"] for v in local.values()] == [v["rounds_to_target"] * 123 * 8 for v in local.values()]
    assert [v["client_steps"] for v in local.values()] == [v["rounds_to_target"] * 20 for v in local.values()]
    r = sum(rounds) / 2
    seconds = r * 1e-3 + r * 984 / 1000 + r * 20 * 2e-6
    cell = next(line for line in md.splitlines() if line.startswith("| Local SGD |") and " s (" in line)
    assert f"{seconds:.3g} s ({r * 1e-3 * 1e3:.3g} ms latency + {r * 984 / 1000:.3g} s transfer" in cell, cell
    assert "Crossover latencies" in md and "STL-SGD^sc vs Local SGD" in md
    for name in ("table_latency.png", "table_compute.png"):
        with Image.open(tmp_path / "rep" / name) as image:
            assert image.size[0] > 300 and image.size[1] > 200
    # The sweep's runs evaluated sparsely: the report said so, once it was written.
    assert "evaluated only where they could reach the target" in capsys.readouterr().err
    # A malformed network is one line, before anything is written.
    assert main(["report", str(out), "--out", str(tmp_path / "bad"), "--network", "latency=0ms,bandwidth=1Gbit"]) == 2
    assert capsys.readouterr().err.strip() == "stlsgd: error: --network: latency: must be > 0, got '0ms'"
    assert not (tmp_path / "bad").exists()
    assert main(["report", str(out), "--out", str(tmp_path / "bad"), "--select", "time"]) == 2
    assert "--select time: needs --network" in capsys.readouterr().err


def test_a_sweep_of_an_older_stlsgd_is_priced_from_its_sweep_file_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/results' Table 2 sweeps but the two of 2026-11-27 predate client-step counts; their best.json names the
    sweep file relative to the repository, and the report replays its plans wherever it is run from."""
    from stlsgd.experiments.report import load_sweep_dir
    from stlsgd.experiments.time_report import row_usages

    monkeypatch.chdir(tmp_path)
    best = load_sweep_dir(Path(__file__).resolve().parents[2] / "docs/results/table2_data/table2_a9a_noniid")
    assert best["config"] == "configs/paper/table2_a9a_noniid.toml"
    assert "client_steps" not in best["methods"]["Local SGD"]["seeds"]["0"]  # an older stlsgd's record
    usages = {row.label: row.usage for row in row_usages(best)}
    # a9a: d = 123 float64s = 984 bytes a round. Local SGD k = 160 at batch 1, median over seeds 6,640 rounds;
    # SyncSGD one step a round, 146,000 rounds.
    assert (usages["Local SGD"].rounds, usages["Local SGD"].client_steps, usages["Local SGD"].bytes_per_client) == (
        6640,
        6640 * 160,
        6640 * 984,
    )
    assert (usages["SyncSGD"].client_steps, usages["SyncSGD"].bytes_per_client) == (146000, 146000 * 984)


def test_floor_only_without_run_directories_is_one_line_and_status_2(tmp_path: Path) -> None:
    # Records kept without their runs (as under docs/results) cannot price a floor: say where to point --out.
    (tmp_path / "table2plus_mnist_noniid").mkdir()
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_table2.py"
    args = ["--sweeps", "table2plus", "--columns", "mnist_noniid", "--floor-only", "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"bench_table2.py: error: --floor-only: {tmp_path / 'table2plus_mnist_noniid' / 'runs'} is missing: "
        "point --out at the sweeps' own output"
    )
