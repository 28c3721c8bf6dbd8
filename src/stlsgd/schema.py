"""The base of every validated input model (experiment configs, method configs, sweep files).

Pydantic's lax mode is kept for what files hold (``1e6`` for an integer count, ``"3"`` from a command line), but
the inputs that a typo produces and lax mode would silently accept are refused: a boolean where a number is
expected (``max_rounds = true`` would run one round), a non-finite number (``lr = inf``), an unknown field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for name, value in raw.items():
                info = cls.model_fields.get(name) if isinstance(name, str) else None
                if isinstance(value, bool) and info is not None and bool not in _leaves(info.annotation):
                    raise ValueError(f"{name}: expected {_kind(info.annotation)}, got {str(value).lower()}")
        return raw


def _leaves(annotation: Any) -> set[Any]:
    args = getattr(annotation, "__args__", None)
    if not args:
        return {annotation}
    found: set[Any] = set()
    for arg in args:
        found |= _leaves(arg)
    return found | {getattr(annotation, "__origin__", None)}


def _kind(annotation: Any) -> str:
    if getattr(annotation, "__origin__", None) is Literal:
        return "one of " + ", ".join(map(repr, annotation.__args__))
    leaves = _leaves(annotation)
    if int in leaves:
        return "a whole number"
    if float in leaves:
        return "a number"
    return "a value of another type"
