"""What an executor needs from a problem, whatever algorithm made the plan.

Client state is a dict of arrays (NumPy or torch) whose first axis is the client axis; averaging is a mean
over that axis (simulator) or an all-reduce of the flattened arrays (torch.distributed), see
:mod:`stlsgd.executors.averaging`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

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

    def init_state(self, num_clients: int, seed: int) -> State:
        """Every client starts from the same x_0 (Algorithm 1, 'Initialize')."""

    def local_steps(
        self, state: State, rows: np.ndarray, lrs: np.ndarray, prox: tuple[float, State] | None
    ) -> None:
        """Run ``len(lrs)`` local SGD steps in place on every client held in ``state``.

        ``rows[t, c, :]`` are the training-set rows of client c's mini-batch at step t. ``prox`` is
        (1/gamma, anchor) for STL-SGD^nc's term 1/(2 gamma) ||x - x_s||^2, or None.
        """

    # Optional: ``sync_steps(state, rows, lrs, prox)``, the same as ``local_steps`` one step at a time with a
    # mean over the clients after each step, for clients that start equal. The simulator uses it, when a
    # problem has it, to take runs of k = 1 rounds (SyncSGD, LB-SGD, CR-PSGD) in one call.

    def evaluate(self, state: State) -> Evaluation:
        """Objective and accuracy of the model held by client 0 (called right after an average)."""

    def optimum(self) -> float | None:
        """f(x*) when it is known exactly (convex problems), else None."""
