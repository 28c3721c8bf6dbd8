"""Process helpers of the kill tests (Linux): a child subreaper, so that the orphans of a killed process become
this one's children, and a wait on a pidfd, so that no test polls for a process's end."""

from __future__ import annotations

import ctypes
import os
import select
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def subreaper(on: bool) -> None:
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0


def reap(pid: int, timeout: float) -> int:
    """Wait (no polling: a pidfd) until child ``pid`` ends; its wait status."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"process {pid} still runs {timeout} s after its parent died"
    finally:
        os.close(fd)
    return os.waitpid(pid, 0)[1]
