"""Run one experiment with the simulator and write its results: config, metrics, summary, final parameters.

Output directory layout (every name below is owned by this module):

- ``config.yaml``: the validated experiment; a directory holds one run, so a different config is refused
  unless ``overwrite`` (the same config may be rerun in place);
- ``metrics.jsonl``: one JSON line per evaluation of the averaged model;
- ``summary.json``: status, rounds/iterations to target, the last finite metrics (``final``);
- ``final_params.npz``: the averaged model after the last round (one array per state key);
- ``checkpoint``: with ``checkpoint_every``, the :class:`RunState` after every R-th round plus the length
  (lines, bytes, sha256) of ``metrics.jsonl`` at that moment, written atomically.

Resuming loads the checkpoint, cuts ``metrics.jsonl`` back to the recorded length (lines written after the
checkpoint would otherwise appear twice) and runs the plan on from the saved round. Plans, the sampler and
the local steps are deterministic functions of that state, so the resumed run ends bit-identical to an
uninterrupted one; only the ``wall_s`` fields, which measure time, differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import platformdirs

from stlsgd.atomic import atomic_write
from stlsgd.errors import ConfigError, StlsgdError
from stlsgd.executors.checkpoint import TMP_PREFIX, TMP_SUFFIX, CheckpointError, load_checkpoint, save_checkpoint
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import Callback, RunState, StopRule, init_run_state, run
from stlsgd.experiments.build import build
from stlsgd.experiments.config import Experiment, dump_config, read_raw, validate
from stlsgd.problems.base import State

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
FINAL_PARAMS_FILE = "final_params.npz"
CHECKPOINT_FILE = "checkpoint"
# Results whose presence means "a run lives here"; config.yaml says which one.
RESULT_FILES = (METRICS_FILE, SUMMARY_FILE, FINAL_PARAMS_FILE, CHECKPOINT_FILE)


def cache_dir() -> Path:
    """Where computed facts (the exact optimum f* per dataset and lambda) are kept: $STLSGD_CACHE or the user cache."""
    return Path(os.environ.get("STLSGD_CACHE") or platformdirs.user_cache_dir("stlsgd"))


def stop_rule(exp: Experiment, has_optimum: bool) -> StopRule:
    r = exp.run
    return StopRule(
        target_gap=r.target_gap if has_optimum else None,
        target_accuracy=r.target_accuracy,
        max_iterations=r.max_iterations,
        max_rounds=r.max_rounds,
        eval_every=r.eval_every,
        eval_every_iterations=r.eval_every_iterations,
    )


# --------------------------------------------------------------------------- output directory


def check_out_dir(out: Path, exp: Experiment, overwrite: bool) -> None:
    """Refuse to mix two different runs in one directory; writes nothing (errors come before any output)."""
    if out.exists() and not out.is_dir():
        raise StlsgdError(f"{out}: exists and is not a directory; choose another --out")
    if overwrite or not out.is_dir():
        return
    config_path = out / CONFIG_FILE
    if config_path.is_file():
        try:
            # Validated, so a config written by an older stlsgd (missing defaulted fields) still matches.
            same = validate(read_raw(config_path), str(config_path)).to_dict() == exp.to_dict()
        except StlsgdError:
            same = False
        if not same:
            raise StlsgdError(
                f"{out}: already holds a different run ({config_path} differs); "
                "choose another --out or pass --overwrite"
            )
    elif any((out / name).exists() for name in RESULT_FILES):
        raise StlsgdError(
            f"{out}: holds results without {CONFIG_FILE} (another run?); choose another --out or pass --overwrite"
        )


def make_out_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StlsgdError(f"{out}: cannot create the output directory ({err.strerror or err})") from None


def write_json_atomic(path: Path, obj: Any) -> None:
    def write(fh: Any) -> None:
        json.dump(obj, fh, indent=2)
        fh.write("\n")

    atomic_write(path, write)


def write_final_params(path: Path, clients: State) -> None:
    """The averaged model (client 0's row right after the last average) as one array per state key."""
    arrays = {
        key: (value[0] if isinstance(value, np.ndarray) else value[0].detach().cpu().numpy())
        for key, value in clients.items()
    }
    atomic_write(path, lambda fh: np.savez(fh, **arrays), mode="wb")


def read_final_params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as npz:
        return {key: npz[key] for key in npz.files}


# --------------------------------------------------------------------------- metrics log


class MetricsLog:
    """``metrics.jsonl``, appended one line per evaluation, with its length and sha256 kept for checkpoints."""

    def __init__(self, path: Path, *, lines: int = 0, size: int = 0, digest: Any = None) -> None:
        self.path = path
        self.lines = lines
        self.size = size
        self._sha = digest if digest is not None else hashlib.sha256()
        self._fh = open(path, "r+b" if size else "wb")
        self._fh.seek(size)
        self._fh.truncate()  # lines written after the checkpoint would otherwise appear twice

    @classmethod
    def resume(cls, path: Path, *, lines: int, size: int, sha256: str) -> MetricsLog:
        """Reopen at a checkpoint's recorded length after checking the kept prefix is the one it recorded."""
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as fh:
                prefix = fh.read(size)
        except FileNotFoundError:
            prefix = b""
        digest.update(prefix)
        if len(prefix) != size or digest.hexdigest() != sha256 or prefix.count(b"\n") != lines:
            raise CheckpointError(
                f"{path}: does not start with the {lines} lines the checkpoint recorded; "
                "cannot resume exactly (rerun without --resume)"
            )
        return cls(path, lines=lines, size=size, digest=digest)

    def write(self, metrics: dict[str, Any]) -> None:
        data = (json.dumps(metrics) + "\n").encode()
        self._fh.write(data)
        self._fh.flush()  # one line at a time, so `tail -f` and plots see progress
        self._sha.update(data)
        self.lines += 1
        self.size += len(data)

    def sync(self) -> None:
        """Make the lines a checkpoint is about to count durable first."""
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def position(self) -> dict[str, Any]:
        return {"metrics_lines": self.lines, "metrics_bytes": self.size, "metrics_sha256": self._sha.hexdigest()}

    def close(self) -> None:
        self._fh.close()


# --------------------------------------------------------------------------- summary


def summarize(exp: Experiment, state: RunState, plan_desc: dict[str, Any], fstar: float | None) -> dict[str, Any]:
    return {
        "name": exp.name,
        "method": exp.algorithm.method,
        "status": state.status,
        "rounds_to_target": state.rounds_to_target,
        "iterations_to_target": state.iterations_to_target,
        "rounds": state.round,
        "iterations": state.iteration,
        "stages": state.stage,
        "bytes": state.bytes,
        "wall_s": round(state.wall_s, 3),
        "fstar": fstar,
        "final": state.last,
        "plan": plan_desc,
    }


# --------------------------------------------------------------------------- run


def restore_run(out: Path, exp: Experiment) -> tuple[RunState, dict[str, Any]] | None:
    """The checkpoint in ``out`` if there is one, checked to belong to ``exp``; None means start afresh."""
    path = out / CHECKPOINT_FILE
    if not path.is_file():
        return None
    state, meta = load_checkpoint(path)
    if meta.get("config") != exp.to_dict():
        raise CheckpointError(f"{path}: was written by a different config; choose another --out or pass --overwrite")
    return state, meta


def clear_debris(out: Path) -> None:
    """Temporary files left by a process killed in the middle of an atomic write."""
    for tmp in out.glob(f"{TMP_PREFIX}*{TMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)
    for name in (SUMMARY_FILE, FINAL_PARAMS_FILE, CONFIG_FILE):
        for tmp in out.glob(f".{name}.*.tmp"):
            tmp.unlink(missing_ok=True)


def run_experiment(
    exp: Experiment,
    out: Path,
    *,
    data_dir: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    checkpoint_every: int | None = None,
    resume: bool = False,
    on_round: Callback | None = None,
) -> dict[str, Any]:
    """Simulate ``exp`` into ``out`` (see the module docstring for the files); return the summary.

    ``checkpoint_every=R`` checkpoints after every R-th round (counted from the run's start, so a resumed run
    checkpoints at the same rounds). ``resume`` continues from ``out/checkpoint`` when there is one (and
    starts afresh when there is none, so a preempted job may always be restarted with the same command).
    ``on_round`` is passed to the simulator (it may end the run by returning a status).
    """
    out = Path(out)
    if checkpoint_every is not None and checkpoint_every < 1:
        raise ConfigError(f"--checkpoint-every: must be >= 1 round, got {checkpoint_every}")
    # Everything that can fail on bad input happens before the first byte is written to `out`.
    check_out_dir(out, exp, overwrite)
    restored = restore_run(out, exp) if resume and not overwrite else None
    built = build(exp, data_dir)
    fstar = built.problem.optimum(cache_dir=cache_dir()) if exp.run.target_gap is not None else None
    plan_desc = built.plan.describe()

    make_out_dir(out)
    clear_debris(out)
    if restored is None:
        for name in RESULT_FILES:  # the outputs of the run this one replaces (same config, or --overwrite)
            if name != METRICS_FILE:
                (out / name).unlink(missing_ok=True)
        dump_config(exp, out / CONFIG_FILE)
        sampler = Sampler(built.partition, exp.run.seed)
        state = init_run_state(built.problem, sampler, exp.data.num_clients, exp.run.seed)
        metrics = MetricsLog(out / METRICS_FILE)
    else:
        state, meta = restored
        if checkpoint_every is None:
            checkpoint_every = meta.get("checkpoint_every")
        if state.status != "running" and (out / SUMMARY_FILE).is_file() and (out / FINAL_PARAMS_FILE).is_file():
            return json.loads((out / SUMMARY_FILE).read_text())  # finished and fully written: nothing to do
        sampler = Sampler(built.partition, exp.run.seed)
        metrics = MetricsLog.resume(out / METRICS_FILE, lines=meta["metrics_lines"], size=meta["metrics_bytes"],
                                    sha256=meta["metrics_sha256"])

    checkpoint = out / CHECKPOINT_FILE

    def save(st: RunState) -> None:
        metrics.sync()
        meta = {"config": exp.to_dict(), "checkpoint_every": checkpoint_every, **metrics.position()}
        save_checkpoint(checkpoint, st, meta)

    started = time.perf_counter() - state.wall_s

    def after_round(st: RunState, rnd: Any) -> str | None:
        verdict = on_round(st, rnd) if on_round is not None else None
        if checkpoint_every and not verdict and st.status == "running" and st.round % checkpoint_every == 0:
            save(dataclasses.replace(st, wall_s=time.perf_counter() - started))
        return verdict

    try:
        if state.status == "running":
            # Overflow on the way to divergence is expected and reported as status "diverged", not as warnings.
            with np.errstate(over="ignore", invalid="ignore"):
                state = run(built.plan, built.problem, sampler, stop_rule(exp, fstar is not None), state,
                            fstar=fstar, on_metrics=metrics.write, on_round=after_round, progress=progress,
                            align=checkpoint_every)
        if checkpoint_every:
            save(state)  # a finished checkpoint: --resume then only completes the files below, never reruns
        else:
            metrics.sync()
    finally:
        metrics.close()
    write_final_params(out / FINAL_PARAMS_FILE, state.clients)
    summary = summarize(exp, state, plan_desc, fstar)
    write_json_atomic(out / SUMMARY_FILE, summary)
    return summary
