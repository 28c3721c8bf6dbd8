"""Checkpoints: atomic files, exact round trip, and resume after SIGKILL ending bit-identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from stlsgd.algorithms import Cursor
from stlsgd.executors.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from stlsgd.executors.simulator import RunState
from stlsgd.experiments.config import load_config
from stlsgd.experiments.rundir import CHECKPOINT_FILE, FINAL_PARAMS_FILE, LOCK_FILE, METRICS_FILE, SUMMARY_FILE
from stlsgd.experiments.runner import run_experiment

# compute_s, comm_s and wall_s are the fields that measure time; they end every metrics line, so deleting their
# text leaves every other byte of the line to compare exactly.
WALL = re.compile(rb', "compute_s": [-+0-9.eE]+, "comm_s": [-+0-9.eE]+, "wall_s": [-+0-9.eE]+\}\n')


def without_wall(metrics: bytes) -> bytes:
    stripped, count = WALL.subn(b"}\n", metrics)
    assert count == metrics.count(b"\n"), "every metrics line ends with its wall_s field"
    return stripped


def assert_same_run(a: Path, b: Path) -> None:
    """Same final parameters (bits), same metrics.jsonl bytes but for wall_s, same summary but for wall_s."""
    with np.load(a / FINAL_PARAMS_FILE) as pa, np.load(b / FINAL_PARAMS_FILE) as pb:
        assert pa.files == pb.files
        for key in pa.files:
            assert pa[key].dtype == pb[key].dtype and pa[key].tobytes() == pb[key].tobytes()
    assert without_wall((a / METRICS_FILE).read_bytes()) == without_wall((b / METRICS_FILE).read_bytes())
    sa, sb = (json.loads((d / SUMMARY_FILE).read_text()) for d in (a, b))
    for s in (sa, sb):
        for key in ("wall_s", "compute_s", "comm_s"):
            s.pop(key)
            s["final"].pop(key, None)
    assert sa == sb


# --------------------------------------------------------------------------- the file format


def _state(torch_values: bool) -> RunState:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 7))
    w[0, 0] = np.nextafter(1.0, 2.0)  # the last bit must survive
    clients = {"w": torch.from_numpy(w.copy()).float(), "steps": torch.arange(4)} if torch_values else {"w": w}
    anchor = {k: v[:1].clone() if torch_values else v[:1].copy() for k, v in clients.items()}
    sampler = np.random.Generator(np.random.PCG64(12345))
    sampler.random(17)
    cursor = Cursor(index=9, iteration=4321, samples=8642, stage=3, stage_start=4000, memo=(1.5,)).to_dict()
    return RunState(
        clients=clients,
        sampler_state=sampler.bit_generator.state,
        cursor=cursor,
        anchor=anchor,
        bytes=10**12,
        wall_s=1.25,
        last_eval_iteration=4000,
        status="running",
        objective=0.1 + 0.2,
        last={"round": 9, "objective": 0.1 + 0.2, "gap": None},
    )


@pytest.mark.parametrize("torch_values", [False, True], ids=["numpy", "torch"])
def test_round_trip_is_exact(tmp_path: Path, torch_values: bool) -> None:
    state = _state(torch_values)
    meta = {"config": {"a": [1, 2.5]}, "metrics_bytes": 77}
    save_checkpoint(tmp_path / "ckpt", state, meta)
    loaded, loaded_meta = load_checkpoint(tmp_path / "ckpt")
    assert loaded_meta == meta
    for field in ("clients", "anchor"):
        original, restored = getattr(state, field), getattr(loaded, field)
        assert original.keys() == restored.keys()
        for key in original:
            assert type(restored[key]) is type(original[key])
            a = original[key].numpy() if torch_values else original[key]
            b = restored[key].numpy() if torch_values else restored[key]
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if not torch_values:
        assert loaded.clients["w"].flags.writeable  # the simulator steps these arrays in place
    for field in (
        "sampler_state",
        "cursor",
        "round",
        "iteration",
        "stage",
        "bytes",
        "wall_s",
        "last_eval_iteration",
        "status",
        "rounds_to_target",
        "iterations_to_target",
        "objective",
        "last",
    ):
        assert getattr(loaded, field) == getattr(state, field), field
    # The restored PCG64 state continues the same stream.
    g1, g2 = (np.random.Generator(np.random.PCG64()) for _ in range(2))
    g1.bit_generator.state, g2.bit_generator.state = state.sampler_state, loaded.sampler_state
    assert g1.random(5).tobytes() == g2.random(5).tobytes()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary file left behind


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(path, _state(False), {"n": 1})
    before = path.read_bytes()

    def broken_save(obj: object, fh) -> None:  # a crash half-way through writing the new file
        fh.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        save_checkpoint(path, _state(False), {"n": 2})
    assert path.read_bytes() == before
    assert load_checkpoint(path)[1] == {"n": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


@pytest.mark.parametrize("content", [b"", b"garbage" * 10, b"PK\x03\x04truncated zip"], ids=["empty", "text", "zip"])
def test_damaged_checkpoint_is_a_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        load_checkpoint(path)


def test_a_flipped_bit_in_the_tensor_data_is_refused(tmp_path: Path) -> None:
    # The zip container does not check its members: without the checksum this loaded wrong numbers silently.
    path = tmp_path / "checkpoint"
    state = _state(False)
    save_checkpoint(path, state, {"n": 1})
    data = bytearray(path.read_bytes())
    at = bytes(data).find(state.clients["w"].tobytes()[8:16])  # inside the stored float64 values
    assert at > 0
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(err.value) == (
        f"{path}: damaged checkpoint (its checksum does not match its content); delete it to "
        "start the run afresh, or restore a good copy"
    )


def test_a_foreign_torch_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    torch.save({"json": json.dumps({"format": "something-else"}), "tensors": {}}, path)
    with pytest.raises(CheckpointError, match="not a valid stlsgd checkpoint"):
        load_checkpoint(path)


# --------------------------------------------------------------------------- resume in process


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(body)
    return path


NC_CONFIG = """
name = "nc-resume"
[data]
dataset = "digits49"
num_clients = 6
partition = "noniid"
s = 20
[algorithm]
method = "stl_nc"
lr = 0.5
k = 3
T1 = 60
gamma = 5.0
[run]
target_gap = 1e-9
max_rounds = 70
eval_every = 2
"""


def test_interrupted_stl_nc_resumes_to_the_same_bits(tmp_path: Path) -> None:
    """STL-SGD^nc (Algorithm 3): the proximal anchor and the stage position must come back from the checkpoint."""
    exp = load_config(_config(tmp_path, NC_CONFIG))
    run_experiment(exp, tmp_path / "whole", progress=False, checkpoint_every=4)

    def interrupt(state: RunState, rnd: object) -> None:
        if state.round == 31:  # mid-stage, 3 rounds past the checkpoint of round 28
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(exp, tmp_path / "cut", progress=False, checkpoint_every=4, on_round=interrupt)
    state, meta = load_checkpoint(tmp_path / "cut" / CHECKPOINT_FILE)
    assert state.round == 28 and state.anchor is not None and state.status == "running"
    assert (tmp_path / "cut" / METRICS_FILE).stat().st_size > meta["metrics_bytes"]  # lines to cut back

    summary = run_experiment(exp, tmp_path / "cut", progress=False, resume=True)
    assert summary["status"] == "budget" and summary["rounds"] == 70
    assert_same_run(tmp_path / "whole", tmp_path / "cut")


def test_resuming_a_finished_run_changes_nothing(tmp_path: Path) -> None:
    exp = load_config(_config(tmp_path, NC_CONFIG))
    out = tmp_path / "run"
    first = run_experiment(exp, out, progress=False, checkpoint_every=10)
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.name != LOCK_FILE}
    again = run_experiment(exp, out, progress=False, resume=True)
    assert again == first
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != LOCK_FILE} == files


def test_resume_refuses_a_metrics_file_that_is_not_the_checkpointed_one(tmp_path: Path, cli) -> None:
    config = _config(tmp_path, NC_CONFIG)
    out = tmp_path / "run"
    exp = load_config(config)

    def interrupt(state: RunState, rnd: object) -> None:
        if state.round == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(exp, out, progress=False, checkpoint_every=4, on_round=interrupt)
    metrics = out / METRICS_FILE
    metrics.write_bytes(metrics.read_bytes().replace(b'"round": 2,', b'"round": 3,'))
    before = metrics.read_bytes()
    code, _, err = cli("run", config, "--out", out, "--resume", "--quiet")
    assert code == 2 and err.count("\n") == 1 and str(metrics) in err and "cannot resume exactly" in err
    assert metrics.read_bytes() == before


def test_resume_without_a_checkpoint_starts_afresh(tmp_path: Path) -> None:
    exp = load_config(_config(tmp_path, NC_CONFIG))
    run_experiment(exp, tmp_path / "plain", progress=False)
    run_experiment(exp, tmp_path / "fresh", progress=False, resume=True)
    assert_same_run(tmp_path / "plain", tmp_path / "fresh")
    assert not (tmp_path / "fresh" / CHECKPOINT_FILE).exists()


# --------------------------------------------------------------------------- SIGKILL and resume

# STL-SGD^sc (Algorithm 2), IID: every stage has T_s / k_s = T1 / k1 = 8 rounds, so with checkpoints every
# 5 rounds and 36 rounds in all (4.5 stages) no checkpoint falls on a stage boundary: resume is always mid-stage.
KILL_CONFIG = """
name = "kill-resume"
[data]
dataset = "digits49"
num_clients = 8
[algorithm]
method = "stl_sc"
lr = 0.05
k = 125
T1 = 1000
[run]
target_gap = 1e-12
max_rounds = 36
"""
ROUNDS_PER_STAGE = 8


def _stlsgd(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "stlsgd", *map(str, args)]


def test_sigkill_mid_stage_then_resume_is_bit_identical(tmp_path: Path, cli) -> None:
    config = _config(tmp_path, KILL_CONFIG)
    run_experiment(load_config(config), tmp_path / "whole", progress=False)

    out = tmp_path / "killed"
    # Checkpoints after rounds 5, 10, 15; the run kills itself after round 17, mid-stage 3 (rounds 17-24): the
    # metrics lines of rounds 16 and 17 come after the last checkpoint, and the resume must cut them.
    proc = subprocess.run(
        _stlsgd("run", config, "--out", out, "--checkpoint-every", "5", "--quiet"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "STLSGD_FAULT": "die-after-round=17"},
        timeout=300,
    )
    checkpoint, metrics = out / CHECKPOINT_FILE, out / METRICS_FILE
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    state, meta = load_checkpoint(checkpoint)
    assert state.status == "running" and 0 < state.round < 36 and state.round % ROUNDS_PER_STAGE != 0
    assert state.round == 15 and metrics.stat().st_size > meta["metrics_bytes"]
    assert not (out / SUMMARY_FILE).exists() and not (out / FINAL_PARAMS_FILE).exists()

    # The config is read back from the run directory; the resume runs in this process (one start-up less).
    code, stdout, stderr = cli("run", out / "config.yaml", "--out", out, "--resume", "--quiet")
    assert code == 0, stderr
    assert "budget after 36 rounds" in stdout
    assert_same_run(tmp_path / "whole", out)
    lines = (out / METRICS_FILE).read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == list(range(1, 37))  # none twice, none lost
    assert not [p for p in out.iterdir() if p.name.startswith(".") and p.name != LOCK_FILE]  # no temporary files left
