"""Run one experiment, on the simulator or on torch.distributed, through its :class:`RunDirectory`.

Both backends go through the same steps: check the output directory and the checkpoint, build the data,
problem and plan, open the directory, run the round loop (:func:`stlsgd.executors.simulator.run`), finish
the files. On ``--backend dist`` (started by ``torchrun``) every rank builds and steps its share of the
clients; rank 0 alone owns the directory and broadcasts its starting state, so other machines need no shared
file system; a failure before the rounds on any rank is reported by every rank.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from stlsgd import faults
from stlsgd.errors import ConfigError, brief
from stlsgd.executors import distributed
from stlsgd.executors.averaging import replicate
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import Callback, RunState, Sparse, Topology, run
from stlsgd.experiments.build import Built, build, stop_rule
from stlsgd.experiments.config import Experiment
from stlsgd.experiments.records import RunSummary
from stlsgd.experiments.rundir import CHECKPOINT_FILE, RunDirectory, Start, check_checkpoint_every
from stlsgd.files import cache_dir
from stlsgd.problems.bounds import floor_for
from stlsgd.problems.logistic import LogisticRegression
from stlsgd.threads import share_cores


def run_experiment(
    exp: Experiment,
    out: Path,
    *,
    backend: str = "sim",
    comm_backend: str = "auto",
    data_dir: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    checkpoint_every: int | None = None,
    resume: bool = False,
    on_round: Callback | None = None,
    built: Built | None = None,
    keep_params: bool = True,
    inject_latency_s: float = 0.0,
    tensorboard: Path | None = None,
    sparse_eval: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any] | None:
    """Run ``exp`` into ``out`` (see :mod:`stlsgd.experiments.rundir` for the files); return the summary
    (None on ranks other than 0).

    ``checkpoint_every=R`` checkpoints after every R-th round. ``resume`` continues from ``out/checkpoint``
    when there is one (and starts afresh when there is none, so a preempted job may always be restarted with
    the same command). ``on_round`` is passed to the round loop (it may end the run by returning a status);
    ``built`` reuses data already loaded (sweep workers); ``keep_params=False`` skips ``final_params.npz``;
    ``inject_latency_s`` (``--backend dist`` only) waits that long before every average, as a slower network
    would (the cost model's validation); ``tensorboard`` also writes every metrics line as TensorBoard scalars
    into that directory (rank 0); ``sparse_eval=N`` (sweeps) skips the evaluations proved unable to end the
    run (:func:`_sparse`), keeping every N-th evaluation point (every N * ``run.eval_every`` rounds; 0: none);
    ``clock`` (simulator) measures the run's wall time (sweeps' runs that take turns in one process count only
    their own turns).
    """
    check_checkpoint_every(checkpoint_every)
    out = Path(out)
    options: dict[str, Any] = dict(
        data_dir=data_dir,
        overwrite=overwrite,
        progress=progress,
        checkpoint_every=checkpoint_every,
        resume=resume,
        on_round=on_round,
        built=built,
        keep_params=keep_params,
        tensorboard=tensorboard,
        sparse_eval=sparse_eval,
    )
    if backend == "sim":
        if inject_latency_s:
            raise ConfigError("--inject-latency: only with --backend dist (it delays the collectives)")
        return _run(distributed.ALONE, exp, out, **options, clock=clock)
    if backend != "dist":
        raise ConfigError(f"--backend: unknown backend {backend!r} (sim or dist)")
    share_cores(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # ranks on one machine split its cores
    job = distributed.join(comm_backend)
    job.delay_s = inject_latency_s
    try:
        summary = _run(job, exp, out, **options)
    except distributed.CollectiveFailure:
        raise  # tearing the groups down could wait on the failed peer; the process is about to exit anyway
    except BaseException:
        job.close()
        raise
    job.close()
    return summary


def _run(
    job: distributed.Place,
    exp: Experiment,
    out: Path,
    *,
    data_dir: str | None,
    overwrite: bool,
    progress: bool,
    checkpoint_every: int | None,
    resume: bool,
    on_round: Callback | None,
    built: Built | None,
    keep_params: bool,
    tensorboard: Path | None,
    sparse_eval: int | None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any] | None:
    n_clients = exp.data.num_clients
    rundir = RunDirectory(out, exp, keep_params=keep_params) if job.is_root else None

    def setup() -> tuple[Built, Start | None, float | None]:
        if job.world > n_clients:
            raise ConfigError(
                f"data.num_clients: {n_clients} clients cannot occupy {job.world} ranks; "
                f"use at most {n_clients} processes"
            )
        restored = None
        if rundir is not None:  # every check that can refuse the run comes before anything is written
            rundir.check(overwrite)
            restored = rundir.restore() if resume and not overwrite else None
        b = built or build(exp, data_dir)
        if rundir is None:
            return b, None, None
        RunDirectory.check_data(restored, b.fingerprint, out / CHECKPOINT_FILE)
        fstar = b.problem.optimum(cache_dir=cache_dir()) if exp.run.target_gap is not None else None

        def fresh() -> RunState:
            return RunState(
                clients=b.problem.init_state(1, exp.run.seed),
                sampler_state=Sampler(b.partition, exp.run.seed).get_state(),
            )

        start = rundir.open(restored, b.fingerprint, fresh, checkpoint_every)
        if start.state is not None:  # every client holds the same model at a round boundary: send one
            start.state = dataclasses.replace(start.state, clients=replicate(start.state.clients, 1))
        return b, start, fstar

    try:
        b, start, fstar = job.collectively(setup)
        start, fstar = job.broadcast((start, fstar))
        assert start is not None, "rank 0 sends every rank its start"
        if start.state is None:  # ended before: rank 0 holds the summary
            return start.summary if job.is_root else None
        sparse = _sparse(exp, b, fstar, sparse_eval) if job.alone and not start.checkpoint_every else None
        return _rounds(job, exp, b, start, fstar, rundir, on_round, progress, out, tensorboard, sparse, clock)
    finally:
        if rundir is not None:
            rundir.close()


def _rounds(
    job: distributed.Place,
    exp: Experiment,
    b: Built,
    start: Start,
    fstar: float | None,
    rundir: RunDirectory | None,
    on_round: Callback | None,
    progress: bool,
    out: Path,
    tensorboard: Path | None,
    sparse: Sparse | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any] | None:
    n_clients = exp.data.num_clients
    topology = job.topology(n_clients)
    template = b.problem.init_state(1, exp.run.seed)
    own = len(range(n_clients)[topology.clients])
    s = start.state
    assert s is not None, "a run that ended before takes no rounds"

    def like(values: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if values is None else _like(template, values)

    # Clients are equal at a round boundary (one row came); control variates are per client (all rows came).
    state = dataclasses.replace(
        s,
        clients=replicate(_like(template, s.clients), own),
        anchor=like(s.anchor),
        control=None if s.control is None else {k: v[topology.clients] for k, v in _like(template, s.control).items()},
        control_mean=like(s.control_mean),
        outer_momentum=like(s.outer_momentum),
    )
    b.problem.warm_up()
    started = clock() - state.wall_s
    every = start.checkpoint_every
    fault = faults.from_env()  # $STLSGD_FAULT: a test's kill after a chosen round

    def after_round(st: RunState, rnd: Any) -> str | None:
        verdict = on_round(st, rnd) if on_round is not None else None
        # Every rank takes part (per-client control variates are gathered); rank 0 writes.
        if every and not verdict and st.status == "running" and st.round % every == 0:
            full = _full(dataclasses.replace(st, wall_s=clock() - started), n_clients, topology)
            if rundir is not None:
                rundir.checkpoint(full)
        if fault is not None:
            fault.after(st.round)
        return verdict

    on_metrics: Callable[[dict[str, Any]], None] | None = None
    writer = None
    if rundir is not None and rundir.metrics is not None:
        log = rundir.metrics
        on_metrics = log.write
        if tensorboard is not None:
            from stlsgd.integrations.tensorboard import open_writer, write_metrics

            writer = open_writer(tensorboard)

            def to_both(metrics: dict[str, Any]) -> None:
                log.write(metrics)
                write_metrics(writer, metrics)

            on_metrics = to_both

    previous = (
        distributed.exit_on_sigterm(
            lambda: _fault(job, state, "stopped by the launcher (SIGTERM)", start.checkpoint_every, out)
        )
        if not job.alone
        else None
    )
    try:
        # A checkpoint that says the run has ended (a kill came between the final checkpoint and the summary)
        # only completes the files: the run takes no further step.
        if state.status == "running":
            # Overflow on the way to divergence is expected and reported as status "diverged", not as warnings.
            with np.errstate(over="ignore", invalid="ignore"):
                state = run(
                    b.plan,
                    b.problem,
                    Sampler(b.partition, exp.run.seed),
                    stop_rule(exp, fstar is not None),
                    state,
                    fstar=fstar,
                    on_metrics=on_metrics,
                    on_round=after_round,
                    progress=progress and job.is_root,
                    topology=topology,
                    align=start.checkpoint_every,
                    rule=b.rule,
                    sparse=sparse,
                    clock=clock,
                )
    except Exception as exc:
        if not job.alone and distributed.is_comm_failure(exc):
            raise distributed.CollectiveFailure(
                _fault(job, state, "lost the process group", start.checkpoint_every, out, brief(exc))
            ) from exc
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if writer is not None:
            writer.close()
    full = _full(state, n_clients, topology)
    if rundir is None:
        return None
    summary = summarize(exp, state, b, fstar, n_clients, job.describe(), sparse)
    rundir.finish(full, summary)
    return summary.to_json()


# The bound keeps a d x d factor of the Hessian at x* (8 d^2 bytes: 128 MiB here) and takes O(d^2) a point.
MAX_FLOOR_DIM = 4096


def _sparse(exp: Experiment, b: Built, fstar: float | None, every: int | None) -> Sparse | None:
    """Sparse evaluation for this run, or None where it does not apply.

    It applies to the logistic problem with a gap target only (the proof is a bound on the gap:
    :class:`stlsgd.problems.bounds.GapFloor`), and never to adaptive plans, which read every objective.
    The caller leaves it off for checkpointed runs and torch.distributed (checkpoints then hold no skipped point).
    """
    r = exp.run
    if (
        every is None
        or fstar is None
        or r.target_gap is None
        or r.target_accuracy is not None
        or b.plan.adaptive
        or not isinstance(b.problem, LogisticRegression)
        or b.problem.dim > MAX_FLOOR_DIM
    ):
        return None
    floor, target = floor_for(b.problem, cache_dir()), r.target_gap
    if floor.fstar != fstar:  # the bound is on the gap to the floor's f*: it must be the run's
        return None
    return Sparse(lambda clients: floor.excludes(clients["w"][0], target), keep_every=every * r.eval_every)


def _fault(job: distributed.Place, state: RunState, what: str, every: int | None, out: Path, cause: str = "") -> str:
    timeout = distributed.collective_timeout().total_seconds()
    resume = (
        f"resume from rank 0's last checkpoint with the same command plus --resume ({out / CHECKPOINT_FILE})"
        if every
        else "no checkpoint was being written (--checkpoint-every R), so a rerun starts afresh"
    )
    cause = f" [{cause}]" if cause else ""
    return (
        f"rank {job.rank} of {job.world}: {what} after round {state.round} -- a peer process died or stalled "
        f"longer than {timeout:g} s (${distributed.TIMEOUT_ENV}){cause}; {resume}"
    )


def _full(state: RunState, num_clients: int, topology: Topology) -> RunState:
    """The state as the simulator holds it, every client slot filled: what checkpoints store. A collective
    where the state has per-client control variates on several ranks."""
    if next(iter(state.clients.values())).shape[0] == num_clients:
        return state
    control = None if state.control is None else topology.gather(state.control)
    return dataclasses.replace(state, clients=replicate(state.clients, num_clients), control=control)


def _like(template: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` converted to the array type, dtype and device of this process's freshly built ``template``
    (``values`` may hold part of its keys: the control variates are the parameters' only)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        ref = template[key]
        if isinstance(ref, np.ndarray):  # a NumPy run needs no torch (a tensor here came from a checkpoint)
            out[key] = np.asarray(value if isinstance(value, np.ndarray) else value.cpu().numpy(), dtype=ref.dtype)
        else:
            import torch

            out[key] = torch.as_tensor(value).to(device=ref.device, dtype=ref.dtype)
    return out


def summarize(
    exp: Experiment,
    state: RunState,
    built: Built,
    fstar: float | None,
    num_clients: int,
    backend: dict[str, Any],
    sparse: Sparse | None = None,
) -> RunSummary:
    """summary.json: the outcome, what the run computed and communicated, the last metrics, the plan and the
    round rule as run (checked here, where it is written: a missing or mistyped field is refused). A run that
    evaluated sparsely says how (its metrics.jsonl is sparser than run.eval_every)."""
    extra = (
        {}
        if sparse is None
        else {"evaluation": {"sparse": True, "kept_every_rounds": sparse.keep_every, "skipped": sparse.skipped}}
    )
    return RunSummary(
        name=exp.name,
        method=exp.algorithm.method,
        status=state.status,  # type: ignore[arg-type]  # "running" never reaches here: the run has ended
        rounds_to_target=state.rounds_to_target,
        iterations_to_target=state.iterations_to_target,
        rounds=state.round,
        iterations=state.iteration,
        stages=state.stage,
        client_steps=state.client_steps,
        bytes=state.bytes,
        bytes_per_client=state.bytes // (2 * num_clients),
        wall_s=round(state.wall_s, 3),
        compute_s=round(state.compute_s, 3),
        comm_s=round(state.comm_s, 3),
        fstar=fstar,
        final=state.last,
        plan=built.plan.describe(),
        rule={
            "drift": built.rule.drift,
            "drift_window": built.rule.drift_window,
            "drift_share": built.rule.drift_share,
            "outer": None if built.rule.outer is None else dataclasses.asdict(built.rule.outer),
        },
        backend=backend,
        auto_model_rounds=built.auto_model_rounds,
        **extra,
    )
