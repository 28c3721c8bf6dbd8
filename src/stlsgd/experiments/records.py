"""The typed records a run and a sweep write, and every reader reads: ``summary.json`` and ``results.jsonl``.

One module owns their shape so that a missing or mistyped field is caught where the record is written, not
three layers up in a report. Records stay plain JSON on disk (readable by any tool, and by older stlsgd
versions); these models validate them on the way out and on the way in. Unknown fields are kept, so a record
written by a newer stlsgd still reads.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["RunSummary", "SweepRecord", "ValidationError", "record_problem"]

RunStatus = Literal["reached", "budget", "diverged"]
RecordStatus = Literal["reached", "pruned", "budget", "diverged", "failed"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def to_json(self) -> dict[str, Any]:
        """The record as the JSON object written to disk (fields in declaration order, extras after)."""
        return self.model_dump(mode="json")


class RunSummary(_Record):
    """``summary.json``: a run's outcome, what it computed and communicated, its last metrics and its plan."""

    name: str
    method: str
    status: RunStatus
    rounds_to_target: int | None
    iterations_to_target: int | None
    rounds: int = Field(ge=0)
    iterations: int = Field(ge=0)
    stages: int = Field(ge=0)
    client_steps: int = Field(ge=0)
    bytes: int = Field(ge=0)
    bytes_per_client: int = Field(ge=0)
    wall_s: float
    compute_s: float
    comm_s: float
    fstar: float | None
    final: dict[str, Any] | None
    plan: dict[str, Any]
    rule: dict[str, Any]
    backend: dict[str, Any]


class SweepRecord(_Record):
    """One line of a sweep's ``results.jsonl``: one finished (or failed, or pruned) run of one setting."""

    key: str
    label: str
    method: str
    phase: Literal["grid", "seed"]
    order: int
    seed: int
    settings: dict[str, Any]
    status: RecordStatus
    rounds_to_target: int | None = None
    iterations_to_target: int | None = None
    rounds: int | None = None
    iterations: int | None = None
    client_steps: int | None = None
    bytes_per_client: int | None = None
    eval_every: int | None = None
    eval_every_iterations: int | None = None
    final_gap: float | None = None
    final_objective: float | None = None
    final_accuracy: float | None = None
    num_samples: int | None = None
    wall_s: float | None = None
    run_dir: str | None = None
    error: str | None = None


def record_problem(err: ValidationError) -> str:
    """The first thing wrong with a record, in one line (``field: message``)."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "record"
    return f"{where}: {first['msg']}"
