"""torch.distributed for the executors and the drop-in: joining a job, the timed process group, the ranks'
share of the clients, the average over the group, and rank 0's verdicts.

A run launched by ``torchrun`` (one machine or many) gives each of its P ranks a contiguous slice of the N
clients (N = 32 on 4 ranks: 8 each; uneven splits are fine). Every rank draws the whole client axis of
mini-batch rows from the same seeded :class:`~stlsgd.executors.sampling.Sampler` and keeps its own columns,
and the average has one canonical order (:mod:`stlsgd.executors.averaging`), so a run does not depend on
how the clients are laid out over ranks. The round loop is the simulator's own
(:func:`~stlsgd.executors.simulator.run` with the :class:`~stlsgd.executors.simulator.Topology` that
:func:`make_topology` builds): rank 0 alone evaluates and broadcasts its stop verdict.

Faults: the rounds' collectives use a process group with a timeout (``$STLSGD_DIST_TIMEOUT`` seconds,
default 30). A rank that dies closes its sockets and the others fail at once; a rank that hangs makes the
others fail when the timeout expires. Either way the failure surfaces as :class:`CollectiveFailure`.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from stlsgd.errors import ConfigError, StlsgdError
from stlsgd.executors.averaging import client_slice, comm_device, gather_clients, group_mean
from stlsgd.executors.simulator import LOCAL, STATUSES, RunState, Topology
from stlsgd.problems.base import State

if TYPE_CHECKING:  # imported where a process group is met: a run alone never loads torch.distributed
    import torch.distributed as dist

TIMEOUT_ENV = "STLSGD_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0
# Setup (loading data, computing f* on rank 0) may take long the first time; only the rounds are timed tight.
SETUP_TIMEOUT = timedelta(minutes=30)
LAUNCH_HINT = "torchrun --nproc_per_node=P -m stlsgd run CONFIG --backend dist (see docs/distributed.md)"

T = TypeVar("T")


class CollectiveFailure(StlsgdError):
    """A collective failed: a peer died, or stalled past the timeout. The process should exit at once."""


def resolve_comm_backend(choice: str) -> str:
    """``auto``: nccl when CUDA is available, gloo otherwise; an explicit choice is checked."""
    import torch

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
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"${TIMEOUT_ENV}: must be > 0 seconds, got {text!r}")
    return timedelta(seconds=seconds)


def launched() -> bool:
    """Whether this process was started by torchrun (or with its environment) as one of several ranks."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


@dataclass
class Place:
    """Where a run executes: alone (one process holds every client: the simulator, or the drop-in without a
    process group) or as the ranks of a process group (torchrun's job, or a caller's own group). One type for
    the CLI's executors, the drop-in and the tests.

    ``group`` is the group the rounds use (None: alone); ``owns_default``/``owns_group`` say what was made here
    and is destroyed by :meth:`close`; ``delay_s`` is a latency injected before every average (``--inject-latency``).
    """

    group: dist.ProcessGroup | None = None
    backend: str = "none"
    owns_default: bool = False
    owns_group: bool = False
    delay_s: float = 0.0

    @property
    def alone(self) -> bool:
        return self.group is None

    @property
    def rank(self) -> int:
        return 0 if self.group is None else self.group.rank()

    @property
    def world(self) -> int:
        return 1 if self.group is None else self.group.size()

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def describe(self) -> dict[str, Any]:
        """The executor, as a run's summary records it."""
        if self.group is None:
            return {"executor": "sim"}
        return {"executor": "dist", "comm": self.backend, "world_size": self.world}

    def collectively(self, fn: Callable[[], T]) -> T:
        """``fn`` on every rank, a failure on any reported by all (see :func:`collectively`)."""
        return fn() if self.group is None else collectively(fn)

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        return obj if self.group is None else broadcast_object(obj)

    def topology(self, num_clients: int) -> Topology:
        """This process's clients and how they are averaged (see :func:`make_topology`)."""
        return LOCAL if self.group is None else make_topology(num_clients, self.group, self.delay_s)

    def close(self) -> None:
        import torch.distributed as dist

        if self.owns_default:
            dist.destroy_process_group()
        elif self.owns_group and self.group is not None:
            dist.destroy_process_group(self.group)


ALONE = Place()


def join(comm_backend: str = "auto", group: dist.ProcessGroup | None = None, *, timed_group: bool = True) -> Place:
    """Join the job torchrun started (``env://``), or the caller's existing default group.

    ``timed_group`` (the executor): the default group gets a long timeout for setup, and the rounds'
    collectives go through a second group over the same ranks whose timeout is :func:`collective_timeout`, so
    a dead or stuck peer is noticed quickly; :meth:`Place.close` destroys both. Without it (the drop-in, which a
    user's script outlives) no second group is made: a default group made here gets the collective timeout,
    an existing one is used as it is, and nothing is left for the interpreter's exit to tear down out of order.
    A caller's own ``group`` is used as it is.
    """
    import torch
    import torch.distributed as dist

    timeout = collective_timeout()
    if group is not None:
        return Place(group, group.name())
    owns = not dist.is_initialized()
    if owns:
        if not launched():
            raise StlsgdError(f"--backend dist must be started by torchrun: {LAUNCH_HINT}")
        backend = resolve_comm_backend(comm_backend)
        device_id = None
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            device_id = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group(backend, timeout=SETUP_TIMEOUT if timed_group else timeout, device_id=device_id)
    if not timed_group:
        return Place(dist.group.WORLD, dist.get_backend())
    return Place(dist.new_group(timeout=timeout), dist.get_backend(), owns_default=owns, owns_group=True)


def locate(group: dist.ProcessGroup | None = None) -> Place:
    """Where a training loop that stlsgd joins runs (the drop-in): the caller's ``group``; the default group
    when one exists or torchrun launched this process (joined, untimed); else alone."""
    import torch.distributed as dist

    if group is not None or dist.is_initialized() or launched():
        return join(group=group, timed_group=False)
    return ALONE


def make_topology(num_clients: int, group: dist.ProcessGroup | None = None, delay_s: float = 0.0) -> Topology:
    """This rank's place in the run: its clients, the average over the group and rank 0's verdict broadcast.

    ``delay_s`` is a latency injected before every average (to measure how a run's time grows with the
    network's latency, ``--inject-latency``): every rank waits it out before the collective."""
    import torch
    import torch.distributed as dist

    pg = group if group is not None else dist.group.WORLD
    assert pg is not None, "make_topology needs a process group"
    rank, world = pg.rank(), pg.size()
    device = comm_device(torch.device("cpu"), group)

    def average(clients: State) -> None:
        if delay_s:
            time.sleep(delay_s)
        group_mean(clients, num_clients, group)

    def agree(state: RunState, finished: bool) -> bool:
        # One small broadcast, only in rounds where the stop rules are checked (the same rounds on all ranks).
        # The objective travels as its float64 bits, so adaptive plans see the same feedback everywhere.
        objective = state.objective
        verdict = torch.tensor(
            [
                int(finished),
                STATUSES.index(state.status),
                _or_minus(state.rounds_to_target),
                _or_minus(state.iterations_to_target),
                state.last_eval_iteration,
                int(objective is not None),
                _float_bits(objective or 0.0),
            ],
            dtype=torch.int64,
            device=device,
        )
        dist.broadcast(verdict, group_src=0, group=group)
        finished_i, status_i, rounds_i, iterations_i, last_eval, has_objective, bits = (
            int(v) for v in verdict.tolist()
        )
        state.status = STATUSES[status_i]
        state.rounds_to_target = None if rounds_i < 0 else rounds_i
        state.iterations_to_target = None if iterations_i < 0 else iterations_i
        state.last_eval_iteration = last_eval
        state.objective = _bits_float(bits) if has_objective else None
        return bool(finished_i)

    return Topology(
        clients=client_slice(num_clients, world, rank),
        is_root=rank == 0,
        average=average,
        agree=agree,
        gather=lambda state: gather_clients(state, num_clients, group),
    )


def _or_minus(value: int | None) -> int:
    return -1 if value is None else int(value)


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bits_float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def collectively(fn: Callable[[], T], group: dist.ProcessGroup | None = None) -> T:
    """Run ``fn`` on every rank; if it fails on any, every rank raises one error naming the first failing rank.

    Without this a bad config or a missing data file on one machine leaves the others waiting in their
    next collective.
    """
    import torch.distributed as dist

    error: str | None = None
    result: Any = None
    own: BaseException | None = None
    try:
        result = fn()
    except StlsgdError as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 -- a bug: report it everywhere, re-raise it with its traceback where it happened
        error, own = f"{type(exc).__name__}: {exc}", exc
    world = dist.get_world_size(group)
    errors: list[str | None] = [None] * world
    dist.all_gather_object(errors, error, group=group)
    if own is not None:
        raise own
    for rank, message in enumerate(errors):
        if message is not None:
            raise StlsgdError(message if world == 1 else f"rank {rank}: {message}")
    return result


def broadcast_object(obj: T | None, group: dist.ProcessGroup | None = None) -> T:
    """Rank 0's ``obj`` on every rank (pickled; used once per run, for the starting state)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, group_src=0, group=group)
    return box[0]  # type: ignore[return-value]


def is_comm_failure(exc: BaseException) -> bool:
    """Whether an exception raised in a collective means the group is lost (gloo reports a closed peer socket
    as a plain RuntimeError)."""
    dist = sys.modules.get("torch.distributed")  # not loaded: no collective ran, so none failed
    if dist is not None and isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("gloo", "connection", "peer", "timed out", "timeout", "nccl", "socket")
    )


def exit_now(message: str, status: int = 2) -> None:
    """Print the one-line error and end the process at once, before torchrun's SIGTERM or a collective
    library's threads (which abort at interpreter exit while a peer is gone) can end it another way."""
    print(f"stlsgd: error: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)


def exit_on_sigterm(message: Callable[[], str]) -> Any:
    """When torchrun stops the job (SIGTERM, after another rank failed), exit with status 2 and one line.
    Returns the handler this replaces, for :func:`signal.signal` to put back."""
    return signal.signal(signal.SIGTERM, lambda signum, frame: exit_now(message()))
