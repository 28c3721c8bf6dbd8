"""Period schedules beyond the paper's: when to average, as plans the simulator, torchrun and the drop-in share.

- :class:`PostLocalSGD` (Lin et al., ICLR 2020): synchronous for the first ``warmup`` steps, then period H;
- :class:`LRCoupled`: the paper's principle that eta_s k_s stays constant (Algorithm 2 halves eta and doubles k),
  applied to any learning-rate schedule: k_t = k_1 eta_1 / eta_t, eta_t the learning rate of the round's first
  step -- the plan's own schedule in the simulator, the lr the user's optimizer actually uses in the drop-in;
- :class:`QSR`, the quadratic synchronisation rule (Gu et al., ICLR 2024): k_t = max(H_base, floor((alpha/eta_t)^2));
- :class:`AdaComm` (Wang & Joshi, MLSys 2019): the period shrinks as the loss falls,
  k = ceil(k_0 sqrt(F / F_0)), F the objective fed back at the round's start and F_0 the first one fed back.

Every period is capped at ``k_max``. Each plan reads what it adapts to from :class:`~stlsgd.algorithms.plan.Feedback`
and keeps what it must remember (eta_1, F_0) in the cursor's memo, so runs are deterministic and resumable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from stlsgd.algorithms.plan import (
    NO_FEEDBACK,
    Cosine,
    Cursor,
    Feedback,
    InverseTime,
    LRSchedule,
    Plan,
    Round,
    StepDecay,
    check_positive,
)
from stlsgd.algorithms.registry import MAX_STEPS, LocalMethodConfig, PlanContext, register

DEFAULT_K_MAX = 2**20


def _period(k: float, k_max: int) -> int:
    """max(floor(k), 1), at most ``k_max``; k may be inf (an lr of 0)."""
    return max(1, min(k_max, int(math.floor(k + 1e-9)) if math.isfinite(k) else k_max))


@dataclass
class _LocalPlan(Plan):
    """Rounds of ``period_at(cursor, feedback)`` steps, at the learning rates of ``lrs`` (None: the optimizer's)."""

    lrs: LRSchedule | None = None
    batch: int = 1
    k_max: int = DEFAULT_K_MAX

    def period_at(self, cursor: Cursor, feedback: Feedback) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def lr_at(self, cursor: Cursor, feedback: Feedback) -> float | None:
        """The learning rate of the round's first step: the optimizer's when fed back, else the plan's own."""
        if feedback.lr is not None:
            return feedback.lr
        return None if self.lrs is None else float(self.lrs(cursor.iteration))

    def next_round(self, cursor: Cursor, feedback: Feedback = NO_FEEDBACK) -> Round:
        k = self.period_at(cursor, feedback)
        return Round(
            index=cursor.index,
            stage=1,
            start_iteration=cursor.iteration,
            steps=k,
            batch=self.batch,
            lrs=self.lrs,
            period=k,
        )


@dataclass
class PostLocalSGD(_LocalPlan):
    """Post-local SGD (Lin et al., ICLR 2020): average after every step for ``warmup`` steps, then every ``k``."""

    k: int = 1
    warmup: int = 0
    name: str = "post_local"

    def __post_init__(self) -> None:
        check_positive(k=self.k)
        if self.warmup < 0:
            raise ValueError(f"warmup: must be >= 0 steps, got {self.warmup}")

    def period_at(self, cursor: Cursor, feedback: Feedback) -> int:
        return 1 if cursor.iteration < self.warmup else min(self.k, self.k_max)


@dataclass
class LRCoupled(_LocalPlan):
    """k_t = k_1 eta_1 / eta_t (the paper's eta k = constant, for any schedule of eta).

    ``lr1`` is eta_1; None: the learning rate of the first round, remembered in the cursor's memo.
    """

    k1: float = 1.0
    lr1: float | None = None
    name: str = "lr_coupled"

    def __post_init__(self) -> None:
        check_positive(lr1=self.lr1)
        if not (isinstance(self.k1, (int, float)) and 1 <= self.k1 < math.inf):
            raise ValueError(f"k1: must be >= 1 (the period at eta_1, in steps), got {self.k1!r}")

    def _eta1(self, cursor: Cursor, lr: float) -> float:
        return self.lr1 if self.lr1 is not None else (cursor.memo[0] if cursor.memo else lr)

    def period_at(self, cursor: Cursor, feedback: Feedback) -> int:
        lr = self.lr_at(cursor, feedback)
        if lr is None:
            raise ValueError("lr_coupled needs a learning rate: its own schedule, or the optimizer's fed back")
        return _period(self.k1 * self._eta1(cursor, lr) / lr if lr > 0 else math.inf, self.k_max)

    def _memo(self, cursor: Cursor, rnd: Round, feedback: Feedback) -> tuple[float, ...]:
        if cursor.memo or self.lr1 is not None:
            return cursor.memo
        lr = self.lr_at(cursor, feedback)
        return () if lr is None else (lr,)  # None cannot come: period_at refused the round already


@dataclass
class QSR(_LocalPlan):
    """The quadratic synchronisation rule (Gu et al., ICLR 2024): k_t = max(H_base, floor((alpha / eta_t)^2))."""

    h_base: int = 1
    alpha: float = 0.1
    name: str = "qsr"

    def __post_init__(self) -> None:
        check_positive(h_base=self.h_base, alpha=self.alpha)

    def period_at(self, cursor: Cursor, feedback: Feedback) -> int:
        lr = self.lr_at(cursor, feedback)
        if lr is None:
            raise ValueError("qsr needs a learning rate: its own schedule, or the optimizer's fed back")
        return _period(max(self.h_base, (self.alpha / lr) ** 2 if lr > 0 else math.inf), self.k_max)


@dataclass
class AdaComm(_LocalPlan):
    """AdaComm (Wang & Joshi, MLSys 2019): k = ceil(k0 sqrt(F / F_0)), F the objective fed back now, F_0 the
    first one (the memo); k0 until an objective is fed back. Wang & Joshi also scale by sqrt(eta_0 / eta) when
    the lr decays; that factor is applied when a learning rate is known."""

    k0: int = 1
    name: str = "adacomm"
    adaptive = True

    def __post_init__(self) -> None:
        check_positive(k0=self.k0)

    def period_at(self, cursor: Cursor, feedback: Feedback) -> int:
        if feedback.objective is None or not cursor.memo:
            return min(self.k0, self.k_max)
        f0, lr0 = cursor.memo
        ratio = max(feedback.objective, 0.0) / f0 if f0 > 0 else 1.0
        lr = self.lr_at(cursor, feedback)
        scale = math.sqrt(lr0 / lr) if lr and lr0 else 1.0
        return max(1, min(self.k_max, math.ceil(self.k0 * math.sqrt(ratio) * scale - 1e-9)))

    def _memo(self, cursor: Cursor, rnd: Round, feedback: Feedback) -> tuple[float, ...]:
        if cursor.memo or feedback.objective is None:
            return cursor.memo
        return (float(feedback.objective), self.lr_at(cursor, feedback) or 0.0)


# --------------------------------------------------------------------------- config models (the registry)


class _ScheduledLR(LocalMethodConfig):
    """A method with its own learning-rate schedule (in the simulator; the drop-in uses the optimizer's)."""

    lr_schedule: Literal["inverse", "step", "cosine"] = Field(
        "inverse",
        description="eta_t: inverse = eta_1/(1+lr_decay t); step = eta_1 decay_factor^floor(t/decay_every); "
        "cosine = eta_1 (1+cos(pi t/T))/2 over T = decay_every (default: run.max_iterations)",
    )
    lr_decay: float = Field(0.0, ge=0, description="alpha of the inverse schedule")
    decay_every: int | None = Field(None, ge=1, le=MAX_STEPS, description="step: its period; cosine: its length T")
    decay_factor: float = Field(0.5, gt=0, le=1, description="step: the factor")
    k_max: int = Field(DEFAULT_K_MAX, ge=1, le=MAX_STEPS, description="cap on the period")

    @model_validator(mode="after")
    def _schedule_fields(self) -> _ScheduledLR:
        if self.lr_schedule == "step" and self.decay_every is None:
            raise ValueError("decay_every: the step schedule needs its period in iterations")
        return self

    def schedule(self, ctx: PlanContext) -> LRSchedule:
        if self.lr_schedule == "step":
            return StepDecay(self.lr, int(self.decay_every or 1), self.decay_factor)
        if self.lr_schedule == "cosine":
            total = self.decay_every or ctx.max_iterations
            if total is None:
                from stlsgd.errors import ConfigError

                raise ConfigError("algorithm.decay_every: the cosine schedule needs its length (or run.max_iterations)")
            return Cosine(self.lr, int(total))
        return InverseTime(self.lr, self.lr_decay)


@register
class PostLocalConfig(_ScheduledLR):
    """Post-local SGD (Lin et al., ICLR 2020): synchronous for `warmup` steps, then Local SGD with period k."""

    method: Literal["post_local"] = "post_local"
    k: int = Field(1, ge=1, le=MAX_STEPS, description="period after the warm-up")
    warmup: int = Field(0, ge=0, le=MAX_STEPS, description="synchronous steps first")

    def plan(self, ctx: PlanContext) -> Plan:
        return PostLocalSGD(lrs=self.schedule(ctx), batch=self.batch, k_max=self.k_max, k=self.k, warmup=self.warmup)


@register
class LRCoupledConfig(_ScheduledLR):
    """LR-coupled STL: k_t = k_1 eta_1 / eta_t on any learning-rate schedule (the paper's eta k = constant)."""

    method: Literal["lr_coupled"] = "lr_coupled"
    k: float = Field(1.0, ge=1, le=MAX_STEPS, description="k_1, the period at eta_1")

    def plan(self, ctx: PlanContext) -> Plan:
        return LRCoupled(lrs=self.schedule(ctx), batch=self.batch, k_max=self.k_max, k1=self.k, lr1=self.lr)


@register
class QSRConfig(_ScheduledLR):
    """QSR (Gu et al., ICLR 2024): k_t = max(H_base, floor((alpha / eta_t)^2))."""

    method: Literal["qsr"] = "qsr"
    h_base: int = Field(1, ge=1, le=MAX_STEPS, description="the smallest period H_base")
    alpha: float = Field(gt=0, description="the rule's alpha")

    def plan(self, ctx: PlanContext) -> Plan:
        return QSR(lrs=self.schedule(ctx), batch=self.batch, k_max=self.k_max, h_base=self.h_base, alpha=self.alpha)


@register
class AdaCommConfig(_ScheduledLR):
    """AdaComm (Wang & Joshi, MLSys 2019): k = ceil(k0 sqrt(F / F_0)), shrinking as the loss falls."""

    method: Literal["adacomm"] = "adacomm"
    k: int = Field(1, ge=1, le=MAX_STEPS, description="k0, the first period")

    def plan(self, ctx: PlanContext) -> Plan:
        return AdaComm(lrs=self.schedule(ctx), batch=self.batch, k_max=self.k_max, k0=self.k)
