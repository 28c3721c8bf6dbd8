"""The plan driver: one object that runs a :class:`~stlsgd.algorithms.plan.Plan` round by round, for every
executor (the simulator, the torchrun executor, the drop-in, Flower).

A plan is pure: it maps a cursor and feedback to a round. What an executor does with that -- hold the cursor,
settle the round that starts now, count the round's steps, advance the cursor with the feedback that settled
the round, and save all of it with the plan's identity in a checkpoint -- is written here once.

::

    driver = PlanDriver(plan)                 # or PlanDriver(plan, DriverState.from_dict(saved["driver"]))
    rnd = driver.settle(Feedback(lr=...))     # the round that starts now (period, lr, per-step lrs); idempotent
    ...                                       # one local step (rnd.learning_rates()[driver.step] is its lr)
    if driver.count():                        # True when that step was the round's last
        average(...)
        done = driver.finish()                # the cursor moves past ``done``; the next settle() starts a round
    saved = driver.state_dict()               # JSON: the plan's identity, the cursor, the step, the feedback

State in, state out (as optax): :attr:`PlanDriver.state` is a frozen :class:`DriverState` (cursor, step in the
round, the feedback that settled the round); ``PlanDriver(plan, state)`` continues from it exactly, because the
same cursor and feedback always give the same round. The driver asks the plan once per round
(:meth:`PlanDriver.settle` caches the round), so every schedule costs O(1) per step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from stlsgd.algorithms.budget import within_budget
from stlsgd.algorithms.plan import NO_FEEDBACK, Cursor, Feedback, Plan, Round
from stlsgd.errors import StlsgdError

STATE_KEYS = ("plan", "cursor", "step", "feedback")


def plan_identity(plan: Plan) -> dict[str, Any]:
    """What a checkpoint records of the plan it was taken with: its class and parameters (JSON)."""
    return {"name": type(plan).__name__, **plan.describe()}


@dataclass(frozen=True)
class DriverState:
    """Where a run stands: ``cursor`` (the plan's position at the start of the current round), ``step`` (local
    steps taken in the current round, 0 at a round boundary) and ``feedback`` (what settled the current round;
    None before it is settled). A checkpoint holds this, as :meth:`to_dict`."""

    cursor: Cursor = field(default_factory=Cursor)
    step: int = 0
    feedback: Feedback | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor.to_dict(),
            "step": self.step,
            "feedback": None if self.feedback is None else dataclasses.asdict(self.feedback),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DriverState:
        feedback = data.get("feedback")
        return cls(
            cursor=Cursor.from_dict(data["cursor"]),
            step=int(data["step"]),
            feedback=None if feedback is None else Feedback(**feedback),
        )


class PlanDriver:
    """Runs ``plan`` from ``state`` (default: the start); see the module docstring.

    Attributes and methods, in the order a round uses them:

    - :meth:`peek` ``(feedback)``: the round that would start now, without settling it (the simulator's look-ahead
      when it fuses one-step rounds). A settled round is returned as it was settled.
    - :meth:`settle` ``(feedback)``: settle the round that starts at the cursor with ``feedback`` (the lr the
      optimizer will use, the last objective); returns it. Once settled, later calls return the same round
      whatever their feedback, until :meth:`finish`.
    - :attr:`round`: the settled round, or None between rounds.
    - :meth:`count` ``(steps=1)``: count local steps of the settled round; True when the round is complete.
    - :meth:`finish`: end the settled round (all its steps counted, or any number of them: a caller may end a
      round early); the cursor advances with the feedback that settled it. Returns the finished round.
    - :meth:`take` ``(feedback)``: settle, count every step and finish, in one call (executors that run a whole
      round at once).
    - :attr:`cursor`, :attr:`step`, :attr:`iteration` (steps so far, the paper's t), :attr:`state`
      (:class:`DriverState`), :attr:`identity` (the plan's, for checkpoints).
    - :meth:`state_dict` / :meth:`load_state_dict`: the state and the plan's identity as JSON; a load is checked
      (another plan, a missing key, a negative step, a step past the round's end: one-line
      :class:`~stlsgd.errors.StlsgdError`, prefixed with ``who``).
    """

    def __init__(self, plan: Plan, state: DriverState | None = None, *, max_iterations: int | None = None) -> None:
        self.plan = plan
        #: A hard cap on iterations: the round that would cross it is cut there (``algorithms.budget``).
        self.max_iterations = max_iterations
        self.identity = plan_identity(plan)
        self._state = DriverState()
        self._round: Round | None = None
        self._peeked: tuple[Feedback, Round] | None = None
        if state is not None:
            self.state = state

    # ------------------------------------------------------------------ where the run stands

    @property
    def state(self) -> DriverState:
        return self._state

    @state.setter
    def state(self, state: DriverState) -> None:
        """Continue from ``state`` exactly (a mid-round state re-settles its round with its own feedback)."""
        if state.step < 0:
            raise ValueError(f"step: must be >= 0, got {state.step}")
        self._peeked = None
        self._round = None
        if state.feedback is not None:
            self._round = self._ask(state.cursor, state.feedback)
            if state.step >= self._round.steps and state.step:
                raise ValueError(
                    f"step {state.step} is outside round {state.cursor.index}, which has {self._round.steps} steps"
                )
        elif state.step:
            raise ValueError(f"step {state.step} of a round that was never settled (no feedback)")
        self._state = state

    @property
    def cursor(self) -> Cursor:
        return self._state.cursor

    @property
    def step(self) -> int:
        return self._state.step

    @property
    def iteration(self) -> int:
        return self._state.cursor.iteration + self._state.step

    @property
    def round(self) -> Round | None:
        return self._round

    @property
    def at_boundary(self) -> bool:
        return self._state.step == 0

    # ------------------------------------------------------------------ the round

    def peek(self, feedback: Feedback = NO_FEEDBACK) -> Round:
        if self._round is not None:
            return self._round
        if self._peeked is None or self._peeked[0] != feedback:
            self._peeked = (feedback, self._ask(self._state.cursor, feedback))
        return self._peeked[1]

    def _ask(self, cursor: Cursor, feedback: Feedback) -> Round:
        """The plan's round at ``cursor``, cut at the iteration budget if it would cross it."""
        return within_budget(self.plan.next_round(cursor, feedback), self.max_iterations)

    def settle(self, feedback: Feedback = NO_FEEDBACK) -> Round:
        if self._round is None:
            self._round = self.peek(feedback)
            self._peeked = None
            self._state = dataclasses.replace(self._state, feedback=feedback)
        return self._round

    def count(self, steps: int = 1) -> bool:
        rnd = self._round
        if rnd is None:
            raise RuntimeError("PlanDriver.count: no round settled (call settle first)")
        step = self._state.step + steps
        if step > rnd.steps:
            raise RuntimeError(f"PlanDriver.count: step {step} past the round's {rnd.steps}")
        self._state = dataclasses.replace(self._state, step=step)
        return step == rnd.steps

    def finish(self) -> Round:
        rnd, feedback = self._round, self._state.feedback
        if rnd is None or feedback is None:
            raise RuntimeError("PlanDriver.finish: no round settled")
        self._state = DriverState(cursor=self.plan.advance(self._state.cursor, rnd, feedback))
        self._round = None
        return rnd

    def take(self, feedback: Feedback = NO_FEEDBACK) -> Round:
        rnd = self.settle(feedback)
        self.count(rnd.steps - self._state.step)
        return self.finish()

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {"plan": self.identity, **self._state.to_dict()}

    def load_state_dict(self, saved: dict[str, Any], who: str = "PlanDriver.load_state_dict") -> None:
        if not isinstance(saved, dict):
            raise StlsgdError(f"{who}: expected a dict, got {type(saved).__name__}")
        missing = [k for k in STATE_KEYS if k not in saved]
        if missing:
            raise StlsgdError(f"{who}: the state has no {', '.join(missing)} (not a state this stlsgd saved)")
        if saved["plan"] != self.identity:
            raise StlsgdError(f"{who}: the state was taken with plan {saved['plan']}, not {self.identity}")
        step = saved["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise StlsgdError(f"{who}: step must be a whole number >= 0, got {step!r}")
        try:
            self.state = DriverState.from_dict(saved)
        except (TypeError, ValueError, KeyError) as err:
            raise StlsgdError(f"{who}: {err}") from None


__all__ = ["DriverState", "PlanDriver", "plan_identity"]
