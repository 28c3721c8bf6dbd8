"""Plans: every method in the paper is a sequence of communication rounds.

A :class:`Round` says everything an executor needs to run one round -- how many local steps, the learning
rate of each step, the per-client mini-batch size and, for STL-SGD^nc (Algorithm 3), the proximal term --
and nothing about tensors or processes. Plans are pure and deterministic: ``plan.rounds(start=r)`` yields the
same rounds from index ``r`` on every call, which is what makes checkpoint/resume and the simulator /
torch.distributed equivalence possible.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Round:
    """One communication round: ``steps`` local steps on every client, then one model average.

    The learning rate of the step taken at global iteration ``t`` is ``lr / (1 + lr_decay * t)``
    (``lr_decay`` is the paper's alpha; 0 gives a fixed lr). ``prox_gamma`` is STL-SGD^nc's gamma: each local
    step then minimises f(x) + 1/(2 gamma) ||x - x_s||^2, with the anchor x_s the averaged model at the start
    of the stage (``new_anchor`` marks the round where it is taken).
    """

    index: int
    stage: int
    start_iteration: int
    steps: int
    batch: int
    lr: float
    lr_decay: float = 0.0
    period: int = 1
    prox_gamma: float | None = None
    new_anchor: bool = False

    def learning_rates(self) -> np.ndarray:
        """Learning rate of each of the round's local steps (Algorithm 1 with eta_t = eta_1/(1+alpha t))."""
        t = self.start_iteration + np.arange(self.steps, dtype=np.float64)
        return self.lr / (1.0 + self.lr_decay * t)

    @property
    def end_iteration(self) -> int:
        return self.start_iteration + self.steps


class Plan(abc.ABC):
    """A method as a (possibly endless) sequence of rounds; the executor decides when to stop."""

    name: str

    @abc.abstractmethod
    def _all_rounds(self) -> Iterator[Round]:
        """Every round from the first, in order."""

    def rounds(self, start: int = 0) -> Iterator[Round]:
        """Rounds from index ``start`` on; regenerating the skipped ones is cheap and keeps plans stateless."""
        for rnd in self._all_rounds():
            if rnd.index >= start:
                yield rnd

    def describe(self) -> dict[str, object]:
        """The plan's parameters, for summaries and reports."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


def floor_period(k: float) -> int:
    """max(floor(k), 1) as in Algorithms 2 and 3; the epsilon absorbs float error of sqrt(2)**s products."""
    return max(int(math.floor(k + 1e-9)), 1)


def stage_rounds(
    *,
    first_index: int,
    stage: int,
    start_iteration: int,
    length: int,
    period: int,
    batch: int,
    lr: float,
    lr_decay: float = 0.0,
    prox_gamma: float | None = None,
) -> Iterator[Round]:
    """Local SGD (Algorithm 1) for ``length`` iterations with period ``period``: ceil(length/period) rounds,
    the last one shorter when ``period`` does not divide ``length``."""
    done = 0
    index = first_index
    while done < length:
        steps = min(period, length - done)
        yield Round(
            index=index,
            stage=stage,
            start_iteration=start_iteration + done,
            steps=steps,
            batch=batch,
            lr=lr,
            lr_decay=lr_decay,
            period=period,
            prox_gamma=prox_gamma,
            new_anchor=prox_gamma is not None and done == 0,
        )
        done += steps
        index += 1
