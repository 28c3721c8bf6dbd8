"""Run one experiment with the simulator and write its results: config, metrics and summary."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import platformdirs

from stlsgd.errors import StlsgdError
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import RunState, StopRule, init_run_state, run
from stlsgd.experiments.build import build
from stlsgd.experiments.config import Experiment, dump_config, read_raw


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


def prepare_out_dir(out: Path, exp: Experiment, overwrite: bool) -> None:
    """Refuse to mix two different runs in one directory; the same config may be rerun in place."""
    config_path = out / "config.yaml"
    if config_path.is_file() and not overwrite:
        try:
            previous = read_raw(config_path)
        except StlsgdError:
            previous = None
        if previous != exp.to_dict():
            raise StlsgdError(f"{out}: already holds a different run; choose another --out or pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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


def run_experiment(
    exp: Experiment,
    out: Path,
    *,
    data_dir: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    checkpoint_every: int | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Simulate ``exp`` and write ``out/config.yaml``, ``out/metrics.jsonl`` and ``out/summary.json``."""
    if checkpoint_every is not None or resume:
        raise StlsgdError("checkpoints are not implemented yet")  # TODO(issue 4)
    prepare_out_dir(out, exp, overwrite)
    built = build(exp, data_dir)
    fstar = built.problem.optimum(cache_dir=cache_dir()) if exp.run.target_gap is not None else None
    dump_config(exp, out / "config.yaml")
    sampler = Sampler(built.partition, exp.run.seed)
    state = init_run_state(built.problem, sampler, exp.data.num_clients, exp.run.seed)
    with open(out / "metrics.jsonl", "w", buffering=1) as metrics_file:
        state = run(
            built.plan, built.problem, sampler, stop_rule(exp, fstar is not None), state, fstar=fstar,
            on_metrics=lambda m: metrics_file.write(json.dumps(m) + "\n"), progress=progress,
        )
    summary = summarize(exp, state, built.plan.describe(), fstar)
    write_json_atomic(out / "summary.json", summary)
    return summary
