"""The paper's baselines (Section 5): SyncSGD, LB-SGD, CR-PSGD and Local SGD (Algorithm 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from stlsgd.algorithms.plan import NO_FEEDBACK, Cursor, Feedback, InverseTime, Plan, Round, check_positive
from stlsgd.algorithms.registry import MAX_STEPS, LocalMethodConfig, MethodConfig, PlanContext, register


@dataclass
class LocalSGD(Plan):
    """Algorithm 1: average every ``k`` local steps; eta_t = lr/(1+alpha t) (alpha = 0: fixed, non-convex).

    ``lr`` None: the plan leaves the learning rate to the optimizer (the drop-in's default).
    """

    lr: float | None = None
    k: int = 1
    batch: int = 1
    lr_decay: float = 0.0
    name: str = "local_sgd"

    def __post_init__(self) -> None:
        check_positive(lr=self.lr, k=self.k, batch=self.batch)

    def next_round(self, cursor: Cursor, feedback: Feedback = NO_FEEDBACK) -> Round:
        lrs = None if self.lr is None else InverseTime(self.lr, self.lr_decay)
        return Round(
            index=cursor.index,
            stage=1,
            start_iteration=cursor.iteration,
            steps=self.k,
            batch=self.batch,
            lrs=lrs,
            period=self.k,
        )


@dataclass
class SyncSGD(LocalSGD):
    """Synchronous mini-batch SGD: Local SGD with k = 1, i.e. an average after every step."""

    k: int = 1
    name: str = "sync_sgd"


@dataclass
class LBSGD(LocalSGD):
    """Large-batch SGD: every client uses mini-batch ``batch`` (the paper's B) and averages every step."""

    k: int = 1
    name: str = "lb_sgd"


@dataclass
class CRPSGD(Plan):
    """CR-PSGD (Yu & Jin, 2019): communicate every step while the per-client batch grows by ``rho``.

    ``grow="step"`` (the paper's convex runs): batch_t = min(floor(batch * rho**t), max_batch).
    ``grow="epoch"`` (the paper's non-convex runs): the batch is multiplied by rho once an epoch -- one pass of
    ``samples_per_epoch`` samples by all ``num_clients`` clients -- is finished, until it exceeds max_batch
    (the cursor's memo holds the unrounded size).
    """

    lr: float
    rho: float
    batch: int = 1
    max_batch: int = 512
    lr_decay: float = 0.0
    grow: str = "step"
    samples_per_epoch: int = 0
    num_clients: int = 1
    name: str = "cr_psgd"

    def __post_init__(self) -> None:
        check_positive(lr=self.lr, rho=self.rho, batch=self.batch, max_batch=self.max_batch)

    def next_round(self, cursor: Cursor, feedback: Feedback = NO_FEEDBACK) -> Round:
        index = cursor.index
        if self.grow == "step":
            # Compare exponents first: rho**index overflows a float long after the cap is reached.
            capped = index * math.log(self.rho) >= math.log(self.max_batch / self.batch)
            b = self.max_batch if capped else min(int(math.floor(self.batch * self.rho**index + 1e-9)), self.max_batch)
        else:
            b = min(int(math.floor(self._size(cursor) + 1e-9)), self.max_batch)
        return Round(
            index=index,
            stage=1,
            start_iteration=cursor.iteration,
            steps=1,
            batch=max(b, 1),
            lrs=InverseTime(self.lr, self.lr_decay),
            period=1,
        )

    def _size(self, cursor: Cursor) -> float:
        return cursor.memo[0] if cursor.memo else float(self.batch)

    def _memo(self, cursor: Cursor, rnd: Round, feedback: Feedback) -> tuple[float, ...]:
        if self.grow != "epoch":
            return cursor.memo
        size = self._size(cursor)
        before = cursor.samples * self.num_clients // self.samples_per_epoch
        after = (cursor.samples + rnd.batch) * self.num_clients // self.samples_per_epoch
        return (size * self.rho if after > before and size <= self.max_batch else size,)


# --------------------------------------------------------------------------- config models (the registry)


class _DecayingLR(MethodConfig):
    lr_decay: float = Field(0.0, ge=0, description="alpha in eta_t = eta_1/(1+alpha t); 0 = fixed, as for nets")


@register
class SyncSGDConfig(_DecayingLR):
    """SyncSGD: average after every step."""

    method: Literal["sync_sgd"] = "sync_sgd"

    def plan(self, ctx: PlanContext) -> Plan:
        return SyncSGD(lr=self.lr, lr_decay=self.lr_decay, batch=self.batch)


@register
class LBSGDConfig(_DecayingLR):
    """LB-SGD: per-client batch B, average after every step."""

    method: Literal["lb_sgd"] = "lb_sgd"

    def plan(self, ctx: PlanContext) -> Plan:
        return LBSGD(lr=self.lr, lr_decay=self.lr_decay, batch=self.batch)


@register
class CRPSGDConfig(_DecayingLR):
    """CR-PSGD (Yu & Jin 2019): the batch grows by rho each step (convex) or epoch (nets) up to max_batch."""

    method: Literal["cr_psgd"] = "cr_psgd"
    rho: float = Field(1.01, gt=1, description="batch growth factor")
    max_batch: int = Field(512, ge=1, le=MAX_STEPS, description="batch cap")
    grow: Literal["step", "epoch"] = Field("step", description="grow the batch every step or every epoch")

    def plan(self, ctx: PlanContext) -> Plan:
        return CRPSGD(
            lr=self.lr,
            rho=self.rho,
            batch=self.batch,
            max_batch=self.max_batch,
            lr_decay=self.lr_decay,
            grow=self.grow,
            samples_per_epoch=ctx.num_samples,
            num_clients=ctx.num_clients,
        )


@register
class LocalSGDConfig(_DecayingLR, LocalMethodConfig):
    """Local SGD (Algorithm 1): average every k local steps."""

    method: Literal["local_sgd"] = "local_sgd"
    # A float in the file format (as k_1 of STL-SGD), checked to be a whole number.
    k: float = Field(1.0, ge=1, le=MAX_STEPS, description="communication period k")

    @field_validator("k")
    @classmethod
    def _whole(cls, k: float) -> float:
        if k != int(k):
            raise ValueError("Local SGD needs an integer period")
        return k

    def plan(self, ctx: PlanContext) -> Plan:
        return LocalSGD(lr=self.lr, k=int(self.k), batch=self.batch, lr_decay=self.lr_decay)
