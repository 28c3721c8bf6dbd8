"""End-to-end runs of the command line on real data, as a user types them."""

import json
import os
import subprocess
import sys
from pathlib import Path

from stlsgd.cli import auto_missed, main

ROOT = Path(__file__).resolve().parents[2]


def stlsgd(*args, cwd=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "stlsgd", *args], capture_output=True, text=True, cwd=cwd, env=env)


def read_metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_run_writes_config_metrics_and_summary(tmp_path, shared_data):
    out = tmp_path / "run"
    proc = stlsgd(
        "run",
        str(ROOT / "configs/examples/a9a_stl_sc.toml"),
        "--data-dir",
        str(shared_data),
        "--out",
        str(out),
        "--set",
        "run.max_rounds=12",
        "--set",
        "algorithm.k=400",
    )
    assert proc.returncode == 0, proc.stderr
    assert "budget after 12 rounds" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "budget" and summary["rounds"] == 12 and summary["rounds_to_target"] is None
    metrics = read_metrics(out)
    assert [m["round"] for m in metrics] == list(range(1, 13))
    # eta_1 T_1 = 1/lambda: T_1 = ceil(32561/3.2) = 10176 iterations in ceil(10176/400) = 26 rounds of stage 1.
    assert all(m["stage"] == 1 and m["period"] == 400 and m["lr"] == 3.2 for m in metrics)
    assert metrics[-1]["iteration"] == 12 * 400 and metrics[-1]["bytes"] == 12 * 2 * 32 * 123 * 8
    assert all(m["gap"] > 0 for m in metrics)  # f* is the exact minimum: no iterate can beat it
    saved = (out / "config.yaml").read_text()
    assert "k: 400.0" in saved and "max_rounds: 12" in saved
    # The saved config reruns the same experiment into the same directory.
    assert main(["run", str(out / "config.yaml"), "--data-dir", str(shared_data), "--out", str(out), "--quiet"]) == 0


def test_stl_sc_reaches_gap_1e4_on_a9a(tmp_path, shared_data):
    """The issue's acceptance run: a9a IID shared, 32 clients, batch 1, target gap 1e-4."""
    out = tmp_path / "a9a"
    code = main(
        [
            "run",
            str(ROOT / "configs/examples/a9a_stl_sc.toml"),
            "--data-dir",
            str(shared_data),
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "reached"
    assert summary["final"]["gap"] <= 1e-4
    assert 10 <= summary["rounds_to_target"] <= 100
    assert summary["iterations_to_target"] == read_metrics(out)[-1]["iteration"]


def test_mnist49_run(tmp_path, shared_data):
    out = tmp_path / "mnist"
    code = main(
        [
            "run",
            str(ROOT / "configs/examples/a9a_stl_sc.toml"),
            "--data-dir",
            str(shared_data),
            "--out",
            str(out),
            "--quiet",
            "--set",
            "data.dataset=mnist49",
            "--set",
            "data.partition=noniid",
            "--set",
            "run.max_rounds=5",
            "--set",
            "algorithm.k=10",
        ]
    )
    assert code == 0
    metrics = read_metrics(out)
    assert len(metrics) == 5 and metrics[-1]["accuracy"] > 0.9
    assert metrics[-1]["bytes"] == 5 * 2 * 32 * 784 * 8


def test_demo_prints_table_and_writes_plot(tmp_path):
    proc = stlsgd("demo", "--out", str(tmp_path / "demo"), "--quiet")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["method", "rounds"]
    rounds = {line.split()[0]: int(line.split()[-3]) for line in lines[1:4] if line.split()[-3].isdigit()}
    assert set(rounds) == {"SyncSGD", "Local", "STL-SGD^sc"}
    assert rounds["STL-SGD^sc"] < rounds["Local"] < rounds["SyncSGD"]
    png = tmp_path / "demo" / "demo.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_config_is_one_line_and_exit_2(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text('[algorithm]\nmethod = "local_sgd"\nlr = -1\n')
    assert main(["run", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"stlsgd: error: {config}: algorithm.lr: Input should be greater than 0"
    assert not (tmp_path / "o").exists()


def test_a_sweep_file_given_to_run_and_a_config_given_to_sweep_say_which_command_takes_them(tmp_path, capsys):
    sweep = tmp_path / "s.toml"
    sweep.write_text('name = "s"\n[base.data]\ndataset = "digits49"\n[[methods]]\nmethod = "local_sgd"\n')
    config = tmp_path / "c.toml"
    config.write_text('[data]\ndataset = "digits49"\n')
    assert main(["run", str(sweep), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"stlsgd: error: {sweep}: a sweep file (it lists methods), not an experiment config: `stlsgd sweep {sweep}`"
    )
    assert main(["sweep", str(config), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"stlsgd: error: {config}: an experiment config (no methods), not a sweep file: `stlsgd run {config}`"
    )
    assert not (tmp_path / "o").exists()
    # suggest reads a sweep file's base: the data its columns share, as the same data in a config
    assert main(["suggest", str(sweep)]) == 0
    from_sweep = capsys.readouterr().out
    assert main(["suggest", str(config)]) == 0
    assert from_sweep == capsys.readouterr().out and from_sweep.startswith("n = 361, d = 64, N = 32 clients")


def test_suggest_on_a_sweep_file_proposes_for_its_auto_row_as_that_row_runs(tmp_path, capsys):
    """A row's fixed fields (here the budget) change auto's proposal: suggest reads the auto row, not the base."""
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        'name = "s"\n[base.data]\ndataset = "digits49"\n[base.run]\ntarget_gap = 1e-4\n'
        '[[methods]]\nmethod = "local_sgd"\ngrid = { lr = [0.1, 1.0] }\n'
        '[[methods]]\nmethod = "stl_sc"\nlabel = "auto"\nfixed = { auto = true, "run.max_iterations" = 2000 }\n'
    )
    config = tmp_path / "c.toml"
    config.write_text('[data]\ndataset = "digits49"\n[run]\ntarget_gap = 1e-4\nmax_iterations = 2000\n')
    assert main(["suggest", str(sweep)]) == 0
    first, *rest = capsys.readouterr().out.splitlines()
    assert first == f"for the row 'auto' of {sweep} (its base with the row's fields)"
    assert main(["suggest", str(config)]) == 0
    assert rest == capsys.readouterr().out.splitlines()
    assert "k = 2000:" in "\n".join(rest)  # the row's budget: one round of all of it
    # a longer budget plans a longer round
    assert main(["suggest", str(config), "--set", "run.max_iterations=200000"]) == 0
    assert "k = 2000:" not in capsys.readouterr().out
    # --set applies on top of the row
    assert main(["suggest", str(sweep), "--set", "run.max_iterations=200000"]) == 0
    assert "k = 2000:" not in capsys.readouterr().out


def test_data_list_names_the_paper_sets(capsys):
    assert main(["data", "list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"a9a", "mnist49", "digits49", "cifar10"} <= set(names)


def test_calibrate_writes_a_profile_that_network_reads(tmp_path, shared_data, capsys):
    """Two gloo processes on loopback measure c, alpha and beta of the digits problem; the profile is read back."""
    from stlsgd.costmodel import parse_network

    config = tmp_path / "digits.toml"
    config.write_text(
        '[data]\ndataset = "digits49"\nnum_clients = 4\n[algorithm]\nmethod = "local_sgd"\n'
        'lr = 0.5\nk = 10\nbatch = 4\n[run]\ntarget_gap = "none"\nmax_rounds = 5\n'
    )
    profile = tmp_path / "profile.json"
    assert main(["calibrate", str(config), "--out", str(profile), "--data-dir", str(shared_data)]) == 0
    assert f"profile: {profile}" in capsys.readouterr().out
    saved = json.loads(profile.read_text())
    measured = saved["measured"]
    assert saved["problem"] == {"dataset": "digits49"}
    assert measured["steps_per_call"] == 10 and measured["batch"] == 4 and measured["world_size"] == 2
    # c is one client's round of local steps per sample; alpha is at least the bare collective's round trip.
    assert saved["step_s"] == measured["round_compute_s"] / 40 > 0
    assert saved["latency_s"] >= measured["tiny_average_s"] > 0 and saved["bandwidth_Bps"] > 0
    network = parse_network(str(profile))
    assert (network.latency_s, network.step_s) == (saved["latency_s"], saved["step_s"])
    # --out naming a directory is refused in one line before anything runs.
    assert main(["calibrate", str(config), "--out", str(tmp_path), "--data-dir", str(shared_data)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"stlsgd: error: {tmp_path}: is a directory; --out names the profile file to write"
    )


def test_a_run_of_auto_that_ends_at_its_budget_after_the_models_rounds_says_the_model_was_wrong():
    # Hand-made summaries: the clients' models gave the plan 85 rounds.
    ended = {"status": "budget", "rounds": 123, "auto_model_rounds": 85, "final": {"gap": 8.105e-4}}
    assert auto_missed(ended) == (
        "algorithm.auto: the clients' models at x* gave this plan 85 rounds, and the run ended at its budget at a gap "
        "of 0.000811: they do not describe this data; a grid (stlsgd sweep) is the way to tune it "
        "(docs/results/schedules.md, *Every held-out set, as `auto` runs now*)"
    )
    assert auto_missed({**ended, "rounds": 84}) is None  # run.max_rounds ended it first: nothing said of the model
    assert auto_missed({**ended, "status": "reached"}) is None
    assert auto_missed({**ended, "auto_model_rounds": None}) is None  # the stationary stages, or no auto
