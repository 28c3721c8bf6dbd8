"""A deterministic fault for tests of kills and resumes: ``STLSGD_FAULT`` makes a run die after a chosen round,
or a sweep's submitting process after it has recorded a chosen number of results.

    STLSGD_FAULT="die-after-round=R[,rank=N][,once=PATH][,target=parent]"
    STLSGD_FAULT="die-after-record=N[,once=PATH]"
    STLSGD_FAULT="die-at=worker-start[,once=PATH][,target=parent]"

- ``die-after-round=R``: at the first round boundary at or past round R (rounds of synchronous methods come in
  groups), once that round's checkpoint, if one falls there, is written, the process SIGKILLs itself -- as a kill
  from outside would, but at a known instant, so a test can neither miss the run nor kill it after it has
  finished (a resume past R with the variable still set would die at once: unset it, or use ``once``);
- ``rank=N``: only the process whose ``RANK`` (torchrun) is N; the others go on and find their peer gone;
- ``once=PATH``: only the first process to get there dies; it creates PATH (exclusively) first, so a retry or a
  resume started with the same environment runs through (a sweep's worker pool passes its environment on);
- ``target=parent``: SIGKILL the parent process instead (a sweep, from inside one of its workers); nothing is
  done if the parent has already gone (the process was re-parented);
- ``die-after-record=N``: the sweep's own process SIGKILLs itself once it has appended its N-th record to
  ``results.jsonl`` (and fsynced it): a killed submitting process, where the runs go on elsewhere (a Dask
  cluster's workers, which do not share its environment). Runs ignore it;
- ``die-at=worker-start``: a sweep's worker process, as it starts (its imports done, before it asks the kernel
  for the parent-death signal); with ``target=parent`` the sweep dies while its workers are still starting.

Read once per run (:func:`from_env`); unset, the run pays one dictionary lookup.
"""

from __future__ import annotations

import os
import select
import signal
from dataclasses import dataclass
from pathlib import Path

from stlsgd.errors import ConfigError

ENV = "STLSGD_FAULT"
KEYS = ("die-after-round", "die-after-record", "die-at", "rank", "once", "target")


@dataclass(frozen=True)
class Fault:
    after_round: int | None = None
    rank: int | None = None
    once: Path | None = None
    parent: int | None = None  # the pid to kill instead of this process (target=parent)
    after_records: int | None = None
    at_worker_start: bool = False

    def after(self, round_: int) -> None:
        """Called after every round: dies (or kills the parent) once ``round_`` reaches the chosen one."""
        if self.after_round is not None and round_ >= self.after_round:
            self._die()

    def recorded(self, records: int) -> None:
        """Called by a sweep after each record it appends: dies once ``records`` reaches the chosen count."""
        if self.after_records is not None and records >= self.after_records:
            self._die()

    def worker_started(self) -> None:
        """Called by a sweep's worker process as it starts: dies (or kills the parent) if so chosen."""
        if self.at_worker_start:
            self._die()

    def _die(self) -> None:
        if self.rank is not None and int(os.environ.get("RANK", "0")) != self.rank:
            return
        if self.once is not None:
            try:
                os.close(os.open(self.once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        if self.parent is None:
            os.kill(os.getpid(), signal.SIGKILL)
        elif os.getppid() == self.parent:  # still our parent: not re-parented after its death
            os.kill(self.parent, signal.SIGKILL)
            wait_for_exit(self.parent)


def wait_for_exit(pid: int, timeout: float = 60.0) -> None:
    """Block until process ``pid`` has ended (a pidfd, no polling): a kill is delivered asynchronously, and what
    this process does next (ask for the parent-death signal, compute on) must come after its parent's death."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):  # already gone (or no pidfds here: Linux < 5.3)
        return
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


def parse(text: str) -> Fault:
    """``Fault`` from the variable's text; a malformed value is a one-line error naming the variable."""
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in KEYS or key in fields:
            raise ConfigError(
                f"${ENV}: {part!r}: expected die-after-round=R[,rank=N][,once=PATH][,target=parent] "
                "or die-after-record=N[,once=PATH] or die-at=worker-start[,once=PATH][,target=parent]"
            )
        fields[key] = value
    if sum(k in fields for k in ("die-after-round", "die-after-record", "die-at")) != 1:
        raise ConfigError(
            f"${ENV}: {text!r}: give one of die-after-round=R, die-after-record=N and die-at=worker-start"
        )
    if fields.get("die-at", "worker-start") != "worker-start":
        raise ConfigError(f"${ENV}: die-at={fields['die-at']}: only worker-start")
    try:
        after = int(fields["die-after-round"]) if "die-after-round" in fields else None
        records = int(fields["die-after-record"]) if "die-after-record" in fields else None
        rank = int(fields["rank"]) if "rank" in fields else None
    except ValueError:
        raise ConfigError(
            f"${ENV}: {text!r}: die-after-round=R, die-after-record=N and rank=N take whole numbers"
        ) from None
    if fields.get("target", "self") not in ("self", "parent"):
        raise ConfigError(f"${ENV}: target={fields['target']}: self or parent")
    return Fault(
        after_round=after,
        after_records=records,
        at_worker_start="die-at" in fields,
        rank=rank,
        once=Path(fields["once"]) if "once" in fields else None,
        parent=os.getppid() if fields.get("target") == "parent" else None,
    )


def from_env() -> Fault | None:
    text = os.environ.get(ENV)
    return parse(text) if text else None
