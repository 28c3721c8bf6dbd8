"""The method registry: each method's config model (its ``[algorithm]`` fields) and how it becomes a plan.

One entry per method, written next to the plan it builds (``baselines.py``, ``stl_sgd.py``, ...)::

    @register
    class LocalSGDConfig(MethodConfig):
        '''Local SGD (Algorithm 1): average every k local steps.'''
        method: Literal["local_sgd"] = "local_sgd"
        k: float = ...
        def plan(self, ctx: PlanContext) -> Plan: ...

The registry is the single list of methods: the experiment config's ``algorithm`` section is the union of
these models (chosen by ``method``), sweeps validate their rows through it, ``stlsgd methods`` prints it as
the docs' table. Adding a method touches its plan's module and its tests, nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field, model_validator

from stlsgd.algorithms.plan import Plan
from stlsgd.schema import StrictModel

# Periods and stage lengths are counted in float64 and numpy int64: beyond 2^40 steps (10^12) neither the
# arithmetic nor any budget makes sense, so larger values are refused as input errors.
MAX_STEPS = 2**40


@dataclass(frozen=True)
class PlanContext:
    """What a plan may need to know of the run besides its own fields.

    ``num_samples`` (n) and ``num_clients`` (N) turn epochs into iterations; ``lam`` is Eq. 8's lambda (None
    for networks) for the rule eta_1 T_1 = 1/lambda; ``iid`` is the k-growth the partition suggests (IID: x2
    per stage, Non-IID: x sqrt 2); ``max_iterations`` the run's budget (the default length of a cosine lr).
    """

    num_samples: int
    num_clients: int
    lam: float | None
    iid: bool
    max_iterations: int | None = None


class MethodConfig(StrictModel):
    """Fields every method has; a method's own model adds its hyper-parameters (names follow the paper)."""

    method: str
    lr: float = Field(1.0, gt=0, description="eta_1, the first (or only) learning rate")
    batch: int = Field(1, ge=1, le=MAX_STEPS, description="per-client mini-batch (LB-SGD's B)")

    #: One line for the methods table (the class docstring's first line when unset).
    summary: ClassVar[str] = ""

    def plan(self, ctx: PlanContext) -> Plan:  # pragma: no cover - every registered method overrides it
        raise NotImplementedError

    @classmethod
    def own_fields(cls) -> list[str]:
        """The method's fields besides ``method`` (for the docs table)."""
        return [name for name in cls.model_fields if name != "method"]


class LocalMethodConfig(MethodConfig):
    """A method with local steps between averages: drift correction and the outer step apply to it."""

    drift: bool = Field(
        False,
        description="SCAFFOLD control variates (option II) correct each client's steps "
        "for client drift; a round then also sends the control variate",
    )
    drift_window: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="with drift: each client's control variate from its round's first drift_window local steps "
        "(unset: the whole round, option II)",
    )
    drift_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="with drift: each client's control variate from the first drift_share of its round's local "
        "steps, a window that grows with the period (unset: the whole round, or drift_window)",
    )
    outer_lr: float | None = Field(
        None, gt=0, description="DiLoCo: the average takes an outer Nesterov step of this lr (none: plain averaging)"
    )
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="the outer step's momentum")

    @model_validator(mode="after")
    def _window_needs_drift(self) -> LocalMethodConfig:
        # STL-SGD^sc's auto sets drift and the window itself, and refuses them given (STLSCConfig says so)
        for name in ("drift_window", "drift_share"):
            if getattr(self, name) is not None and self.drift is not True and not getattr(self, "auto", False):
                raise ValueError(f"{name}: applies to drift correction only: set drift = true beside it")
        if self.drift_window is not None and self.drift_share is not None:
            raise ValueError("drift_share: give drift_window (steps) or drift_share (of each round), not both")
        return self


REGISTRY: dict[str, type[MethodConfig]] = {}


def register(cls: type[MethodConfig]) -> type[MethodConfig]:
    """Class decorator: add a method's config model under its ``method`` literal."""
    name = cls.model_fields["method"].default
    if not isinstance(name, str) or name in REGISTRY:
        raise ValueError(f"method {name!r}: a config model needs a unique default for its method literal")
    if not cls.summary:
        cls.summary = (cls.__doc__ or name).strip().splitlines()[0]
    REGISTRY[name] = cls
    return cls


def first_stage_iterations(T1: int | None, T1_epochs: float | None, batch: int, ctx: PlanContext) -> int | None:
    """T_1 given in iterations, or in epochs (n samples processed by all N clients together)."""
    if T1 is not None:
        return T1
    if T1_epochs is not None:
        return max(int(math.ceil(T1_epochs * ctx.num_samples / (ctx.num_clients * batch))), 1)
    return None


def methods_table() -> str:
    """The registry as a Markdown table: method | what | fields."""
    lines = ["| method | what | fields |", "|---|---|---|"]
    for name, cls in REGISTRY.items():
        fields = ", ".join(f"`{f}`" for f in cls.own_fields())
        lines.append(f"| `{name}` | {cls.summary.replace('|', chr(92) + '|')} | {fields} |")
    return "\n".join(lines)


def describe_fields(cls: type[MethodConfig]) -> list[tuple[str, Any, str]]:
    """(field, default, description) of a method's fields."""
    out = []
    for name in cls.own_fields():
        info = cls.model_fields[name]
        default = None if info.is_required() else info.default
        out.append((name, default, info.description or ""))
    return out
