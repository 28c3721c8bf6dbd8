"""Plans: every method is a sequence of communication rounds, produced one round at a time from a cursor.

A :class:`Round` says everything an executor needs to run one round -- how many local steps, the learning
rate of each step, the per-client mini-batch size and, for STL-SGD^nc (Algorithm 3), the proximal term --
and nothing about tensors or processes. A plan is pure: :meth:`Plan.next_round` maps a :class:`Cursor`
(where the run stands between two rounds: explicit data that a checkpoint stores) and the run's
:class:`Feedback` to the next round in O(1), and :meth:`Plan.advance` gives the cursor after it. The same
cursor and feedback always give the same round, which is what makes checkpoint/resume exact and lets the
simulator, the torch.distributed executor and the drop-in run one plan alike.

Adaptive plans (the period follows the loss, or the learning rate the user's optimizer actually uses) read
their input from :class:`Feedback`, never from a process or a tensor, so runs stay deterministic.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

# --------------------------------------------------------------------------- learning-rate schedules


@dataclass(frozen=True)
class InverseTime:
    """eta_t = lr / (1 + decay t), t the global iteration (the paper's baselines, Section 5; decay 0: fixed)."""

    lr: float
    decay: float = 0.0

    def __call__(self, t: int | np.ndarray) -> np.ndarray:
        return self.lr / (1.0 + self.decay * np.asarray(t, dtype=np.float64))


@dataclass(frozen=True)
class StepDecay:
    """eta_t = lr * factor^floor(t / every) (``torch.optim.lr_scheduler.StepLR``)."""

    lr: float
    every: int
    factor: float = 0.5

    def __call__(self, t: int | np.ndarray) -> np.ndarray:
        return self.lr * self.factor ** np.floor_divide(np.asarray(t, dtype=np.int64), self.every).astype(np.float64)


@dataclass(frozen=True)
class Cosine:
    """eta_t = final + (lr - final) (1 + cos(pi t / total)) / 2, held at ``final`` after ``total`` steps."""

    lr: float
    total: int
    final: float = 0.0

    def __call__(self, t: int | np.ndarray) -> np.ndarray:
        x = np.minimum(np.asarray(t, dtype=np.float64), self.total) / self.total
        return self.final + (self.lr - self.final) * 0.5 * (1.0 + np.cos(np.pi * x))


LRSchedule = InverseTime | StepDecay | Cosine


# --------------------------------------------------------------------------- rounds, cursors, feedback


@dataclass(frozen=True)
class Round:
    """One communication round: ``steps`` local steps on every client, then one model average.

    The step taken at global iteration t uses the learning rate ``lrs(t)``. ``period`` is the stage's
    nominal communication period k_s (a stage's last round may be shorter). ``prox_gamma`` is STL-SGD^nc's
    gamma: each local step then minimises f(x) + 1/(2 gamma) ||x - x_s||^2, with the anchor x_s the
    averaged model at the start of the stage (``new_anchor`` marks the round where it is taken).
    """

    index: int
    stage: int
    start_iteration: int
    steps: int
    batch: int
    lrs: LRSchedule | None
    period: int = 1
    prox_gamma: float | None = None
    new_anchor: bool = False

    def learning_rates(self) -> np.ndarray:
        """Learning rate of each of the round's local steps (a plan that leaves it to the optimizer has none)."""
        if self.lrs is None:
            raise ValueError("this plan leaves the learning rate to the optimizer; give the plan an lr")
        return self.lrs(self.start_iteration + np.arange(self.steps, dtype=np.int64))

    @property
    def lr(self) -> float | None:
        """The learning rate of the round's first step (None: the optimizer's)."""
        return None if self.lrs is None else float(self.lrs(np.array([self.start_iteration]))[0])

    @property
    def end_iteration(self) -> int:
        return self.start_iteration + self.steps


@dataclass(frozen=True)
class Cursor:
    """Where a run stands between rounds; all a plan needs to produce the next round (JSON in checkpoints).

    ``samples``: samples processed by each client so far (client-steps); ``stage_start``: the iteration at
    which the current stage began; ``memo``: a plan's own running values (an adaptive period, a growing
    batch), numbers only.
    """

    index: int = 0
    iteration: int = 0
    samples: int = 0
    stage: int = 1
    stage_start: int = 0
    memo: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "memo": list(self.memo)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cursor:
        return cls(**{**data, "memo": tuple(data.get("memo", ()))})


@dataclass(frozen=True)
class Feedback:
    """What a run tells an adaptive plan before each round (explicit input, so runs stay deterministic).

    ``objective``: training objective (loss) of the averaged model at the last evaluation, None before the
    first; ``lr``: the learning rate the optimizer will use for the round's first step, where the user's
    optimizer owns it (the drop-in), else None.
    """

    objective: float | None = None
    lr: float | None = None


NO_FEEDBACK = Feedback()


class Plan(abc.ABC):
    """A method as an endless sequence of rounds; the executor decides when to stop."""

    name: str
    #: Whether :meth:`next_round` reads :class:`Feedback` (the executors then pass the objective).
    adaptive: bool = False

    @abc.abstractmethod
    def next_round(self, cursor: Cursor, feedback: Feedback = NO_FEEDBACK) -> Round:
        """The round that starts at ``cursor``, in O(1)."""

    def advance(self, cursor: Cursor, rnd: Round, feedback: Feedback = NO_FEEDBACK) -> Cursor:
        """The cursor after ``rnd`` (the round :meth:`next_round` gave for ``cursor`` and ``feedback``)."""
        return Cursor(
            index=rnd.index + 1,
            iteration=rnd.end_iteration,
            samples=cursor.samples + rnd.steps * rnd.batch,
            stage=rnd.stage,
            stage_start=cursor.stage_start if rnd.stage == cursor.stage else rnd.start_iteration,
            memo=self._memo(cursor, rnd, feedback),
        )

    def _memo(self, cursor: Cursor, rnd: Round, feedback: Feedback) -> tuple[float, ...]:
        """A plan's running values after ``rnd`` (override in plans that keep some)."""
        return cursor.memo

    def rounds(self, start: int = 0, feedback: Feedback = NO_FEEDBACK) -> Iterator[Round]:
        """Every round from index ``start`` on, under constant ``feedback`` (tests, reports, counting)."""
        cursor = Cursor()
        while True:
            rnd = self.next_round(cursor, feedback)
            if rnd.index >= start:
                yield rnd
            cursor = self.advance(cursor, rnd, feedback)

    def describe(self) -> dict[str, object]:
        """The plan's parameters, for summaries and reports."""
        return {
            k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v)
            for k, v in vars(self).items()
            if not k.startswith("_")
        }


def check_positive(**values: float | None) -> None:
    """Plans built directly in Python (the drop-in) check their own numbers: each must be > 0 and finite."""
    for name, value in values.items():
        if value is not None and not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ValueError(f"{name}: must be a positive finite number, got {value!r}")


def floor_period(k: float) -> int:
    """max(floor(k), 1) as in Algorithms 2 and 3; the epsilon absorbs float error of sqrt(2)**s products."""
    return max(int(math.floor(k + 1e-9)), 1)


@dataclass(frozen=True)
class Stage:
    """One stage of a stagewise plan: ``length`` iterations of Local SGD with period ``period``."""

    lrs: LRSchedule | None
    length: int
    period: int
    prox_gamma: float | None = None


class StagewisePlan(Plan):
    """Stages of Local SGD (Algorithm 1 inside Algorithms 2 and 3): :meth:`stage_at` gives stage s.

    A stage of T_s iterations with period k_s has ceil(T_s / k_s) rounds, the last one shorter when k_s does
    not divide T_s. The cursor's ``stage`` and ``stage_start`` locate the stage in O(1).
    """

    batch: int = 1

    @abc.abstractmethod
    def stage_at(self, s: int, cursor: Cursor, feedback: Feedback) -> Stage:
        """Stage ``s`` (1-based) as seen from ``cursor`` (which lies in it)."""

    def next_round(self, cursor: Cursor, feedback: Feedback = NO_FEEDBACK) -> Round:
        s, begin = cursor.stage, cursor.stage_start
        stage = self.stage_at(s, cursor, feedback)
        if cursor.iteration >= begin + stage.length:
            s, begin = s + 1, cursor.iteration
            stage = self.stage_at(s, dataclasses.replace(cursor, stage=s, stage_start=begin), feedback)
        return Round(
            index=cursor.index,
            stage=s,
            start_iteration=cursor.iteration,
            steps=min(stage.period, begin + stage.length - cursor.iteration),
            batch=self.batch,
            lrs=stage.lrs,
            period=stage.period,
            prox_gamma=stage.prox_gamma,
            new_anchor=stage.prox_gamma is not None and cursor.iteration == begin,
        )


__all__ = [
    "NO_FEEDBACK",
    "Cosine",
    "Cursor",
    "Feedback",
    "InverseTime",
    "LRSchedule",
    "Plan",
    "Round",
    "Stage",
    "StagewisePlan",
    "StepDecay",
    "check_positive",
    "floor_period",
]
