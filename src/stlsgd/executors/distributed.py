"""The torch.distributed executor: the simulator's rounds with the clients spread over processes.

Started by ``torchrun`` (one machine or many)::

    torchrun --nproc_per_node=P -m stlsgd run CONFIG --backend dist

Each of the P ranks holds a contiguous slice of the N clients (N = 32 on 4 ranks: 8 each; uneven splits
are fine) and steps them together with the problem's own vectorised ``local_steps`` (Algorithm 1, line 4).
Every rank draws the whole client axis of mini-batch rows from the same seeded
:class:`~stlsgd.executors.sampling.Sampler` and keeps its own columns, so the run does not depend on how
the clients are laid out over ranks: it is the simulator's run, to float tolerance. A round ends with ONE
all-reduce of one flat buffer (:func:`~stlsgd.executors.averaging.allreduce_mean`). The loop, the stop
rules and the :class:`~stlsgd.executors.simulator.RunState` are the simulator's own
(:func:`~stlsgd.executors.simulator.run` with a :class:`~stlsgd.executors.simulator.Topology`): rank 0
alone evaluates, writes ``config.yaml``, ``metrics.jsonl``, ``summary.json``, ``final_params.npz`` and the
checkpoint, and broadcasts its stop verdict; the other ranks write nothing.

Checkpoints are the simulator's format (:mod:`stlsgd.executors.checkpoint`, same ``meta`` as
:mod:`stlsgd.experiments.runner`): right after an average every client holds the same model, so rank 0
saves the averaged model once per client slot, and a checkpoint written here resumes in the simulator and
the other way round, on any number of ranks. On ``--resume`` rank 0 reads it and broadcasts it, so other
machines need no shared file system.

Faults: collectives of the run use a process group with a timeout (``$STLSGD_DIST_TIMEOUT`` seconds,
default 30). A rank that dies closes its sockets and the others fail at once; a rank that hangs makes the
others fail when the timeout expires. Either way every surviving rank raises a one-line
:class:`~stlsgd.errors.StlsgdError` naming the last finished round and how to resume.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from stlsgd.errors import ConfigError, StlsgdError
from stlsgd.executors.averaging import allreduce_mean, comm_device
from stlsgd.executors.checkpoint import save_checkpoint
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import RunState, Topology, run
from stlsgd.experiments.build import Built, build
from stlsgd.experiments.config import Experiment, dump_config
from stlsgd.threads import share_cores
from stlsgd.experiments.runner import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    FINAL_PARAMS_FILE,
    METRICS_FILE,
    RESULT_FILES,
    SUMMARY_FILE,
    MetricsLog,
    cache_dir,
    check_out_dir,
    clear_debris,
    make_out_dir,
    restore_run,
    stop_rule,
    summarize,
    write_final_params,
    write_json_atomic,
)
from stlsgd.problems.base import State

TIMEOUT_ENV = "STLSGD_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0
# Setup (loading data, computing f* on rank 0) may take long the first time; only the rounds are timed tight.
SETUP_TIMEOUT = timedelta(minutes=30)
# Statuses rank 0 can reach in a round, as the integers its verdict broadcast carries.
_STATUSES = ("running", "reached", "budget", "diverged")
_LAUNCH_HINT = "torchrun --nproc_per_node=P -m stlsgd run CONFIG --backend dist (see docs/distributed.md)"

T = TypeVar("T")


class CollectiveFailure(StlsgdError):
    """A collective of the rounds failed: a peer died, or stalled past the timeout."""


def resolve_comm_backend(choice: str) -> str:
    """``auto``: nccl when CUDA is available, gloo otherwise; an explicit choice is checked."""
    if choice == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if choice == "nccl" and not torch.cuda.is_available():
        raise StlsgdError("--comm-backend nccl needs CUDA GPUs, and none is available; use gloo or auto")
    if choice not in ("gloo", "nccl"):
        raise StlsgdError(f"--comm-backend: unknown backend {choice!r} (auto, gloo or nccl)")
    return choice


def collective_timeout() -> timedelta:
    """The per-collective timeout of the rounds, from ``$STLSGD_DIST_TIMEOUT`` (seconds)."""
    text = os.environ.get(TIMEOUT_ENV)
    if not text:
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(text)
    except ValueError:
        raise ConfigError(f"${TIMEOUT_ENV}: expected seconds, got {text!r}") from None
    if not seconds > 0:
        raise ConfigError(f"${TIMEOUT_ENV}: must be > 0 seconds, got {text!r}")
    return timedelta(seconds=seconds)


def client_slice(num_clients: int, world_size: int, rank: int) -> slice:
    """Rank ``rank``'s contiguous share of the client axis; the first N mod P ranks get one client more."""
    base, extra = divmod(num_clients, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def make_topology(num_clients: int, group: dist.ProcessGroup | None = None) -> Topology:
    """This rank's place in the run: its clients, the all-reduce average and rank 0's verdict broadcast."""
    pg = group if group is not None else dist.group.WORLD
    rank, world = pg.rank(), pg.size()
    device = comm_device(torch.device("cpu"), group)

    def average(clients: State) -> None:
        allreduce_mean(clients, num_clients, group)

    def agree(state: RunState, finished: bool) -> bool:
        # One small broadcast, only in rounds where the stop rules are checked (the same rounds on all ranks).
        verdict = torch.tensor(
            [int(finished), _STATUSES.index(state.status), _or_minus(state.rounds_to_target),
             _or_minus(state.iterations_to_target), state.last_eval_iteration],
            dtype=torch.int64, device=device,
        )
        dist.broadcast(verdict, group_src=0, group=group)
        finished_i, status_i, rounds_i, iterations_i, last_eval = (int(v) for v in verdict.tolist())
        state.status = _STATUSES[status_i]
        state.rounds_to_target = None if rounds_i < 0 else rounds_i
        state.iterations_to_target = None if iterations_i < 0 else iterations_i
        state.last_eval_iteration = last_eval
        return bool(finished_i)

    return Topology(clients=client_slice(num_clients, world, rank), is_root=rank == 0, average=average, agree=agree)


def _or_minus(value: int | None) -> int:
    return -1 if value is None else int(value)


# --------------------------------------------------------------------------- process group


def init_process_group(comm_backend: str = "auto") -> tuple[str, dist.ProcessGroup]:
    """Join the job torchrun started (``env://``): returns (backend, the timed group the rounds use).

    The default group gets a long timeout for setup; the rounds' collectives go through a second group over
    the same ranks whose timeout is :func:`collective_timeout`, so a dead or stuck peer is noticed quickly.
    """
    timeout = collective_timeout()
    if not dist.is_initialized():  # an existing default group (the caller's own) is used as it is
        if not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
            raise StlsgdError(f"--backend dist must be started by torchrun: {_LAUNCH_HINT}")
        backend = resolve_comm_backend(comm_backend)
        device_id = None
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            device_id = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group(backend, timeout=SETUP_TIMEOUT, device_id=device_id)
    return dist.get_backend(), dist.new_group(timeout=timeout)


def collectively(fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; if it fails on any, every rank raises one error naming the first failing rank.

    Without this a bad config or a missing data file on one machine leaves the others waiting in their
    next collective.
    """
    error: str | None = None
    result: Any = None
    own: BaseException | None = None
    try:
        result = fn()
    except StlsgdError as exc:
        error = str(exc)
    except Exception as exc:  # a bug: report it everywhere, re-raise it with its traceback where it happened
        error, own = f"{type(exc).__name__}: {exc}", exc
    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    if own is not None:
        raise own
    for rank, message in enumerate(errors):
        if message is not None:
            raise StlsgdError(message if dist.get_world_size() == 1 else f"rank {rank}: {message}")
    return result


def broadcast_object(obj: T | None) -> T:
    """Rank 0's ``obj`` on every rank (pickled; used once per run, for the starting state)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


# --------------------------------------------------------------------------- states


def _rows(state: State, count: int) -> State:
    """``count`` copies of client 0 (clients are equal after every average and at the start)."""
    out: State = {}
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            out[key] = np.repeat(value[:1], count, axis=0)
        else:
            out[key] = value[:1].repeat(count, *([1] * (value.dim() - 1)))
    return out


def _like(template: State, values: State) -> State:
    """``values`` converted to the array type, dtype and device of this rank's freshly built ``template``."""
    out: State = {}
    for key, ref in template.items():
        value = values[key]
        if isinstance(ref, np.ndarray):
            out[key] = np.asarray(value.cpu().numpy() if isinstance(value, torch.Tensor) else value, dtype=ref.dtype)
        else:
            out[key] = torch.as_tensor(value).to(device=ref.device, dtype=ref.dtype)
    return out


def _compact(state: RunState) -> RunState:
    """The state with client 0 only: what rank 0 broadcasts at the start (every client is equal then)."""
    return dataclasses.replace(state, clients=_rows(state.clients, 1))


def _expand(state: RunState, count: int, template: State) -> RunState:
    anchor = None if state.anchor is None else _like(template, state.anchor)
    return dataclasses.replace(state, clients=_rows(_like(template, state.clients), count), anchor=anchor)


# --------------------------------------------------------------------------- run


@dataclasses.dataclass
class _Start:
    """What rank 0 decides before the rounds and every rank needs."""

    state: RunState | None  # client 0 only; None: finished before, nothing to run
    fstar: float | None
    checkpoint_every: int | None
    summary: dict[str, Any] | None = None


def run_distributed(
    exp: Experiment,
    out: Path,
    *,
    comm_backend: str = "auto",
    data_dir: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    checkpoint_every: int | None = None,
    resume: bool = False,
) -> dict[str, Any] | None:
    """Run ``exp`` on the torchrun job this process belongs to; the summary on rank 0, None elsewhere.

    Files and options are those of :func:`stlsgd.experiments.runner.run_experiment`.
    """
    out = Path(out)
    share_cores(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # ranks on one machine split its cores
    owns_group = not dist.is_initialized()  # a caller's own process group is left to the caller
    backend, group = init_process_group(comm_backend)
    try:
        summary = _run(exp, out, group, data_dir=data_dir, overwrite=overwrite, progress=progress,
                       checkpoint_every=checkpoint_every, resume=resume, backend=backend)
    except CollectiveFailure:
        raise  # tearing the groups down could wait on the failed peer; the process is about to exit anyway
    except BaseException:
        if owns_group:
            dist.destroy_process_group()
        raise
    if owns_group:
        dist.destroy_process_group()
    else:
        dist.destroy_process_group(group)
    return summary


def _run(exp: Experiment, out: Path, group: dist.ProcessGroup, *, data_dir: str | None, overwrite: bool,
         progress: bool, checkpoint_every: int | None, resume: bool, backend: str) -> dict[str, Any] | None:
    rank, world = dist.get_rank(), dist.get_world_size()
    is_root = rank == 0
    n_clients = exp.data.num_clients
    root: dict[str, Any] = {}

    def setup() -> tuple[Built, _Start | None]:
        if checkpoint_every is not None and checkpoint_every < 1:
            raise ConfigError(f"--checkpoint-every: must be >= 1 round, got {checkpoint_every}")
        if world > n_clients:
            raise ConfigError(f"data.num_clients: {n_clients} clients cannot occupy {world} ranks; "
                              f"use at most {n_clients} processes")
        if is_root:  # every check that can refuse the run comes before rank 0 writes anything
            check_out_dir(out, exp, overwrite)
            root["restored"] = restore_run(out, exp) if resume and not overwrite else None
        built = build(exp, data_dir)
        if not is_root:
            return built, None
        fstar = built.problem.optimum(cache_dir=cache_dir()) if exp.run.target_gap is not None else None
        return built, _prepare_root(exp, out, built, fstar, checkpoint_every, root)

    built, start = collectively(setup)
    start = broadcast_object(start)
    if start.state is None:  # finished before: rank 0 holds the summary
        return start.summary if is_root else None

    topology = make_topology(n_clients, group)
    template = built.problem.init_state(1, exp.run.seed)
    own = topology.clients.stop - topology.clients.start
    state = _expand(start.state, own, template)
    sampler = Sampler(built.partition, exp.run.seed)
    every = start.checkpoint_every
    metrics: MetricsLog | None = root.get("metrics")
    checkpoint = out / CHECKPOINT_FILE
    started = time.perf_counter() - state.wall_s

    def save(st: RunState) -> None:
        assert metrics is not None
        metrics.sync()
        meta = {"config": exp.to_dict(), "checkpoint_every": every, **metrics.position()}
        save_checkpoint(checkpoint, dataclasses.replace(st, clients=_rows(st.clients, n_clients)), meta)

    def after_round(st: RunState, rnd: Any) -> None:
        if every and st.status == "running" and st.round % every == 0:
            save(dataclasses.replace(st, wall_s=time.perf_counter() - started))

    try:
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                state = run(built.plan, built.problem, sampler, stop_rule(exp, start.fstar is not None), state,
                            fstar=start.fstar, on_metrics=metrics.write if metrics else None,
                            on_round=after_round if is_root else None, progress=progress and is_root,
                            topology=topology)
        except RuntimeError as exc:  # DistError is one; gloo reports a closed peer socket as a plain one
            if isinstance(exc, dist.DistError) or _is_comm_failure(exc):
                raise CollectiveFailure(_fault_message(rank, world, state, exc, out, every)) from exc
            raise
        if not is_root:
            return None
        if every:
            save(state)  # a finished checkpoint: --resume then only completes the files, never reruns
        else:
            metrics.sync()
    finally:
        if metrics is not None:
            metrics.close()
    write_final_params(out / FINAL_PARAMS_FILE, state.clients)
    summary = summarize(exp, state, built.plan.describe(), start.fstar)
    summary["backend"] = {"executor": "dist", "comm": backend, "world_size": world}
    write_json_atomic(out / SUMMARY_FILE, summary)
    return summary


def _prepare_root(exp: Experiment, out: Path, built: Built, fstar: float | None, checkpoint_every: int | None,
                  root: dict[str, Any]) -> _Start:
    """Rank 0's files and starting state, as :func:`stlsgd.experiments.runner.run_experiment` prepares them."""
    restored = root["restored"]
    make_out_dir(out)
    clear_debris(out)
    if restored is None:
        for name in RESULT_FILES:
            if name != METRICS_FILE:
                (out / name).unlink(missing_ok=True)
        dump_config(exp, out / CONFIG_FILE)
        state = RunState(clients=built.problem.init_state(1, exp.run.seed),
                         sampler_state=Sampler(built.partition, exp.run.seed).get_state())
        root["metrics"] = MetricsLog(out / METRICS_FILE)
        return _Start(state, fstar, checkpoint_every)
    state, meta = restored
    if checkpoint_every is None:
        checkpoint_every = meta.get("checkpoint_every")
    if state.status != "running" and (out / SUMMARY_FILE).is_file() and (out / FINAL_PARAMS_FILE).is_file():
        return _Start(None, fstar, checkpoint_every, summary=json.loads((out / SUMMARY_FILE).read_text()))
    root["metrics"] = MetricsLog.resume(out / METRICS_FILE, lines=meta["metrics_lines"],
                                        size=meta["metrics_bytes"], sha256=meta["metrics_sha256"])
    return _Start(_compact(state), fstar, checkpoint_every)


def _is_comm_failure(exc: RuntimeError) -> bool:
    text = str(exc).lower()
    return any(word in text for word in ("gloo", "connection", "peer", "timed out", "timeout", "nccl", "socket"))


def _fault_message(rank: int, world: int, state: RunState, exc: BaseException, out: Path, every: int | None) -> str:
    cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    timeout = collective_timeout().total_seconds()
    resume = (f"resume from rank 0's last checkpoint with the same command plus --resume ({out / CHECKPOINT_FILE})"
              if every else "no checkpoint was being written (--checkpoint-every R), so a rerun starts afresh")
    return (f"rank {rank} of {world}: lost the process group after round {state.round} -- a peer process died "
            f"or stalled longer than {timeout:g} s (${TIMEOUT_ENV}) [{cause}]; {resume}")
