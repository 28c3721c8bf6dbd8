"""What an executor needs from a problem, whatever algorithm made the plan.

Client state is a dict of arrays (NumPy or torch) whose first axis is the client axis; averaging is a mean
over that axis (simulator) or an all-reduce of the flattened arrays (torch.distributed), see
:mod:`stlsgd.executors.averaging`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

State = dict[str, Any]


@dataclass(frozen=True)
class Evaluation:
    """The averaged model on the full training set: objective f(x) (loss for nets) and accuracy."""

    objective: float
    accuracy: float


class Problem(Protocol):
    """A training problem the executors can run."""

    num_samples: int
    #: Eq. 8's lambda for the rule eta_1 T_1 = 1/lambda; None where the objective has no L2 term (nets).
    lam: float | None

    def init_state(self, num_clients: int, seed: int) -> State:
        """Every client starts from the same x_0 (Algorithm 1, 'Initialize')."""

    #: The keys of the state that are parameters (the rest are buffers: averaged, never stepped).
    param_names: list[str]

    def local_steps(
        self,
        state: State,
        rows: np.ndarray,
        lrs: np.ndarray,
        prox: tuple[float, State] | None,
        drift: State | None = None,
    ) -> None:
        """Run ``len(lrs)`` local SGD steps in place on every client held in ``state``.

        ``rows[t, c, :]`` are the training-set rows of client c's mini-batch at step t. ``prox`` is
        (1/gamma, anchor) for STL-SGD^nc's term 1/(2 gamma) ||x - x_s||^2, or None. ``drift`` is SCAFFOLD's
        correction c - c_i of each client (stacked like the parameters), added to every stochastic gradient,
        or None.
        """

    def warm_up(self) -> None:
        """Load or compile what the first local step needs (numba kernels), so that a run's clock (wall_s,
        compute_s) times its rounds and not the process's start-up."""

    def evaluate(self, state: State) -> Evaluation:
        """Objective and accuracy of the model held by client 0 (called right after an average)."""

    def optimum(self, cache_dir: Path | None = None) -> float | None:
        """f(x*) when it is known exactly (convex problems), else None; ``cache_dir`` keeps computed optima."""


@runtime_checkable
class FusedSyncSteps(Protocol):
    """A problem that can take many k = 1 rounds in one call (a capability the simulator checks for)."""

    def sync_steps(self, state: State, rows: np.ndarray, lrs: np.ndarray, prox: tuple[float, State] | None) -> None:
        """``local_steps`` one step at a time with the average over the clients after each step, for clients
        that start equal: the same numbers as ``len(lrs)`` rounds of one step each."""
