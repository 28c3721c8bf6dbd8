"""Reliability round three (the findings of the third adversarial round that these files own): nothing outside
the output directory is touched through a symbolic link, the demo asks before replacing runs, the report is
written whole or not at all, cost-model figures make physical sense, and the newer commands keep the one-line
promise. Each test failed before its fix.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from base_run import BASE
from test_bad_input import assert_one_line_error

from stlsgd.costmodel import Network as CostNetwork
from stlsgd.costmodel import parse_network, read_profile, write_profile
from stlsgd.data import readers
from stlsgd.errors import StlsgdError
from stlsgd.experiments.sweeps import spec as sweep_spec

ROOT = Path(__file__).resolve().parents[2]

SWEEP = """\
name = "s"
seeds = [0]
[base.data]
dataset = "digits49"
num_clients = 4
[base.run]
max_rounds = 300
target_gap = 1e-2
[[methods]]
method = "sync_sgd"
grid = { lr = [0.5] }
[[methods]]
method = "local_sgd"
grid = { lr = [0.5], k = [4] }
"""


def _config(tmp: Path, text: str = BASE.format(dataset="digits49")) -> Path:
    path = tmp / "c.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small finished sweep (SyncSGD and Local SGD on digits, both reach gap 1e-2), made once."""
    from stlsgd.cli import main

    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "sw.toml").write_text(SWEEP)
    assert main(["sweep", str(tmp / "sw.toml"), "--out", str(tmp / "S"), "--jobs", "1", "--quiet"]) == 0
    return tmp / "S"


def _copy_sweep(finished: Path, to: Path) -> Path:
    shutil.copytree(finished, to, symlinks=True)
    (to / ".stlsgd.lock").unlink(missing_ok=True)
    return to


def _around(root: Path, skip: Path) -> dict[str, bytes | str]:
    """Every file and link under ``root`` except those under ``skip``: bytes, or the link's target."""
    seen: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        if path == skip or skip in path.parents:
            continue
        if path.is_symlink():
            seen[str(path)] = "-> " + os.readlink(path)
        elif path.is_file():
            seen[str(path)] = path.read_bytes()
    return seen


def _plant_links(out: Path, outside: Path, names: list[str]) -> None:
    """In ``out``: links to outside files (one of them ending 'a\\nb'), and one dangling link per name."""
    out.mkdir(parents=True, exist_ok=True)
    outside.mkdir(exist_ok=True)
    for i, name in enumerate(names):
        if i % 2:
            (out / name).symlink_to(outside / f"not-yet-{i}")  # dangling: must not be created
        else:
            target = outside / f"victim-{i}"
            target.write_bytes(b"a\nb")
            (out / name).symlink_to(target)


# --------------------------------------------------------------------------- 1: symbolic links inside --out


LINKED = {
    "run": [".stlsgd.lock", "metrics.jsonl", "summary.json", "config.yaml", "checkpoint"],
    "sweep": ["results.jsonl", ".stlsgd.lock", "best.json"],
    "demo": ["demo.png", "sync_sgd"],
}


@pytest.mark.parametrize("command", list(LINKED))
def test_links_inside_out_are_refused_and_nothing_outside_changes(tmp_path: Path, cli, command: str) -> None:
    out, outside = tmp_path / "O", tmp_path / "outside"
    _plant_links(out, outside, LINKED[command])
    (tmp_path / "sw.toml").write_text(SWEEP)
    args = {
        "run": ["run", _config(tmp_path), "--out", out, "--quiet", "--checkpoint-every", "5"],
        "sweep": ["sweep", tmp_path / "sw.toml", "--out", out, "--jobs", "1", "--quiet"],
        "demo": ["demo", "--out", out, "--quiet", "--overwrite"],
    }[command]
    before = _around(tmp_path, out)
    inside = sorted(p.name for p in out.iterdir())
    err = assert_one_line_error(cli(*args), "symbolic link")
    assert str(out) in err
    assert _around(tmp_path, out) == before  # no file outside --out created or changed
    assert sorted(p.name for p in out.iterdir()) == inside  # and nothing written inside either


def test_a_link_of_a_run_directory_alone_is_refused_too(tmp_path: Path, cli) -> None:
    # Only the metrics file: the run must not truncate the file it points at.
    out, victim = tmp_path / "O", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("keep me\n")
    (out / "metrics.jsonl").symlink_to(victim)
    assert_one_line_error(cli("run", _config(tmp_path), "--out", out, "--quiet"), out / "metrics.jsonl")
    assert victim.read_text() == "keep me\n"


def test_files_are_opened_without_following_links(tmp_path: Path) -> None:
    # A link appearing after the directory was checked: the write fails (ELOOP), the target is untouched.
    from stlsgd.files import append_jsonl, lock_directory

    victim = tmp_path / "victim"
    victim.write_bytes(b"a\nb")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "results.jsonl").symlink_to(victim)
    with pytest.raises(OSError) as info:
        append_jsonl(tmp_path / "d" / "results.jsonl", {"x": 1})
    assert info.value.errno == 40 or "symbolic" in str(info.value)
    assert victim.read_bytes() == b"a\nb"
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / ".stlsgd.lock").symlink_to(victim)
    with pytest.raises(StlsgdError, match="symbolic link"):
        lock_directory(tmp_path / "e")
    assert victim.read_bytes() == b"a\nb"


def test_report_replaces_links_of_its_file_names_and_never_writes_through_them(
    tmp_path: Path, cli, finished_sweep: Path
) -> None:
    out, outside = tmp_path / "R", tmp_path / "outside"
    _plant_links(out, outside, ["table.md", "table.csv", "table_rounds.png", "table_latency.png"])
    before = _around(tmp_path, out)
    code, _, err = cli("report", finished_sweep, "--out", out)
    assert code == 0, err
    assert _around(tmp_path, out) == before
    names = sorted(p.name for p in out.iterdir())
    assert names == ["table.csv", "table.md", "table_compute.png", "table_epochs.png", "table_rounds.png"]
    assert not any(p.is_symlink() for p in out.iterdir())


# --------------------------------------------------------------------------- 2: demo asks first


def test_demo_refuses_to_replace_runs_already_in_out(tmp_path: Path, cli) -> None:
    run = tmp_path / "D" / "local_sgd"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("mine: 1\n")
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    before = _around(tmp_path, tmp_path / "nothing")
    assert_one_line_error(cli("demo", "--out", tmp_path / "D", "--quiet"), run, "--overwrite")
    assert _around(tmp_path, tmp_path / "nothing") == before


# --------------------------------------------------------------------------- 3: the report is atomic


def test_a_report_failing_half_way_leaves_the_old_report_as_it_was(tmp_path: Path, cli, finished_sweep: Path) -> None:
    sweep = _copy_sweep(finished_sweep, tmp_path / "S")
    out = tmp_path / "R"
    code, _, err = cli("report", sweep, "--out", out)
    assert code == 0, err
    (out / "notes.txt").write_text("the user's own file\n")
    before = _around(out, tmp_path / "nothing")
    best = json.loads((sweep / "best.json").read_text())
    metrics = sweep / best["methods"]["local_sgd"]["run_dir"] / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    lines[2] = json.dumps({k: v for k, v in json.loads(lines[2]).items() if k != "round"})
    metrics.write_text("\n".join(lines) + "\n")
    err = assert_one_line_error(cli("report", sweep, "--out", out, "--network", "datacenter,step=1us"))
    assert f"{metrics}:3:" in err and "round" in err
    assert _around(out, tmp_path / "nothing") == before  # no table rewritten, no latency figure added
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".R.")]  # the temporary folder is gone


def test_a_report_drops_its_own_stale_figures_and_keeps_other_files(tmp_path: Path, cli, finished_sweep: Path) -> None:
    out = tmp_path / "R"
    assert cli("report", finished_sweep, "--out", out, "--network", "datacenter,step=1us")[0] == 0
    assert (out / "table_latency.png").is_file()
    (out / "other.md").write_text("x\n")
    assert cli("report", finished_sweep, "--out", out)[0] == 0
    assert not (out / "table_latency.png").exists()  # an old figure is not left mixed with the new ones
    assert (out / "other.md").read_text() == "x\n"


def test_a_refused_report_leaves_no_output_directory(tmp_path: Path, cli, finished_sweep: Path) -> None:
    profile = tmp_path / "p.json"
    write_profile(profile, CostNetwork(1e-3, 1e9, 1e-6), {"dataset": "a9a"}, {})
    out = tmp_path / "new" / "R"
    assert_one_line_error(cli("report", finished_sweep, "--out", out, "--network", profile), "a9a")
    assert not (tmp_path / "new").exists()


# --------------------------------------------------------------------------- 8, 9, 11: pricing


@pytest.mark.parametrize(
    "text",
    [
        "latency=1ms,bandwidth=1e-305B,step=1us",
        "latency=1e308s,bandwidth=1Gbit,step=1us",
        "latency=7200s,bandwidth=1Gbit",
        "latency=1ms,bandwidth=1Gbit,step=1e300s",
        "latency=1ms,bandwidth=0.5B",
    ],
)
def test_network_figures_outside_physical_sense_are_refused(text: str) -> None:
    with pytest.raises(StlsgdError, match="makes no physical sense"):
        parse_network(text)


def test_a_profile_with_a_denormal_bandwidth_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    doc = {"format": "stlsgd-network-profile", "version": 1, "problem": {}, "latency_s": 1e-3}
    path.write_text(json.dumps({**doc, "bandwidth_Bps": 5e-324, "step_s": 1e-6, "measured": {}}))
    with pytest.raises(StlsgdError, match="bandwidth_Bps"):
        read_profile(path)


def test_the_report_never_prints_inf_seconds(tmp_path: Path, cli, finished_sweep: Path) -> None:
    out = tmp_path / "R"
    net = "latency=1ms,bandwidth=1e-305B,step=1us"
    assert_one_line_error(cli("report", finished_sweep, "--out", out, "--network", net), "bandwidth")
    assert not out.exists()


def test_a_copied_stored_sweep_says_why_its_times_are_missing(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sweep of an older stlsgd, whose records have no client-step counts: its plans must be replayed.
    shutil.copytree(ROOT / "docs/results/table2_data/table2_a9a_noniid", tmp_path / "X")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("report", "X", "--out", "R", "--network", "cross-region,step=1us")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "configs/paper/table2_a9a_noniid.toml" in line]
    assert len(warnings) == 1 and "not found" in warnings[0] and "cannot be rebuilt" in warnings[0]
    assert "Note: X/best.json" in (tmp_path / "R" / "table.md").read_text()


def test_a_preset_without_step_when_no_row_reached_the_target(tmp_path: Path, cli, finished_sweep: Path) -> None:
    sweep = _copy_sweep(finished_sweep, tmp_path / "S")
    best = json.loads((sweep / "best.json").read_text())
    for info in best["methods"].values():
        info["median"] = info["min"] = info["max"] = None
        info["seeds_reached"] = 0
        for rec in info["seeds"].values():
            rec["status"] = "budget"
            rec["rounds_to_target"] = None
    (sweep / "best.json").write_text(json.dumps(best))
    code, _, err = cli("report", sweep, "--out", tmp_path / "R", "--network", "datacenter")
    assert code == 0, err
    assert "step not given" in (tmp_path / "R" / "table.md").read_text()


# --------------------------------------------------------------------------- 10, 12, 15: configs


def test_a_run_without_any_stop_rule_is_refused(tmp_path: Path, cli) -> None:
    args = ["--set", "run.max_rounds=none", "--set", "run.max_iterations=none", "--set", "run.target_gap=none"]
    out = tmp_path / "O"
    assert_one_line_error(cli("run", _config(tmp_path), "--out", out, *args), "no stop rule")
    assert not out.exists()


@pytest.mark.parametrize("override", ["algorithm.lr=1e-320", "problem.lam=1e-320", "algorithm.lr=1e-20"])
def test_stl_sc_first_stage_overflow_is_one_line(tmp_path: Path, cli, override: str) -> None:
    config = _config(tmp_path, BASE.format(dataset="digits49").replace('"local_sgd"', '"stl_sc"'))
    assert_one_line_error(cli("run", config, "--out", tmp_path / "O", "--set", override), "T_1")
    assert not (tmp_path / "O").exists()


def test_a_name_with_a_newline_is_refused(tmp_path: Path, cli) -> None:
    assert_one_line_error(cli("run", _config(tmp_path), "--out", tmp_path / "O", "--set", 'name="a\\nb"'), "name")


def test_a_sweep_label_with_a_nul_is_refused_for_that_reason(tmp_path: Path, cli) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.replace('method = "sync_sgd"', 'method = "sync_sgd"\nlabel = "a\\u0000b"'))
    err = assert_one_line_error(cli("sweep", path, "--out", tmp_path / "O"), "label", "control characters")
    assert "\0" not in err


def test_tensorboard_on_a_file_is_refused_before_anything_is_written(tmp_path: Path, cli) -> None:
    afile = tmp_path / "tb"
    afile.write_text("x")
    out = tmp_path / "O"
    assert_one_line_error(cli("run", _config(tmp_path), "--out", out, "--tensorboard", afile), "--tensorboard")
    assert not out.exists()


def test_calibrate_into_a_missing_folder_is_refused_before_measuring(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stlsgd.experiments import calibrate

    def measured(*args: object) -> None:
        raise AssertionError("measured before checking --out")

    monkeypatch.setattr(calibrate, "build", measured)
    out = tmp_path / "missing" / "p.json"
    assert_one_line_error(cli("calibrate", _config(tmp_path), "--out", out), "missing", "does not exist")


def test_a_fifo_as_the_config_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or str(ROOT / "src")}
    p = subprocess.run(
        [sys.executable, "-m", "stlsgd", "run", str(fifo), "--out", str(tmp_path / "O")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 2 and "special file" in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_limit_expands_only_the_settings_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lrs = ", ".join(str(0.001 * (i + 1)) for i in range(50))
    ks = ", ".join(str(i + 1) for i in range(40))
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "big"\n[base.data]\ndataset = "digits49"\n[[methods]]\nmethod = "local_sgd"\n'
        f"grid = {{ lr = [{lrs}], k = [{ks}] }}\n"
        '[[methods]]\nmethod = "sync_sgd"\nlabel = "other"\ngrid = { lr = [0.1, 0.2] }\n'
    )
    calls: list[str] = []
    real = sweep_spec.validate

    def counting(raw: dict, source: str):  # type: ignore[no-untyped-def]
        calls.append(source)
        return real(raw, source)

    monkeypatch.setattr(sweep_spec, "validate", counting)
    sweep = sweep_spec.load_sweep(path, limit=1)
    assert [s.settings for s in sweep.grid] == [{"lr": 0.001, "k": 1}, {"lr": 0.1}]
    assert len(calls) == 2  # not the 2,000 settings of the first row
    calls.clear()
    assert len(sweep_spec.load_sweep(path, only=["other"]).grid) == 2
    assert len(calls) == 2  # the row not run is not expanded


# --------------------------------------------------------------------------- 14: decompression bombs


def _gz(lines: int) -> bytes:
    return gzip.compress(b"+1 1:1\n-1 2:1\n" * (lines // 2), compresslevel=9)


def test_a_registered_dataset_inflating_beyond_its_declared_rows_is_refused(tmp_path: Path, cli) -> None:
    data = tmp_path / "dd" / "a9a"
    data.mkdir(parents=True)
    (data / "a9a.gz").write_bytes(_gz(40_000))  # a9a declares 32,561 rows
    out = tmp_path / "O"
    args = ["--data-dir", tmp_path / "dd", "--set", "data.dataset=a9a"]
    assert_one_line_error(cli("run", _config(tmp_path), "--out", out, *args), "a9a.gz", "32,561 lines")
    assert not out.exists()


def test_a_compressed_file_inflating_too_far_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bomb.svm.gz"
    path.write_bytes(_gz(400_000))  # 2.8 MB inflated from about 8 KB
    monkeypatch.setattr(readers, "MIN_INFLATED", 2**20)
    with pytest.raises(StlsgdError, match="decompression bomb"):
        readers.read_svmlight(path)
    idx = tmp_path / "bomb-idx.gz"
    idx.write_bytes(gzip.compress(bytes(4) + bytes(3_000_000), compresslevel=9))
    with pytest.raises(StlsgdError, match="decompression bomb"):
        readers.read_idx(idx)


def test_real_data_files_stay_within_the_caps() -> None:
    shared = ROOT.parent / "shared" / "data"
    for rel, rows in (("a9a/a9a.gz", 32_561), ("a9a/a9a.t.gz", 16_281)):
        if (shared / rel).is_file():
            readers._check_inflated(shared / rel, rows)
    assert readers._inflation_cap(197_533) == 64 * 2**20  # a9a.gz: 2.3 MB inflated, far below
