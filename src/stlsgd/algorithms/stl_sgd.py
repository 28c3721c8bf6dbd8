"""STL-SGD: Local SGD with a stagewise communication period (Algorithms 2 and 3)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from stlsgd.algorithms.plan import (
    Cursor,
    Feedback,
    InverseTime,
    Plan,
    Stage,
    StagewisePlan,
    check_positive,
    floor_period,
)
from stlsgd.algorithms.registry import MAX_STEPS, LocalMethodConfig, PlanContext, first_stage_iterations, register
from stlsgd.errors import ConfigError


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
    starting point.
    """

    T1: int
    k1: float
    lr: float | None = None
    iid: bool = True
    option: int = 1
    gamma: float | None = None
    batch: int = 1
    name: str = "stl_sc"

    def __post_init__(self) -> None:
        check_positive(T1=self.T1, k1=self.k1, lr=self.lr, gamma=self.gamma, batch=self.batch)
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
        return None if self.lr is None else self.lr / shrink, length, floor_period(k)

    def stage_at(self, s: int, cursor: Cursor, feedback: Feedback) -> Stage:
        lr, length, period = self.stage(s)
        return Stage(None if lr is None else InverseTime(lr), length, period, self.gamma)


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

    @model_validator(mode="after")
    def _one_length(self) -> _Stagewise:
        if self.T1 is not None and self.T1_epochs is not None:
            raise ValueError("T1: give T1 or T1_epochs, not both")
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
        False, description="lr, k, T1, iid and drift from the data's estimated constants (stlsgd suggest); no grid"
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
            for f in ("lr", "k", "T1", "T1_epochs", "lr_T1", "drift", "iid")
            if getattr(self, f) != type(self).model_fields[f].default
        )
        if self.auto and given:
            raise ValueError(f"auto: sets {', '.join(given)} itself; remove {'it' if len(given) == 1 else 'them'}")
        return self

    def plan(self, ctx: PlanContext) -> Plan:
        T1 = first_stage_iterations(self.T1, self.T1_epochs, self.batch, ctx)
        if T1 is None:
            if ctx.lam is None:
                raise ConfigError("algorithm.T1: give T1 or T1_epochs (eta_1 T_1 = 1/lambda needs a logistic lambda)")
            T1 = first_stage_length(self.lr, ctx.lam, self.lr_T1)
        return STLSGD(lr=self.lr, T1=T1, k1=self.k, iid=self.growth_iid(ctx), batch=self.batch)


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
            name="stl_nc",
        )
