"""STL-SGD: Local SGD with a stagewise communication period (Algorithms 2 and 3)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Literal

from pydantic import Field, model_validator

from stlsgd.algorithms.plan import (
    Cursor,
    Feedback,
    InverseTime,
    Plan,
    Round,
    Stage,
    StagewisePlan,
    check_positive,
    floor_period,
)
from stlsgd.algorithms.registry import MAX_STEPS, LocalMethodConfig, PlanContext, first_stage_iterations, register
from stlsgd.errors import ConfigError, StlsgdError


def first_stage_length(lr: float, lam: float, scale: float = 1.0) -> int:
    """T_1 from the paper's experimental rule eta_1 * T_1 = scale / lambda (Section 5; scale = 1).

    A T_1 beyond MAX_STEPS (a tiny lr or lambda: 1e-320 gives infinity) is a one-line ConfigError."""
    product = lam * lr
    length = scale / product if product > 0 else math.inf  # lam * lr underflows to 0 for lr = 1e-320
    if not length <= MAX_STEPS:
        raise ConfigError(
            f"algorithm.lr: the first stage T_1 = 1 / (lr * lambda) = {length:.3g} iterations (lr = {lr:g}, lambda "
            f"= {lam:g}{f', lr_T1 = {scale:g}' if scale != 1 else ''}) is beyond {MAX_STEPS:.3g}; raise lr or "
            "problem.lam, or give algorithm.T1"
        )
    return max(int(math.ceil(length - 1e-9)), 1)


@dataclass
class STLSGD(StagewisePlan):
    """STL-SGD^sc (Algorithm 2) and STL-SGD^nc (Algorithm 3, Options 1 and 2).

    Stage s (1-based) runs Local SGD for T_s iterations with lr eta_s and period max(floor(k_s), 1):

    - geometric (Algorithm 2 and Algorithm 3 Option 1): eta_s = eta_1/2^(s-1), T_s = 2^(s-1) T_1,
      k_s = 2^(s-1) k_1 (IID) or 2^((s-1)/2) k_1 (Non-IID);
    - linear (Algorithm 3 Option 2): eta_s = eta_1/s, T_s = s T_1, k_s = s k_1 (IID) or sqrt(s) k_1 (Non-IID).

    With ``gamma`` set (STL-SGD^nc) every stage minimises f(x) + 1/(2 gamma) ||x - x_s||^2, x_s the stage's
    starting point. With ``k_max`` set no period exceeds it (a round's compute need not outgrow its
    communication by more than the network asks: ``algorithm.auto`` with ``algorithm.network``).
    """

    T1: int
    k1: float
    lr: float | None = None
    iid: bool = True
    k_max: int | None = None
    option: int = 1
    gamma: float | None = None
    batch: int = 1
    name: str = "stl_sc"

    def __post_init__(self) -> None:
        check_positive(T1=self.T1, k1=self.k1, lr=self.lr, gamma=self.gamma, batch=self.batch, k_max=self.k_max)
        if self.k1 < 1:
            raise ValueError(f"k1: must be >= 1 (the first stage's period in steps), got {self.k1!r}")
        if self.option not in (1, 2):
            raise ValueError(f"option: must be 1 (geometric stages) or 2 (linear), got {self.option!r}")

    def stage(self, s: int) -> tuple[float | None, int, int]:
        """(eta_s, T_s, period_s) of stage ``s`` (1-based); eta_s None when the optimizer owns the lr."""
        if self.option == 1:
            growth = 2.0 ** (s - 1)
            shrink, length = growth, self.T1 * 2 ** (s - 1)
            k = self.k1 * (growth if self.iid else 2.0 ** ((s - 1) / 2))
        else:
            shrink, length = float(s), self.T1 * s
            k = self.k1 * (s if self.iid else math.sqrt(s))
        return None if self.lr is None else self.lr / shrink, length, floor_period(self._capped(k))

    def _capped(self, k: float) -> float:
        return k if self.k_max is None else min(k, float(self.k_max))

    def stage_at(self, s: int, cursor: Cursor, feedback: Feedback) -> Stage:
        lr, length, period = self.stage(s)
        return Stage(None if lr is None else InverseTime(lr), length, period, self.gamma)


# Rounds between the two objectives the stationarity test compares. Comparing successive rounds' objectives on a9a
# Non-IID (evaluated every round), a rise came by chance long before the stage's floor: stages ended after 2-3
# rounds, the lr fell too fast and the run spent its budget at gap 3e-4. Five rounds apart, the same run reached
# 1e-4 in 153 rounds, and in 165 evaluated every 5 rounds (the Non-IID sweeps' interval).
STATIONARY_WINDOW = 5
# With ``diminishing_k``: a stage also ends once its last window dropped the objective by less than this share of
# the stage's drop so far. Measured (auto's plans, seven Non-IID sets and MNIST, seeds 0-2): 0.25 took the synthetic
# set from 275 to 145 rounds and MNIST from 265 to 125-140 (10^7 steps); 0.1 gained less and left one run at the
# budget, 0.5 ended the synthetic set's stages too soon (the budget at every seed). docs/results/schedules.md.
DIMINISHING_SHARE = 0.25


@dataclass
class STLSGDStationary(STLSGD):
    """STL-SGD^sc whose stages end when the iterates are stationary, and whose period grows while that pays.

    Stage s runs at eta_s = eta_1 / 2^(s-1), as Algorithm 2, but

    - it ends when the objective fed back is higher than it was ``STATIONARY_WINDOW`` or more rounds earlier in
      the stage: while the averaged iterates still travel towards x*, the objective falls from one look to the
      next; once they only fluctuate around the stage's floor, a rise is as likely as a fall. That is Pflug's
      stationarity test (as in Lang, Xiao and Zhang, NeurIPS 2019: the first negative inner product of successive
      steps) applied to the objective, which every executor already feeds back. A stage never runs past
      Algorithm 2's T_s = 2^(s-1) T_1;
    - its period is the last stage's times 2 (x sqrt 2 Non-IID) only while each stage's drop in the objective
      is at least a quarter of the drop of the stage before. The floor a stage reaches has two parts: one
      proportional to eta_s (noise; it halves every stage, and so does the drop) and the clients' drift, which
      grows with eta_s k_s (constant while k doubles). A drop that collapses says the drift part dominates;
      keeping k while eta halves then halves it.

    With ``k_max`` set, a round is at most k_max steps; the period the rule above grows is kept uncapped and the
    test compares across as many steps as it would without the cap (:meth:`_window`).

    With ``halvings`` set, eta halves at most that many times: stage s runs at eta_1 / 2^min(s - 1, halvings),
    its length and period as before (so stages still end on the test, and k still grows). Halving below the eta
    whose noise floor is under the target buys nothing at the target, and where the gap left is the slow
    directions' bias, a smaller eta only slows it (``algorithm.auto`` sets it from the clients' noise at x*).

    With ``diminishing_k`` set, a stage whose period is at most that many steps also ends once the objective fell
    by less than ``DIMINISHING_SHARE`` of the stage's drop so far (from the previous stage's lowest) over the
    window: most of what this eta can give is had, and the next halving pays more. Only while the period is
    short: k still doubles each stage, so stages ended this early grow k in fewer rounds, and late stages of ten
    rounds at a long period would cost more steps than the run has (``algorithm.auto`` sets it from the budget).

    Before the first objective the stages are Algorithm 2's. Then the memo holds (stage, its uncapped period, the
    reference objective and the round it settled, the stage's lowest objective, the previous stage's lowest,
    the previous stage's drop).
    """

    diminishing_k: float | None = None
    halvings: int | None = None
    name: str = "stl_sc"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(diminishing_k=self.diminishing_k)
        if self.halvings is not None and self.halvings < 0:
            raise ValueError(f"halvings: must be >= 0, got {self.halvings!r}")

    def stage(self, s: int) -> tuple[float | None, int, int]:
        lr, length, period = super().stage(s)
        if self.lr is None or self.halvings is None or s - 1 <= self.halvings:
            return lr, length, period
        return self.lr / 2.0**self.halvings, length, period  # T_s and k_s go on as Algorithm 2's

    @property
    def adaptive(self) -> bool:  # type: ignore[override]
        return True

    def stage_at(self, s: int, cursor: Cursor, feedback: Feedback) -> Stage:
        if not cursor.memo:
            return super().stage_at(s, cursor, feedback)
        stage_m, period, ref, ref_at, best, before, drop = cursor.memo
        if int(stage_m) != s:  # opening stage s = stage_m + 1
            period = self._grown(period, best, before, drop)
        lr, length, _ = self.stage(s)
        now = feedback.objective
        if (
            int(stage_m) == s
            and now is not None
            and (now > ref or self._diminishing(now, ref, before, period))
            and cursor.index - ref_at >= self._window(period)
            and cursor.iteration > cursor.stage_start
        ):
            length = cursor.iteration - cursor.stage_start  # stationary: the stage ends here
        return Stage(None if lr is None else InverseTime(lr), length, floor_period(self._capped(period)), self.gamma)

    def _memo(self, cursor: Cursor, rnd: Round, feedback: Feedback) -> tuple[float, ...]:
        now = feedback.objective
        if now is None:
            return cursor.memo
        if not cursor.memo:
            return (float(rnd.stage), float(rnd.period), now, float(rnd.index), now, now, 0.0)
        stage_m, period, ref, ref_at, best, before, drop = cursor.memo
        if rnd.stage != int(stage_m):
            grown = self._grown(period, best, before, drop)
            return (float(rnd.stage), grown, now, float(rnd.index), now, best, before - best)
        if rnd.index - ref_at >= self._window(period):  # the test compared and did not fire: a new reference
            ref, ref_at = now, float(rnd.index)
        return (stage_m, period, ref, ref_at, min(best, now), before, drop)

    def _diminishing(self, now: float, ref: float, before: float, period: float) -> bool:
        """Whether the window's drop (ref - now) is under DIMINISHING_SHARE of the stage's drop so far, at a period
        of at most ``diminishing_k`` (unset: never)."""
        return (
            self.diminishing_k is not None
            and period <= self.diminishing_k
            and ref - now < DIMINISHING_SHARE * (before - now)
        )

    def _grown(self, period: float, best: float, before: float, drop: float) -> float:
        """The next stage's period: x2 (x sqrt 2 Non-IID) if the stage just ended dropped at least a quarter of
        the drop of the stage before it (the first stage always), else the same period. Not capped: the cap
        splits a round of this period into shorter ones (:meth:`_window`)."""
        return period * (2.0 if self.iid else math.sqrt(2.0)) if before - best >= drop / 4 else period

    def _window(self, period: float) -> int:
        """Rounds between the objectives the test compares: STATIONARY_WINDOW rounds of the uncapped period. With
        the period capped, five capped rounds hold fewer steps, over which the objective falls less than its
        noise: stages then ended at once and the lr halved to nothing (a9a Non-IID capped at 1,120 steps: the
        gap stuck at 2.1e-4, MNIST at 1,565: 1.1e-3; with the window in steps, both reached the target)."""
        return STATIONARY_WINDOW * math.ceil(period / self._capped(period) - 1e-9)


# --------------------------------------------------------------------------- config models (the registry)


class _Stagewise(LocalMethodConfig):
    k: float = Field(1.0, ge=1, le=MAX_STEPS, description="k_1, the first stage's period")
    T1: int | None = Field(None, ge=1, le=MAX_STEPS, description="first stage length in iterations")
    T1_epochs: float | None = Field(None, gt=0, le=MAX_STEPS, description="first stage length in epochs")
    iid: bool | None = Field(
        None,
        description="k growth x2 (IID) or x sqrt 2 (Non-IID) a stage; default from "
        "the partition, or x2 with drift correction",
    )
    k_max: int | None = Field(None, ge=1, le=MAX_STEPS, description="cap on every stage's period (unset: none)")

    @model_validator(mode="after")
    def _one_length(self) -> _Stagewise:
        if self.T1 is not None and self.T1_epochs is not None:
            raise ValueError("T1: give T1 or T1_epochs, not both")
        if self.k_max is not None and self.k > self.k_max:
            raise ValueError(f"k: the first period {self.k:g} is above k_max = {self.k_max}")
        return self

    def growth_iid(self, ctx: PlanContext) -> bool:
        """k x 2 a stage unless set: drift correction removes what the Non-IID rule (x sqrt 2) guards against."""
        return self.iid if self.iid is not None else (True if self.drift else ctx.iid)


@register
class STLSCConfig(_Stagewise):
    """STL-SGD^sc (Algorithm 2): per stage eta/2, T x2, k x2 (IID) or x sqrt 2 (Non-IID)."""

    method: Literal["stl_sc"] = "stl_sc"
    lr_T1: float = Field(1.0, gt=0, description="eta_1 T_1 = lr_T1 / lambda when T1 is unset (the paper: 1)")
    auto: bool = Field(
        False,
        description="the method and its settings from the data's estimated constants (stlsgd suggest): this with "
        "drift and stationary stages (Non-IID); one round of Local SGD sized for the target gap, else LR-coupled "
        "STL (IID); no grid",
    )
    network: str | None = Field(
        None,
        description="auto only: the network the run is priced on (as --network: a preset with step=, or a "
        "calibrated profile); auto then caps its period where a round's compute outgrows its communication",
    )
    stage_end: Literal["length", "stationary"] | None = Field(
        None,
        description="length (unset: length, or auto's choice): a stage ends after T_s (Algorithm 2); stationary: "
        "when the objective stops falling, at most T_s, and k x2 only while each stage's drop holds",
    )
    diminishing_k: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="stationary stages only: while the period is at most this many steps, a stage also ends once "
        "the objective's fall over the test's window is under a quarter of the stage's fall so far (unset: off, "
        "or auto's choice)",
    )
    halvings: int | None = Field(
        None,
        ge=0,
        le=64,
        description="stationary stages only: eta halves at most this many times, stage s at eta_1 / 2^min(s - 1, "
        "halvings), their lengths and periods as before (unset: no floor, or auto's choice)",
    )
    # Unset (None) means off, or auto's choice: so that `drift = false` given with auto is seen, and refused.
    drift: bool | None = Field(  # type: ignore[assignment]
        None,
        description="SCAFFOLD control variates (option II) correct each client's steps for client drift; a round "
        "then also sends the control variate (unset: off, or auto's choice)",
    )

    @model_validator(mode="after")
    def _auto_alone(self) -> STLSCConfig:
        # A resolved config (config.yaml) holds every field at its default: only values that differ are refused.
        # iid and drift default to None (unset), so an explicit false is refused too: auto would override it.
        given = sorted(
            f
            for f in (
                "lr",
                "k",
                "T1",
                "T1_epochs",
                "lr_T1",
                "drift",
                "drift_window",
                "drift_share",
                "iid",
                "stage_end",
                "k_max",
                "diminishing_k",
                "halvings",
            )
            if getattr(self, f) != type(self).model_fields[f].default
        )
        if self.auto and given:
            raise ValueError(f"auto: sets {', '.join(given)} itself; remove {'it' if len(given) == 1 else 'them'}")
        if self.diminishing_k is not None and self.stage_end != "stationary":
            raise ValueError('diminishing_k: only with stage_end = "stationary" (it ends stationary stages sooner)')
        if self.halvings is not None and self.stage_end != "stationary":
            raise ValueError('halvings: only with stage_end = "stationary" (it keeps stationary stages\' eta up)')
        if self.network is not None:
            if not self.auto:
                raise ValueError("network: only with auto = true (it tells auto what a round and a step cost)")
            from stlsgd.costmodel import parse_network, require_step  # the cost model's one-line errors

            try:
                require_step(parse_network(self.network, "network"), "network", "auto")
            except StlsgdError as exc:
                raise ValueError(str(exc)) from None
        return self

    def plan(self, ctx: PlanContext) -> Plan:
        T1 = first_stage_iterations(self.T1, self.T1_epochs, self.batch, ctx)
        if T1 is None:
            if ctx.lam is None:
                raise ConfigError("algorithm.T1: give T1 or T1_epochs (eta_1 T_1 = 1/lambda needs a logistic lambda)")
            T1 = first_stage_length(self.lr, ctx.lam, self.lr_T1)
        make = (
            partial(STLSGDStationary, diminishing_k=self.diminishing_k, halvings=self.halvings)
            if self.stage_end == "stationary"
            else STLSGD
        )
        return make(lr=self.lr, T1=T1, k1=self.k, iid=self.growth_iid(ctx), batch=self.batch, k_max=self.k_max)


@register
class STLNCConfig(_Stagewise):
    """STL-SGD^nc (Algorithm 3): a proximal term 1/(2 gamma)||x - x_s||^2 reset each stage."""

    method: Literal["stl_nc"] = "stl_nc"
    gamma: float = Field(gt=0, description="the proximal gamma")
    option: Literal[1, 2] = Field(
        1, description="1: geometric stages (as sc); 2: eta_1/s, s T_1, s k_1 (IID) or sqrt(s) k_1"
    )

    @model_validator(mode="after")
    def _length_given(self) -> STLNCConfig:
        if self.T1 is None and self.T1_epochs is None:
            raise ValueError("T1: stl_nc needs the first stage length (T1 or T1_epochs)")
        return self

    def plan(self, ctx: PlanContext) -> Plan:
        T1 = first_stage_iterations(self.T1, self.T1_epochs, self.batch, ctx)
        assert T1 is not None  # _length_given refused a config without either
        return STLSGD(
            lr=self.lr,
            T1=T1,
            k1=self.k,
            iid=self.growth_iid(ctx),
            option=self.option,
            gamma=self.gamma,
            batch=self.batch,
            k_max=self.k_max,
            name="stl_nc",
        )
