"""The typed records a run and a sweep write, and every reader reads: ``summary.json`` and ``results.jsonl``.

One module owns their shape so that a missing or mistyped field is caught where the record is written, not
three layers up in a report. Records stay plain JSON on disk (readable by any tool, and by older stlsgd
versions); these models validate them on the way out and on the way in. Unknown fields are kept, so a record
written by a newer stlsgd still reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from stlsgd.errors import StlsgdError

__all__ = ["RunSummary", "SweepRecord", "ValidationError", "record_problem"]

RunStatus = Literal["reached", "budget", "diverged", "pruned"]  # "pruned": a sweep ended it early
RecordStatus = Literal["reached", "pruned", "budget", "diverged", "failed"]
RECORD_STATUSES: tuple[str, ...] = ("reached", "pruned", "budget", "diverged", "failed")

# A count written as 3.0 by a foreign tool is not refused (JSON has one number type); a string is.
Number = StrictInt | StrictFloat


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def to_json(self) -> dict[str, Any]:
        """The record as the JSON object written to disk (fields in declaration order, extras after): the
        values as given, so the file's bytes are what ``json.dumps`` of the plain dict wrote before."""
        return self.model_dump()


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
    #: The rounds the clients' models gave the plan ``algorithm.auto`` ran (None: not their choice).
    auto_model_rounds: int | None = None

    @classmethod
    def read(cls, path: Path) -> RunSummary:
        """The summary in ``path``, or a one-line error naming the file and what is wrong with it."""
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise StlsgdError(f"{path}: not JSON ({err}); rerun the experiment with --overwrite") from None
        except ValidationError as err:
            raise StlsgdError(
                f"{path}: not a summary stlsgd wrote ({record_problem(err)}); rerun the experiment with --overwrite"
            ) from None


class SweepRecord(_Record):
    """One line of a sweep's ``results.jsonl``: one finished (or failed, or pruned) run of one setting.

    Strict: a field of the wrong type is refused, not coerced ("3" is not 3), so a line another tool or a
    hand edit put into the file is told apart from a sweep result (the reader skips it and the run is redone).
    """

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    key: StrictStr
    label: StrictStr
    method: StrictStr | None = None
    phase: Literal["grid", "seed"]
    order: StrictInt
    seed: StrictInt
    settings: dict[str, Any]
    status: RecordStatus
    rounds_to_target: StrictInt | None = None
    iterations_to_target: StrictInt | None = None
    rounds: StrictInt | None = None
    iterations: StrictInt | None = None
    client_steps: StrictInt | None = None
    bytes_per_client: Number | None = None
    eval_every: StrictInt | None = None
    eval_every_iterations: StrictInt | None = None
    final_gap: Number | None = None
    final_objective: Number | None = None
    final_accuracy: Number | None = None
    num_samples: StrictInt | None = None
    wall_s: Number | None = None
    run_dir: StrictStr
    error: StrictStr | None = None


def record_problem(err: ValidationError) -> str:
    """The first thing wrong with a record, in one line (``field: message``)."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "the record"
    return f"{where}: {first['msg'].lower()}"
