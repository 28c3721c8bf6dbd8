"""The one run lifecycle under real launches: simulator and torch.distributed bit for bit after every round, on
any number of ranks, and a run killed between its final checkpoint and its summary resumed without a step more
(two ranks started with torchrun's environment; torchrun's own agent is tested in test_dist_launch.py).

The distributed sides of the comparisons come from the session's shared launches (one per world size, ranks
started with torchrun's environment: tests/distributed/dist_jobs.py, run by tests/distributed/dist_worker.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from dist_helpers import PYTHON, REPO, launch_env, run_ranks
from dist_jobs import A9A, A9A_SET, write_config

from stlsgd.experiments.config import load_config
from stlsgd.experiments.runner import run_experiment

WORKER = REPO / "tests" / "distributed" / "lifecycle_worker.py"

pytestmark = pytest.mark.launch


def test_simulator_and_1_2_4_ranks_average_to_the_same_bits_after_every_round(
    tmp_path: Path, shared_data: Path, dist_runs
) -> None:
    sets = [*A9A_SET, f"data.data_dir={shared_data}"]
    exp = load_config(A9A, sets)
    sim_rounds: list[np.ndarray] = []
    run_experiment(
        exp, tmp_path / "sim", progress=False, on_round=lambda st, rnd: sim_rounds.append(st.clients["w"].copy())
    )
    assert len(sim_rounds) == 43  # 11 + 11 + 11 rounds of stages 1-3, 10 of stage 4 to pass 15,000
    for ranks in (1, 2, 4):
        out = dist_runs(ranks, "a9a")
        for rank in range(ranks):
            with np.load(out / f"trace_rank{rank}.npz") as trace:
                rows = [trace[f"arr_{i}"] for i in range(len(trace.files))]
            assert len(rows) == len(sim_rounds)
            share = 32 // ranks
            for r, (got, want) in enumerate(zip(rows, sim_rounds)):
                assert np.array_equal(got, want[rank * share : (rank + 1) * share]), (ranks, rank, r)
        with np.load(out / "run" / "final_params.npz") as d, np.load(tmp_path / "sim" / "final_params.npz") as s:
            assert d.files == s.files and all(np.array_equal(d[k], s[k]) for k in d.files)
    # The order matters at this lr: per-rank partial sums, then their sum, give other numbers after round 1.
    w = sim_rounds[0][0]
    assert np.abs(w).max() > 0.1


def test_drift_correction_and_the_outer_step_on_ranks_are_the_simulators_bits(tmp_path: Path, dist_runs) -> None:
    # 5 clients on 2 ranks (3 + 2): the control variates are per client (from each round's first 3 of 4 steps),
    # gathered for the checkpoints.
    config = write_config(tmp_path, "drift")
    sim: list[np.ndarray] = []

    def record(st, rnd) -> None:
        sim.extend([st.clients["w"].copy(), st.control["w"].copy()])

    run_experiment(load_config(config), tmp_path / "sim", progress=False, checkpoint_every=4, on_round=record)
    out = dist_runs(2, "drift")
    for rank, rows in ((0, slice(0, 3)), (1, slice(3, 5))):
        with np.load(out / f"trace_rank{rank}.npz") as trace:
            got = [trace[f"arr_{i}"] for i in range(len(trace.files))]
        assert len(got) == len(sim) == 30
        for i, (g, want) in enumerate(zip(got, sim)):
            assert np.array_equal(g, want[rows]), (rank, i // 2, "model" if i % 2 == 0 else "control")
    # The final checkpoints hold every client's control variate: the same file content either way.
    from stlsgd.executors.checkpoint import load_checkpoint

    d_state, _ = load_checkpoint(out / "run" / "checkpoint")
    s_state, _ = load_checkpoint(tmp_path / "sim" / "checkpoint")
    assert np.array_equal(d_state.control["w"], s_state.control["w"])
    assert np.array_equal(d_state.outer_momentum["w"], s_state.outer_momentum["w"])


@pytest.mark.parametrize("method", ["adacomm", "qsr", "stl_auto"])
def test_the_new_schedules_on_ranks_are_the_simulators_bits(tmp_path: Path, method: str, dist_runs) -> None:
    # AdaComm reads the loss rank 0 evaluates (broadcast with the verdict); QSR's period follows its own lr;
    # auto's stationary stages end, and its period grows, on the objectives fed back.
    config = write_config(tmp_path, method)
    run_experiment(load_config(config), tmp_path / "sim", progress=False)
    dist_out = dist_runs(2, method)
    dist_lines, sim_lines = (
        _strip_wall(dist_out / "metrics.jsonl"),
        _strip_wall(tmp_path / "sim" / "metrics.jsonl"),
    )
    assert dist_lines == sim_lines
    assert len({m["period"] for m in sim_lines}) > 1  # the period did adapt
    with np.load(dist_out / "final_params.npz") as a, np.load(tmp_path / "sim" / "final_params.npz") as b:
        assert np.array_equal(a["w"], b["w"])


def _strip_wall(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        for key in ("wall_s", "compute_s", "comm_s"):
            line.pop(key)
    return lines


@pytest.mark.parametrize("backend", ["sim", "dist"])
def test_a_run_killed_between_its_final_checkpoint_and_its_summary_resumes_without_another_step(
    tmp_path: Path, backend: str
) -> None:
    config = tmp_path / "c.toml"
    # The target is reached in round 95, mid-stage: a step after the resume would move every number.
    config.write_text(
        'name = "k"\n[data]\ndataset = "digits49"\nnum_clients = 4\n[algorithm]\nmethod = "stl_sc"\n'
        "lr = 0.8\nk = 4\n[run]\ntarget_gap = 1e-3\nmax_rounds = 400\n"
    )
    whole = run_experiment(load_config(config), tmp_path / "whole", progress=False, checkpoint_every=5)
    assert (whole["status"], whole["rounds_to_target"]) == ("reached", 95)
    out = tmp_path / "killed"
    if backend == "dist":
        result = run_ranks(2, [WORKER, "kill-before-summary", out, config], timeout=300)
        assert result.returncode == -9, result.stderr[-3000:]
    else:
        code = subprocess.run(
            [
                PYTHON,
                "-c",
                "import os, signal, sys; from stlsgd.experiments import rundir; "
                "rundir.write_final_params = lambda *a: os.kill(os.getpid(), signal.SIGKILL); "
                "from stlsgd.cli import main; sys.exit(main(sys.argv[1:]))",
                "run",
                str(config),
                "--out",
                str(out),
                "--checkpoint-every",
                "5",
                "--quiet",
            ],
            cwd=REPO,
            env=launch_env(),
            capture_output=True,
            text=True,
            timeout=120,
        ).returncode
        assert code == -9
    assert (out / "checkpoint").is_file() and not (out / "summary.json").exists()
    metrics_before = (out / "metrics.jsonl").read_bytes()

    if backend == "dist":
        args = ["-m", "stlsgd", "run", config, "--out", out, "--resume", "--quiet", "--backend", "dist"]
        result = run_ranks(2, args, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        run_experiment(load_config(config), out, progress=False, resume=True)
    assert (out / "metrics.jsonl").read_bytes() == metrics_before  # not a line more
    summary, expected = (json.loads((d / "summary.json").read_text()) for d in (out, tmp_path / "whole"))
    for s in (summary, expected):
        for key in ("backend", "wall_s", "compute_s", "comm_s"):
            s.pop(key)
            s["final"].pop(key, None)
    assert summary == expected
    assert _strip_wall(out / "metrics.jsonl") == _strip_wall(tmp_path / "whole" / "metrics.jsonl")
    with np.load(out / "final_params.npz") as a, np.load(tmp_path / "whole" / "final_params.npz") as b:
        assert np.array_equal(a["w"], b["w"])
